"""The shared file helpers: output folders that may be replaced, and parents a failure takes back."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeinfer.errors import EdgeinferError
from edgeinfer.files import check_replaceable, new_parents


def _has_marker(path: Path) -> bool:
    return (path / "marker").is_file()


def test_absent_empty_or_recognised_folders_may_be_replaced(tmp_path: Path) -> None:
    check_replaceable(tmp_path / "new", "a store", _has_marker)
    (tmp_path / "empty").mkdir()
    check_replaceable(tmp_path / "empty", "a store", _has_marker)
    (tmp_path / "ours").mkdir()
    (tmp_path / "ours" / "marker").write_text("")
    check_replaceable(tmp_path / "ours", "a store", _has_marker)


def test_anything_else_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "thesis.tex").write_text("")
    with pytest.raises(
        EdgeinferError, match=r"refusing to replace .*theirs: it holds files and is not a store"
    ):
        check_replaceable(tmp_path / "theirs", "a store", _has_marker)
    (tmp_path / "file").write_text("")
    with pytest.raises(EdgeinferError, match=r"file exists and is not a folder"):
        check_replaceable(tmp_path / "file", "a store", _has_marker)


def test_new_parents_are_taken_back_when_the_block_fails(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b" / "out"

    def failing_build() -> None:
        with new_parents(out):
            assert out.parent.is_dir()
            raise RuntimeError("the build failed")

    with pytest.raises(RuntimeError):
        failing_build()
    assert list(tmp_path.iterdir()) == []


def test_new_parents_stay_when_the_block_succeeds_or_filled_them(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b" / "out"

    def failing_build() -> None:
        with new_parents(out):
            (tmp_path / "a" / "keep.txt").write_text("")  # something else wrote there meanwhile
            raise RuntimeError("the build failed")

    with pytest.raises(RuntimeError):
        failing_build()
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["keep.txt"]
    with new_parents(out):
        out.mkdir()
    assert out.is_dir()


def test_a_file_where_a_folder_should_be_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    with (
        pytest.raises(EdgeinferError, match=r"cannot write .*a-file/x/out: .*a-file is not a folder"),
        new_parents(tmp_path / "a-file" / "x" / "out"),
    ):
        pass
