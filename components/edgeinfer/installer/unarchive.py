"""Unpack the shipped wheelhouse where the nucleus did not.

The classic nucleus unpacks an `Unarchive: ZIP` artifact into `{artifacts:decompressedPath}/<stem>/`;
nucleus lite does so only for the artifacts it downloads for a cloud deployment, so on a local
deployment that folder stays empty and the zip sits unread in `{artifacts:path}`. The installer then
unpacks it itself, into its work folder:

    wheelhouses/<key>/   the archive's files; <key> is a digest of the archive's listing (names,
                         sizes, CRC-32s), so an unchanged archive is unpacked once, a changed one anew

Whole or not at all: the files go into a temporary folder beside it, written through, and only a
rename gives it its name, so a folder under a key always holds the whole archive; what an interrupted
run left behind is removed by the next one. Standard library only.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

from edgeinfer.errors import EdgeinferError

__all__ = ["WHEELHOUSE_ZIP", "ArchiveError", "archive_key", "unpack_once"]

WHEELHOUSE_ZIP = "wheelhouse.zip"  # the artifact `edgeinfer build --wheelhouse` ships
_PARTIAL = ".partial-"


class ArchiveError(EdgeinferError):
    """The archive cannot be read or names a file outside the folder it unpacks into."""


def archive_key(archive: Path) -> str:
    """A digest of the archive's listing: read from its central directory, not its content."""
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                digest.update(f"{info.filename}\0{info.file_size}\0{info.CRC}\n".encode())
    except (zipfile.BadZipFile, OSError) as exc:
        raise ArchiveError(f"cannot read {archive}: {exc}") from None
    return digest.hexdigest()[:16]


def unpack_once(archive: Path, parent: Path) -> Path:
    """`parent/<key>/` holding the whole of `archive`, unpacked now unless it already is; the other
    folders under `parent` (older archives, interrupted runs) are removed once it is there."""
    dest = parent / archive_key(archive)
    if not dest.is_dir():
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=_PARTIAL, dir=parent))
        try:
            _extract(archive, tmp)
            _rename_into_place(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    for other in parent.iterdir():
        if other != dest:
            if other.is_dir() and not other.is_symlink():
                shutil.rmtree(other, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    other.unlink()
    return dest


def _rename_into_place(tmp: Path, dest: Path) -> None:
    try:
        os.rename(tmp, dest)
    except OSError:
        if not dest.is_dir():
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # another run put the same archive there first


def _extract(archive: Path, into: Path) -> None:
    """Every member under `into`, each file's content on disk before this returns."""
    try:
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                target = into.joinpath(*_safe_parts(archive, info.filename))
                if info.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, target.open("wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                    dst.flush()
                    os.fsync(dst.fileno())
    except (zipfile.BadZipFile, OSError) as exc:
        raise ArchiveError(f"cannot unpack {archive}: {exc}") from None


def _safe_parts(archive: Path, name: str) -> tuple[str, ...]:
    path = PurePosixPath(name.replace("\\", "/"))
    parts = tuple(p for p in path.parts if p not in ("", "."))
    if path.is_absolute() or ".." in parts or not parts:
        raise ArchiveError(f"{archive}: a member outside the folder it unpacks into: {name!r}")
    return parts
