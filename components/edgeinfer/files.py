"""File helpers every component shares: content digests and all-or-nothing writes."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from edgeinfer.errors import EdgeinferError

__all__ = ["atomic_write", "check_replaceable", "new_parents", "sha256_file", "write_output"]


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file's content, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def atomic_write(path: Path, data: bytes, *, mode: int | None = 0o644, fsync: bool = False) -> None:
    """Write `data` to `path` through a temporary file in the same folder and a rename.

    Readers see the old content or the new, never a partial file; the parent folder is created.
    `mode` is applied before the rename (None keeps mkstemp's 0600); `fsync` makes the content
    durable before it becomes visible.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_output(path: Path, data: bytes) -> None:
    """`atomic_write` of a file the user named on the command line: an OSError (no such folder, no
    permission, a file where a folder should be) becomes a one-line `EdgeinferError`."""
    try:
        atomic_write(path, data)
    except OSError as exc:
        raise EdgeinferError(f"cannot write {path}: {exc.strerror or exc}") from None


def check_replaceable(path: Path, what: str, ours: Callable[[Path], bool]) -> None:
    """Refuse to let a build replace `path` unless it is absent, an empty folder, or a `what` that
    `ours` recognises: an `--out` pointed at the wrong folder must never delete someone's files."""
    if not path.exists():
        return
    if not path.is_dir():
        raise EdgeinferError(f"{path} exists and is not a folder")
    try:
        empty = not any(path.iterdir())
    except OSError as exc:
        raise EdgeinferError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not empty and not ours(path):
        raise EdgeinferError(
            f"refusing to replace {path}: it holds files and is not {what}; choose a new or empty folder"
        )


@contextlib.contextmanager
def new_parents(path: Path) -> Iterator[None]:
    """Create the missing folders above `path`; if the block fails, remove those of them that are
    still empty, so a failed build leaves no trace. A file where a folder should be is a one-line
    `EdgeinferError`."""
    created: list[Path] = []
    parent = path.parent
    while not parent.exists():
        created.append(parent)
        parent = parent.parent
    if not parent.is_dir():
        raise EdgeinferError(f"cannot write {path}: {parent} is not a folder")
    try:
        for folder in reversed(created):
            folder.mkdir(exist_ok=True)
    except OSError as exc:
        raise EdgeinferError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        yield
    except BaseException:
        for folder in created:  # deepest first; rmdir leaves any that something filled
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
