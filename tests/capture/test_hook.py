"""The capture hook's stop."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from edgeinfer.capture import hook as hook_module
from edgeinfer.capture.config import CaptureConfig
from edgeinfer.capture.hook import CaptureHook
from edgeinfer.capture.spool import Spool


class _StuckWriter(CaptureHook):
    """A writer that sticks on its first record until `go` is set."""

    entered = threading.Event()
    go = threading.Event()

    def write(self, item: object) -> None:
        self.entered.set()
        assert self.go.wait(30)


def test_stop_does_not_wait_forever_on_a_writer_stuck_behind_a_full_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hook_module, "STOP_WAIT_S", 0.05)
    spool = Spool(tmp_path, max_bytes=1 << 20, max_age_s=3600)
    hook = _StuckWriter(CaptureConfig(queue_size=1), "thing", spool)
    hook.start()
    try:
        hook._queue.put_nowait(object())  # type: ignore[arg-type]  # taken by the writer, which sticks
        assert hook.entered.wait(10)
        hook._queue.put_nowait(object())  # type: ignore[arg-type]  # the queue is full now
        stopping = threading.Thread(target=hook.stop, daemon=True)
        stopping.start()
        stopping.join(10)
        assert not stopping.is_alive()
    finally:
        hook.go.set()
