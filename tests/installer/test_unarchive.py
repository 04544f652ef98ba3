"""The installer's own unpacking of the shipped wheelhouse: whole or nothing, once per archive."""

from __future__ import annotations

import os
import shutil
import zipfile
from pathlib import Path
from typing import Any

import pytest

from edgeinfer.installer import unarchive
from edgeinfer.installer.unarchive import ArchiveError, archive_key, unpack_once


def make_zip(path: Path, members: dict[str, bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


WHEELS = {"a-1.0-py3-none-any.whl": b"first", "b-2.0-py3-none-any.whl": b"second" * 1000}


def test_unpacks_the_whole_archive_under_its_key(tmp_path: Path) -> None:
    archive = make_zip(tmp_path / "wheelhouse.zip", {**WHEELS, "sub/c.txt": b"c"})
    dest = unpack_once(archive, tmp_path / "work" / "wheelhouses")
    assert dest == tmp_path / "work" / "wheelhouses" / archive_key(archive)
    assert tree(dest) == {**WHEELS, "sub/c.txt": b"c"}
    assert os.listdir(dest.parent) == [dest.name]  # no temporary folder left


def test_an_unchanged_archive_is_unpacked_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = make_zip(tmp_path / "wheelhouse.zip", WHEELS)
    first = unpack_once(archive, tmp_path / "wheelhouses")
    marker = first / "a-1.0-py3-none-any.whl"
    stamp = marker.stat().st_mtime_ns

    def must_not_extract(*_: Any) -> None:
        raise AssertionError("unpacked again")

    monkeypatch.setattr(unarchive, "_extract", must_not_extract)
    assert unpack_once(archive, tmp_path / "wheelhouses") == first
    assert marker.stat().st_mtime_ns == stamp


def test_a_changed_archive_is_unpacked_anew_and_the_old_one_removed(tmp_path: Path) -> None:
    parent = tmp_path / "wheelhouses"
    old = unpack_once(make_zip(tmp_path / "v1" / "wheelhouse.zip", WHEELS), parent)
    new = unpack_once(make_zip(tmp_path / "v2" / "wheelhouse.zip", {"a-1.1-py3-none-any.whl": b"x"}), parent)
    assert new != old
    assert not old.exists()
    assert tree(new) == {"a-1.1-py3-none-any.whl": b"x"}


def test_a_failed_unpack_leaves_nothing_and_the_next_run_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = make_zip(tmp_path / "wheelhouse.zip", WHEELS)
    parent = tmp_path / "wheelhouses"
    copies = 0
    real_copy = shutil.copyfileobj

    def disk_full_on_the_second_file(src: Any, dst: Any, length: int = 0) -> None:
        nonlocal copies
        copies += 1
        if copies == 2:
            raise OSError(28, "No space left on device")
        real_copy(src, dst, length)

    monkeypatch.setattr(shutil, "copyfileobj", disk_full_on_the_second_file)
    with pytest.raises(ArchiveError, match=r"cannot unpack .*wheelhouse\.zip: .*No space left on device"):
        unpack_once(archive, parent)
    assert os.listdir(parent) == []  # neither a folder under the key nor a partial one
    monkeypatch.setattr(shutil, "copyfileobj", real_copy)
    assert tree(unpack_once(archive, parent)) == WHEELS


def test_what_an_interrupted_run_left_is_removed(tmp_path: Path) -> None:
    parent = tmp_path / "wheelhouses"
    (parent / ".partial-killed").mkdir(parents=True)
    (parent / ".partial-killed" / "a-1.0-py3-none-any.whl").write_bytes(b"fir")
    dest = unpack_once(make_zip(tmp_path / "wheelhouse.zip", WHEELS), parent)
    assert os.listdir(parent) == [dest.name]


def test_another_run_that_got_there_first_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = make_zip(tmp_path / "wheelhouse.zip", WHEELS)
    parent = tmp_path / "wheelhouses"
    real_extract = unarchive._extract

    def racing(archive_: Path, into: Path) -> None:
        real_extract(archive_, into)
        real_extract(archive_, parent / archive_key(archive_))  # the other run, renamed first

    monkeypatch.setattr(unarchive, "_extract", racing)
    dest = unpack_once(archive, parent)
    assert tree(dest) == WHEELS
    assert os.listdir(parent) == [dest.name]


@pytest.mark.parametrize("name", ["../evil.whl", "/abs/evil.whl", "a/../../evil.whl"])
def test_a_member_outside_the_folder_is_refused(tmp_path: Path, name: str) -> None:
    archive = make_zip(tmp_path / "wheelhouse.zip", {"ok.whl": b"ok", name: b"evil"})
    with pytest.raises(ArchiveError, match="a member outside the folder it unpacks into"):
        unpack_once(archive, tmp_path / "w" / "wheelhouses")
    assert os.listdir(tmp_path / "w" / "wheelhouses") == []
    assert not list(tmp_path.rglob("evil.whl"))


def test_a_corrupt_archive_is_one_line(tmp_path: Path) -> None:
    archive = tmp_path / "wheelhouse.zip"
    archive.write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(ArchiveError, match=r"cannot read .*wheelhouse\.zip: ") as err:
        unpack_once(archive, tmp_path / "wheelhouses")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "wheelhouses").exists()
