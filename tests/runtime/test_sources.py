"""Frame sources: latest frame wins, stale frames dropped and counted; folder and video readers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np

from edgeinfer.messages import TimingRecord
from edgeinfer.runtime.config import SourceConfig
from edgeinfer.runtime.decode import Letterbox
from edgeinfer.runtime.sources import FolderReader, FrameReader, SourceRunner, VideoReader
from tests.helpers.images import solid_png


class Sink:
    def __init__(self, accept: bool = True, *, answer: bool = False) -> None:
        self.accept = accept
        self.answer = answer  # each frame answered at once, as a fast engine would
        self.frames: list[tuple[str, Callable[[], None] | None]] = []
        self.geometries: list[object] = []

    def submit_frame(self, frame_id: str, image: np.ndarray, **kw: object) -> bool:
        assert image.shape == (32, 32, 3)
        on_done = kw.get("on_done")
        self.frames.append((frame_id, on_done if callable(on_done) else None))
        self.geometries.append(kw.get("geometry"))
        if self.answer and callable(on_done):
            on_done()
        return self.accept


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def frame() -> np.ndarray:
    return np.zeros((32, 32, 3), dtype=np.uint8)


def test_latest_frame_wins_and_stale_frames_are_counted() -> None:
    sink, clock, drops = Sink(), Clock(), list[TimingRecord]()
    runner = SourceRunner(
        SourceConfig(kind="video", uri="x", rate_hz=2.0, max_in_flight=1),
        sink,
        "t",
        32,
        record_drop=drops.append,
        clock=clock,
    )
    assert runner.offer(frame())  # first frame served
    clock.t = 0.6
    assert not runner.offer(frame())  # previous still in flight: dropped
    sink.frames[0][1]()  # type: ignore[misc]  # answered
    clock.t = 0.7
    assert runner.offer(frame())  # due (0.5 s period) and engine free
    sink.frames[1][1]()  # type: ignore[misc]
    clock.t = 0.8
    assert not runner.offer(frame())  # free, but not due until 1.0 s
    clock.t = 1.2
    assert runner.offer(frame())
    assert [f[0] for f in sink.frames] == ["video-1", "video-2", "video-3"]
    assert runner.stats.dropped == 2
    assert runner.stats.read == 5
    assert all(isinstance(d, TimingRecord) and d.dropped for d in drops)


def test_full_queue_drops_the_frame() -> None:
    runner = SourceRunner(SourceConfig(kind="folder", uri="x"), Sink(accept=False), "t", 32)
    assert not runner.offer(frame())
    assert runner.stats.dropped == 1


def test_folder_reader_skips_bad_files(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(solid_png((200, 0, 0)))
    (tmp_path / "b.jpg").write_bytes(b"not an image")
    (tmp_path / "c.txt").write_text("ignored")
    (tmp_path / "d.png").write_bytes(solid_png((0, 0, 200)))
    reader = FolderReader(str(tmp_path), 32, rate_hz=1000, loop=False, sleep=lambda s: None)
    first, second = reader.read(), reader.read()
    assert first is not None
    assert second is not None
    assert first[16, 16, 0] > 150
    assert second[16, 16, 2] > 150
    assert reader.read() is None


def test_video_reader(tmp_path: Path) -> None:
    path = tmp_path / "v.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), 25.0, (64, 48))
    for _ in range(3):
        writer.write(np.full((48, 64, 3), (0, 200, 0), dtype=np.uint8))
    writer.release()
    slept: list[float] = []
    reader = VideoReader(str(path), 32, camera=False, loop=False, sleep=slept.append)
    frames = [reader.read() for _ in range(4)]
    assert [f is None for f in frames] == [False, False, False, True]
    assert frames[0] is not None
    assert frames[0][0, 0, 1] > 150  # RGB
    assert reader.period == 1 / 25.0
    reader.close()


class Letterboxed(FrameReader):
    """Two frames, each with the geometry a detector's letterbox gave it."""

    def __init__(self) -> None:
        self.boxes = [
            Letterbox(scale=(0.5, 0.5), offset=(0.0, 4.0), limit=(64.0, 48.0)),
            Letterbox(scale=(0.25, 0.25), offset=(0.0, 8.0), limit=(128.0, 96.0)),
        ]
        self.closed = False

    def read(self) -> np.ndarray | None:
        if not self.boxes:
            return None
        self.geometry = self.boxes.pop(0)
        return frame()

    def close(self) -> None:
        self.closed = True


def test_each_frame_reaches_the_sink_with_its_reader_geometry() -> None:
    sink, reader = Sink(answer=True), Letterboxed()
    runner = SourceRunner(SourceConfig(kind="folder", uri="x", rate_hz=1000), sink, "t", 32)
    expected = list(reader.boxes)
    runner._run(reader)
    assert sink.geometries == expected
    assert reader.closed
    assert runner.finished.is_set()


def test_a_reader_without_a_letterbox_says_so() -> None:
    sink = Sink()
    runner = SourceRunner(SourceConfig(kind="folder", uri="x"), sink, "t", 32)
    assert runner.offer(frame())
    assert sink.geometries == [None]


def test_two_in_flight_overlap_and_a_slightly_early_frame_is_taken() -> None:
    sink, clock = Sink(), Clock()
    runner = SourceRunner(SourceConfig(kind="stream", uri="rtsp://c/1", rate_hz=10.0), sink, "t", 32)
    runner.clock = clock
    assert runner.offer(frame())  # t=0, next tick 0.1
    clock.t = 0.09  # 10 ms early: jitter, taken though the first is still in flight
    assert runner.offer(frame())
    clock.t = 0.2
    assert not runner.offer(frame())  # two in flight already
    sink.frames[0][1]()  # type: ignore[misc]
    clock.t = 0.21
    assert runner.offer(frame())
    clock.t = 0.22
    sink.frames[1][1]()  # type: ignore[misc]
    assert not runner.offer(frame())  # free, but its tick is 0.3
    assert runner.stats.answered == 2
    assert runner.stats.dropped == 2
