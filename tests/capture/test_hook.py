"""The capture hook's stop."""

from __future__ import annotations

import queue
import threading
from pathlib import Path

import pytest

from edgeinfer.capture import hook as hook_module
from edgeinfer.capture.config import CaptureConfig
from edgeinfer.capture.hook import CaptureHook
from edgeinfer.capture.spool import Spool
from edgeinfer.messages import ModelRef, Prediction, Request, Result
from edgeinfer.runtime.answer import Job
from edgeinfer.runtime.inbound import ReplyTarget


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


def test_answers_from_several_threads_keep_to_a_samplers_limit_and_count_exactly(tmp_path: Path) -> None:
    cfg = CaptureConfig.from_recipe(
        {
            "enabled": True,
            "bucket": "b",
            "models": {"*": {"samplers": [{"kind": "random", "share": 1.0, "limits": {"perMinute": 50}}]}},
        }
    )
    spool = Spool(tmp_path, max_bytes=1 << 20, max_age_s=3600)
    hook = CaptureHook(cfg, "thing", spool)  # not started: what is chosen waits on the queue
    hook._queue = queue.Queue()  # room for all of them: this test counts choices, not the writer
    model = ModelRef("m", "1", "int8")
    ok = Result("r", "ok", "", [Prediction(0, "a", 0.9)], model=model)
    job = Job(Request(id="r", image=b"\xff\xd8\xff"), ReplyTarget("t"), arrived=0.0)
    threads = [
        threading.Thread(target=lambda: [hook.on_answer(job, ok, ok) for _ in range(200)]) for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert hook.counts["chosen"] == 50
    assert hook._queue.qsize() == 50
