"""edgeinfer.progress: rich bars on stderr when asked, nothing at all when quiet."""

from __future__ import annotations

import io
import re
import threading

import pytest

from edgeinfer.progress import Progress


def test_bytes_bars_show_sizes_and_complete_from_other_threads() -> None:
    shown = io.StringIO()
    with Progress(unit="bytes", file=shown) as progress, progress.step("model.onnx", 3_000_000) as tick:
        workers = [threading.Thread(target=tick, args=(1_000_000,)) for _ in range(3)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    line = shown.getvalue().strip()
    assert line.startswith("model.onnx ")
    assert re.search(r" 3\.0/3\.0 MB ", line), line


def test_item_bars_count_steps() -> None:
    shown = io.StringIO()
    with Progress(file=shown) as progress, progress.step("calibration", 4) as tick:
        tick(4)
    assert re.search(r"calibration .* 4/4 ", shown.getvalue()), shown.getvalue()


def test_quiet_shows_nothing_and_ticks_are_harmless() -> None:
    shown = io.StringIO()
    with Progress(quiet=True, file=shown) as progress, progress.step("x", 10) as tick:
        tick(5)
    assert shown.getvalue() == ""


@pytest.mark.parametrize("tty", [True, False])
def test_on_terminal_is_quiet_unless_stderr_is_a_terminal(monkeypatch: pytest.MonkeyPatch, tty: bool) -> None:
    monkeypatch.setattr("sys.stderr.isatty", lambda: tty)
    assert (Progress.on_terminal(unit="bytes")._bar is not None) is tty
