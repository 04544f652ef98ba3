"""A live source that is lost is opened again with backoff, counted, and never ends; a file ends."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest

from edgeinfer.runtime.config import SourceConfig
from edgeinfer.runtime.sources import Backoff, FrameReader, SourceRunner
from tests.helpers.wait import eventually


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


class Sink:
    """Answers every frame at once, as an idle engine would."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def submit_frame(self, frame_id: str, image: np.ndarray, **kw: object) -> bool:
        self.ids.append(frame_id)
        on_done = kw.get("on_done")
        if callable(on_done):
            on_done()
        return True


class Frames(FrameReader):
    """`n` frames, each a second apart on `clock`, then the stream drops."""

    def __init__(self, n: int, clock: Clock) -> None:
        self.n = n
        self.clock = clock

    def read(self) -> np.ndarray | None:
        if self.n == 0:
            return None
        self.n -= 1
        self.clock.t += 1.0
        return np.zeros((8, 8, 3), dtype=np.uint8)


class Scripted(SourceRunner):
    """Its opens follow a script: a reader, or an error after some seconds; stopped at the script's end."""

    def __init__(self, script: list[Callable[[], FrameReader]], **kw: object) -> None:
        self.script = script
        super().__init__(**kw)  # type: ignore[arg-type]

    def open(self) -> FrameReader:
        if not self.script:
            self._stop.set()
            raise OSError("the script ended")
        return self.script.pop(0)()


def refused(clock: Clock, after_s: float) -> Callable[[], FrameReader]:
    def fail() -> FrameReader:
        clock.t += after_s
        raise OSError("connection refused")

    return fail


def test_a_lost_stream_is_reopened_with_backoff_and_its_outage_counted() -> None:
    clock, sink, counted = Clock(), Sink(), Counter[str]()
    runner = Scripted(
        [
            lambda: Frames(3, clock),
            refused(clock, 1.0),
            refused(clock, 2.0),
            lambda: Frames(2, clock),
        ],
        cfg=SourceConfig(kind="stream", uri="rtsp://cam/1", rate_hz=1000, name="gate"),
        sink=sink,
        thing="t",
        size=8,
        clock=clock,
        backoff=Backoff(0.004, initial_s=0.001, uniform=lambda lo, hi: 1.0),
        counts=lambda name, counts: counted.update({f"{name}.{k}": v for k, v in counts.items()}),
    )
    runner._run(None)
    assert runner.finished.is_set()
    # telemetry's share: the outage reached it as the attempts failed (1 s, 2 s) and at the return
    assert counted == {"gate.served": 5, "gate.reconnects": 1, "gate.outage_ms": 4000}
    stats = runner.stats
    assert sink.ids == [f"gate-{i}" for i in range(1, 6)]
    # lost at t=3; two refused opens (1 s, 2 s); back with its first frame at t=7 (the open
    # itself takes no time here, the frame 1 s)
    assert stats.reconnects == 1
    assert stats.outage_s == 4.0
    assert stats.attempts == 3  # two refused and the script's end
    assert list(stats.attempt_times)[:2] == [4.0, 6.0]
    assert stats.answered == 5
    assert stats.lost_at is not None  # lost again at the end, and not back
    assert runner.backoff.failures == 1  # reset by the frames, then the last attempt


def test_a_stream_not_there_at_start_is_tried_until_it_opens_and_that_is_no_outage() -> None:
    clock, sink = Clock(), Sink()
    runner = Scripted(
        [refused(clock, 1.0), lambda: Frames(1, clock)],
        cfg=SourceConfig(kind="camera", uri="0", rate_hz=1000),
        sink=sink,
        thing="t",
        size=8,
        clock=clock,
        backoff=Backoff(0.004, initial_s=0.001),
    )
    runner._run(None)
    assert sink.ids == ["camera-1"]
    assert runner.stats.reconnects == 0
    assert runner.stats.attempts == 2


def test_a_video_file_ends_at_its_end() -> None:
    clock = Clock()
    runner = Scripted(
        [],
        cfg=SourceConfig(kind="video", uri="/data/a.mp4", rate_hz=1000),
        sink=Sink(),
        thing="t",
        size=8,
        clock=clock,
    )
    runner._run(Frames(2, clock))
    assert runner.stats.read == 2
    assert runner.stats.attempts == 0  # never reopened


def test_stop_ends_a_backoff_wait_at_once() -> None:
    runner = Scripted(
        [lambda: (_ for _ in ()).throw(OSError("refused"))] * 100,  # type: ignore[list-item]
        cfg=SourceConfig(kind="stream", uri="rtsp://cam/1"),
        sink=Sink(),
        thing="t",
        size=8,
        backoff=Backoff(3600, initial_s=3600),
    )
    thread = threading.Thread(target=runner._run, args=(None,))
    thread.start()
    eventually(lambda: runner.stats.attempts > 0, what="the first attempt")
    runner._stop.set()
    thread.join(30)
    assert not thread.is_alive()
    assert runner.finished.is_set()


def test_an_error_on_a_frames_way_to_the_server_is_a_live_source_lost_not_its_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()

    class Failing(Sink):
        """Raises on the first two frames, as a bug on the way to the server would."""

        def submit_frame(self, frame_id: str, image: np.ndarray, **kw: object) -> bool:
            if frame_id in ("gate-1", "gate-2"):
                raise RuntimeError(f"{frame_id} failed")
            return super().submit_frame(frame_id, image, **kw)

    sink = Failing()
    runner = Scripted(
        [lambda: Frames(2, clock), lambda: Frames(2, clock), lambda: Frames(2, clock)],
        cfg=SourceConfig(kind="stream", uri="rtsp://cam/1", rate_hz=1000, name="gate"),
        sink=sink,
        thing="t",
        size=8,
        clock=clock,
        backoff=Backoff(0.004, initial_s=0.001),
    )
    runner.error_backoff = Backoff(0.004, initial_s=0.001)
    with caplog.at_level(logging.WARNING, logger="edgeinfer.runtime.sources.runner"):
        runner._run(None)
    assert sink.ids == ["gate-3", "gate-4"]  # each failure reopened the stream, and it served on
    assert runner.stats.reconnects == 2
    assert runner.stats.answered == 2
    failed = [r for r in caplog.records if "failed" in r.getMessage()]
    assert [r.exc_info is not None for r in failed] == [True, False]  # the traceback once


def test_an_error_ends_a_video_file() -> None:
    clock = Clock()

    class Failing(Sink):
        def submit_frame(self, frame_id: str, image: np.ndarray, **kw: object) -> bool:
            raise RuntimeError("failed")

    runner = Scripted(
        [],
        cfg=SourceConfig(kind="video", uri="/data/a.mp4", rate_hz=1000),
        sink=Failing(),
        thing="t",
        size=8,
        clock=clock,
    )
    runner._run(Frames(3, clock))
    assert runner.finished.is_set()
    assert runner.stats.read == 1  # not reopened, not read on
