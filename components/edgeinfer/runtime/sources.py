"""Frame sources beyond requests: a camera, a video file or stream, or a folder of images.

What users of AWS's DLR component set with `UseCamera`, `ImageDirectory` and `InferenceInterval`. One
thread reads frames at the source's own pace (a camera's frame rate, a video file's FPS in real time,
a folder at `rate_hz`) and offers them to the server at most `rate_hz` times a second. The latest
frame wins: a frame that arrives while the previous one is still being served, or between two ticks,
is dropped and counted (and recorded as a `dropped` timing event, so telemetry shows it).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from edgeinfer.messages import Latency, TimingRecord, result_topic
from edgeinfer.runtime.config import SourceConfig
from edgeinfer.runtime.decode import (
    DecodeError,
    Letterbox,
    decode_image,
    decode_letterboxed,
    letterbox,
    to_model_input,
)
from edgeinfer.transport import Target

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")


class FrameReader:
    """A source's frames, one at a time. `geometry`: how the frame `read` returned last was
    letterboxed (a detector's input, its boxes mapped back to the frame's pixels); None when not."""

    geometry: Letterbox | None = None

    def read(self) -> np.ndarray | None:
        """The next frame as RGB `[size, size, 3]`, or None at the end."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the reader holds (nothing, unless it says otherwise)."""


class VideoReader(FrameReader):
    """cv2.VideoCapture on a camera (index or device path) or a video file / stream URL."""

    def __init__(
        self,
        uri: str,
        size: int,
        *,
        camera: bool,
        loop: bool,
        sleep: Callable[[float], None],
        letterboxed: bool = False,
    ) -> None:
        import cv2

        self.uri = uri
        self.size = size
        self.letterboxed = letterboxed  # a detector's input: the whole frame, its geometry kept
        self.geometry: Letterbox | None = None
        self.camera = camera
        self.loop = loop
        self.sleep = sleep
        self._cap = cv2.VideoCapture(int(uri) if camera and uri.isdigit() else uri)
        if not self._cap.isOpened():
            raise OSError(f"cannot open {'camera' if camera else 'video'} {uri!r}")
        fps = self._cap.get(cv2.CAP_PROP_FPS)
        self.period = 1.0 / fps if not camera and fps and 0 < fps < 1000 else 0.0
        self._next = time.monotonic()

    def read(self) -> np.ndarray | None:
        import cv2

        if self.period:  # a file plays in real time, not as fast as it decodes
            delay = self._next - time.monotonic()
            if delay > 0:
                self.sleep(delay)
            self._next = max(self._next + self.period, time.monotonic() - self.period)
        ok, frame = self._cap.read()
        if not ok and self.loop and not self.camera:
            self._cap.set(cv2.CAP_PROP_POS_FRAMES, 0)
            ok, frame = self._cap.read()
        if not ok or frame is None:
            return None
        if self.letterboxed:
            image, self.geometry = letterbox(frame, self.size, bgr=True)
            return image
        return to_model_input(frame, self.size, bgr=True)

    def close(self) -> None:
        self._cap.release()


class FolderReader(FrameReader):
    """Every image in a folder, in name order, at `rate_hz`; unreadable files are skipped and logged."""

    def __init__(
        self,
        folder: str,
        size: int,
        *,
        rate_hz: float,
        loop: bool,
        sleep: Callable[[float], None],
        letterboxed: bool = False,
    ) -> None:
        if not os.path.isdir(folder):
            raise OSError(f"image folder {folder!r} does not exist")
        self.folder = folder
        self.size = size
        self.letterboxed = letterboxed
        self.geometry: Letterbox | None = None
        self.period = 1.0 / rate_hz
        self.loop = loop
        self.sleep = sleep
        self._files: list[str] = []
        self._i = 0
        self._next = time.monotonic()

    def _list(self) -> list[str]:
        return sorted(
            os.path.join(self.folder, f)
            for f in os.listdir(self.folder)
            if f.lower().endswith(IMAGE_EXTENSIONS)
        )

    def read(self) -> np.ndarray | None:
        while True:
            if self._i >= len(self._files):
                if self._files and not self.loop:
                    return None
                self._files, self._i = self._list(), 0
                if not self._files:
                    return None
            path = self._files[self._i]
            self._i += 1
            delay = self._next - time.monotonic()
            if delay > 0:
                self.sleep(delay)
            self._next = max(self._next + self.period, time.monotonic())
            try:
                with open(path, "rb") as fh:
                    data = fh.read()
                if self.letterboxed:
                    image, self.geometry = decode_letterboxed(data, self.size)
                    return image
                return decode_image(data, self.size)
            except (OSError, DecodeError) as exc:
                log.warning("skipping %s: %s", path, exc)


class FrameSink(Protocol):
    """The server side of a source (InferenceServer implements it). `geometry`: how a detector's
    frame was letterboxed, so its boxes come back in the frame's pixels."""

    def submit_frame(
        self,
        frame_id: str,
        image: np.ndarray,
        *,
        source: str,
        topic: str,
        target: Target,
        top_k: int,
        on_done: Callable[[], None] | None = None,
        geometry: Letterbox | None = None,
    ) -> bool: ...


@dataclass
class SourceStats:
    read: int = 0
    submitted: int = 0
    dropped: int = 0
    answered: int = 0


class SourceRunner:
    def __init__(
        self,
        cfg: SourceConfig,
        sink: FrameSink,
        thing: str,
        size: int,
        *,
        record_drop: Callable[[TimingRecord], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        letterboxed: bool = False,
    ) -> None:
        self.letterboxed = letterboxed  # the engine is a detector: frames letterboxed, boxes mapped back
        self.cfg = cfg
        self.sink = sink
        self.thing = thing
        self.size = size
        self.record_drop = record_drop
        self.clock = clock
        self.sleep = sleep
        self.stats = SourceStats()
        self._busy = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seq = 0
        self._next_tick = 0.0
        self.finished = threading.Event()

    def open(self) -> FrameReader:
        kind = self.cfg.kind
        if kind == "folder":
            return FolderReader(
                self.cfg.uri,
                self.size,
                rate_hz=self.cfg.rate_hz,
                loop=self.cfg.loop,
                sleep=self.sleep,
                letterboxed=self.letterboxed,
            )
        return VideoReader(
            self.cfg.uri,
            self.size,
            camera=kind == "camera",
            loop=self.cfg.loop,
            sleep=self.sleep,
            letterboxed=self.letterboxed,
        )

    def start(self) -> None:
        reader = self.open()  # raises OSError now, so a bad source is reported at start
        self._thread = threading.Thread(
            target=self._run, args=(reader,), name="edgeinfer-source", daemon=True
        )
        self._thread.start()
        log.info("source %s %s at %.3g Hz", self.cfg.kind, self.cfg.uri, self.cfg.rate_hz)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def offer(self, frame: np.ndarray, *, geometry: Letterbox | None = None) -> bool:
        """One frame from the reader: serve it, or drop it (stale). Returns True when submitted.
        `geometry`: how a detector's frame was letterboxed (its boxes come back in the frame's pixels)."""
        self.stats.read += 1
        now = self.clock()
        if self._busy.is_set() or now < self._next_tick:
            self._drop()
            return False
        self._seq += 1
        self._busy.set()
        topic = self.cfg.result_topic or result_topic(self.thing)
        ok = self.sink.submit_frame(
            f"{self.cfg.kind}-{self._seq}",
            frame,
            source=self.cfg.kind,
            topic=topic,
            target="iot" if self.cfg.publish_to_iot else "local",
            top_k=self.cfg.top_k,
            on_done=self._done,
            geometry=geometry,
        )
        if not ok:
            self._busy.clear()
            self._drop()
            return False
        self.stats.submitted += 1
        self._next_tick = max(self._next_tick + 1.0 / self.cfg.rate_hz, now)
        return True

    def _done(self) -> None:
        self.stats.answered += 1
        self._busy.clear()

    def _drop(self) -> None:
        self.stats.dropped += 1
        if self.record_drop is not None:
            self.record_drop(TimingRecord(id=None, status="ok", latency_ms=Latency(), dropped=True))

    def _run(self, reader: FrameReader) -> None:
        try:
            while not self._stop.is_set():
                frame = reader.read()
                if frame is None:
                    log.info("source %s ended after %d frames", self.cfg.uri, self.stats.read)
                    break
                self.offer(frame, geometry=reader.geometry)
        except Exception:
            log.exception("source %s failed", self.cfg.uri)
        finally:
            reader.close()
            self.finished.set()
