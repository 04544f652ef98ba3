"""One source's thread: read frames, offer the latest to the server, reconnect what is lost.

What users of AWS's DLR component set with `UseCamera`, `ImageDirectory` and `InferenceInterval`, and
what DeepStream and roboflow's `InferencePipeline` do for many streams. One thread reads frames at the
source's own pace and offers them to the server at most `rate_hz` times a second. The latest frame
wins: a frame that arrives while `max_in_flight` of the source's frames are still being served, or
between two ticks, is dropped and counted (and recorded as a `dropped` timing event, so telemetry
shows it). A camera or a stream that is lost (or not there yet) is opened again with exponential
backoff, capped and jittered (`Backoff`); the reconnects and the seconds without frames are counted.
A lost source never ends the runtime, nor does an error a live source did not expect (it is taken as
the source lost); a video file or folder ends at its end (unless it loops), or at an error.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from edgeinfer.messages import Latency, TimingRecord, result_topic
from edgeinfer.runtime.config import SourceConfig
from edgeinfer.runtime.decode import Letterbox
from edgeinfer.runtime.sources.backoff import Backoff
from edgeinfer.runtime.sources.readers import FolderReader, FrameReader, VideoReader, is_stream
from edgeinfer.transport import Target

log = logging.getLogger(__name__)

LATENCIES_KEPT = 1000  # the most recent frame → result latencies a source keeps
EARLY = 0.25  # of a period: how early for its tick a frame may come and still be taken

# A model's input: its side and whether its frames are letterboxed (a detector's). None: the model is
# not loaded now (its frames wait for it).
FrameFormat = tuple[int, bool]
# Where a source's counter increments go, by its name (the timing publisher's `add_source`, which
# brings them to the telemetry window): served, dropped, reconnects, outage_ms.
CountSink = Callable[[str, Mapping[str, int]], None]


class FrameSink(Protocol):
    """The server side of a source (InferenceServer implements it). `geometry`: how a detector's
    frame was letterboxed, so its boxes come back in the frame's pixels; `model`: the model (or
    pipeline) that serves it, empty for the default."""

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
        model: str = "",
    ) -> bool: ...


@dataclass
class SourceStats:
    """A source's counters since it started (telemetry takes their differences per window).
    `outage_s`: seconds without frames after the source was lost, the outage under way included by
    `outage_now`; `attempts`: opens that failed; `attempt_times` when the recent ones were."""

    read: int = 0
    submitted: int = 0
    dropped: int = 0
    answered: int = 0
    reconnects: int = 0
    attempts: int = 0
    outage_s: float = 0.0
    lost_at: float | None = None
    connected: bool = False
    attempt_times: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=64))
    latencies_ms: collections.deque[float] = field(
        default_factory=lambda: collections.deque(maxlen=LATENCIES_KEPT)
    )
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def outage_now(self, now: float) -> float:
        with self.lock:
            return self.outage_s + (now - self.lost_at if self.lost_at is not None else 0.0)

    def latencies(self) -> list[float]:
        with self.lock:
            return list(self.latencies_ms)


class SourceRunner:
    # How long `stop` waits for the thread: one stuck in a read (a stream that stopped answering)
    # ends on its own later, offering nothing more and opening nothing again.
    stop_wait_s = 5.0

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
        frame_format: Callable[[], FrameFormat | None] | None = None,
        backoff: Backoff | None = None,
        counts: CountSink | None = None,
    ) -> None:
        self.letterboxed = letterboxed  # the engine is a detector: frames letterboxed, boxes mapped back
        self.cfg = cfg
        self.name = cfg.name or cfg.kind
        self.sink = sink
        self.thing = thing
        self.size = size
        # The model's input now (its engine may be swapped for one of another size): None keeps
        # `size` and `letterboxed`.
        self.frame_format = frame_format
        self.record_drop = record_drop
        self.counts = counts
        self._outage_counted = 0.0  # how far the outage under way has reached telemetry
        self.clock = clock
        self.sleep = sleep
        self.backoff = backoff or Backoff(cfg.reconnect_max_s)
        self.error_backoff = Backoff(cfg.reconnect_max_s)  # after an unexpected error (`_failed`)
        self._error_said = False
        # Lost, it is opened again: a camera, a stream; a file or folder ends at its end.
        self.live = cfg.kind in ("camera", "stream") or (cfg.kind == "video" and is_stream(cfg.uri))
        self.stats = SourceStats()
        self._in_flight = 0  # frames submitted and not answered yet (under stats.lock)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seq = 0
        self._next_tick = 0.0
        self._format: FrameFormat = (size, letterboxed)
        self.finished = threading.Event()

    def open(self) -> FrameReader:
        if self.frame_format is not None:
            fmt = self.frame_format()
            if fmt is None:
                raise OSError(f"model {self.cfg.model!r} is not loaded")
            self.size, self.letterboxed = fmt
        self._format = (self.size, self.letterboxed)
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
        """Start reading. A file or folder that cannot be opened raises OSError now, so a bad source
        is reported at start; a camera or stream is tried again until it opens."""
        reader = None if self.live else self.open()
        self._thread = threading.Thread(
            target=self._run, args=(reader,), name=f"edgeinfer-source-{self.name}", daemon=True
        )
        self._thread.start()
        log.info("source %s: %s %s at %.3g Hz", self.name, self.cfg.kind, self.cfg.uri, self.cfg.rate_hz)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.stop_wait_s)
            self._thread = None

    def offer(self, frame: np.ndarray, *, geometry: Letterbox | None = None) -> bool:
        """One frame from the reader: serve it, or drop it (stale). Returns True when submitted.
        `geometry`: how a detector's frame was letterboxed (its boxes come back in the frame's pixels)."""
        self.stats.read += 1
        now = self.clock()
        period = 1.0 / self.cfg.rate_hz
        # A frame a little early for its tick is taken: a stream whose rate is `rate_hz` sends with
        # jitter, and a frame dropped for a few milliseconds would cost a whole period.
        with self.stats.lock:
            taken = self._in_flight < self.cfg.max_in_flight and now >= self._next_tick - period * EARLY
            if taken:
                self._in_flight += 1
        if not taken:
            self._drop()
            return False
        self._seq += 1
        topic = self.cfg.result_topic or result_topic(self.thing)
        ok = False
        try:
            ok = self.sink.submit_frame(
                f"{self.name}-{self._seq}",
                frame,
                source=self.name,
                topic=topic,
                target="iot" if self.cfg.publish_to_iot else "local",
                top_k=self.cfg.top_k,
                on_done=functools.partial(self._done, now),
                geometry=geometry,
                model=self.cfg.model,
            )
        finally:
            if not ok:  # refused, or raised: its place in flight is free again
                with self.stats.lock:
                    self._in_flight -= 1
        if not ok:
            self._drop()
            return False
        self.stats.submitted += 1
        # The ticks keep their grid (a late frame does not push the next one back), and a source
        # more than a period late catches up by one frame at most.
        self._next_tick = max(self._next_tick + period, now - period)
        return True

    def _done(self, sent: float) -> None:
        latency_ms = (self.clock() - sent) * 1000
        with self.stats.lock:
            self.stats.answered += 1
            self.stats.latencies_ms.append(latency_ms)
            self._in_flight -= 1
        self._count(served=1)

    def _count(self, **counts: int) -> None:
        if self.counts is not None:
            self.counts(self.name, counts)

    def _count_outage(self, now: float, **more: int) -> None:
        """What the outage under way adds since it was last counted (a long outage reaches each window)."""
        self._count(outage_ms=round((now - self._outage_counted) * 1000), **more)
        self._outage_counted = now

    def _drop(self) -> None:
        self.stats.dropped += 1
        self._count(dropped=1)
        if self.record_drop is not None:
            self.record_drop(TimingRecord(id=None, status="ok", latency_ms=Latency(), dropped=True))

    # ------------------------------------------------------------------------------------- the thread

    def _run(self, reader: FrameReader | None) -> None:
        try:
            while not self._stop.is_set():
                if reader is None:
                    reader = self._reopen()
                    if reader is None:
                        break
                try:
                    frame = self._read(reader)
                    if frame is None:
                        reader.close()
                        reader = None
                        if not self.live:
                            log.info("source %s ended after %d frames", self.name, self.stats.read)
                            break
                        self._lost()
                        continue
                    if self._stop.is_set():  # stopped during the read: a stopped source offers nothing
                        break
                    self._receiving()
                    self.offer(frame, geometry=reader.geometry)
                    self.error_backoff.reset()
                    if self.frame_format is not None and self.frame_format() not in (None, self._format):
                        reader.close()  # a new engine with another input: frames made for it from now on
                        reader = None
                except Exception as exc:
                    if not self.live:
                        raise
                    self._failed(reader, exc)
                    reader = None
        except Exception:
            log.exception("source %s failed", self.name)
        finally:
            if reader is not None:
                reader.close()
            self.finished.set()

    def _failed(self, reader: FrameReader | None, exc: Exception) -> None:
        """An error a live source did not expect (in a frame's way to the server, say): it is lost,
        as a camera that fails is, and opened again after a wait that grows while the errors go on
        (a frame through without one resets it), so an error at every frame does not spin."""
        if not self._error_said:
            self._error_said = True  # its traceback once; its message each time after
            log.error("source %s failed; reconnecting", self.name, exc_info=exc)
        else:
            log.warning("source %s failed again: %s", self.name, exc)
        if reader is not None:
            try:
                reader.close()
            except Exception as close_exc:
                log.warning("source %s: close failed: %s", self.name, close_exc)
        self._lost()
        self._stop.wait(self.error_backoff.next())

    def _read(self, reader: FrameReader) -> np.ndarray | None:
        try:
            return reader.read()
        except Exception as exc:  # a reader that fails is a source lost, like one that ends
            if not self.live:
                raise
            log.warning("source %s: read failed: %s", self.name, exc)
            return None

    def _reopen(self) -> FrameReader | None:
        """Open the source, trying again with backoff until it opens; None when stopped meanwhile."""
        while not self._stop.is_set():
            try:
                return self.open()
            except Exception as exc:  # OSError, or what a capture backend raises: tried again
                delay = self.backoff.next()
                now = self.clock()
                with self.stats.lock:
                    self.stats.attempts += 1
                    self.stats.attempt_times.append(now)
                    lost = self.stats.lost_at is not None
                if lost:
                    self._count_outage(now)
                log.info("source %s: not open (%s); next attempt in %.1f s", self.name, exc, delay)
            self._stop.wait(delay)
        return None

    def _lost(self) -> None:
        with self.stats.lock:
            was = self.stats.connected
            self.stats.connected = False
            if self.stats.lost_at is None:
                self.stats.lost_at = self._outage_counted = self.clock()
        if was:
            log.warning("source %s: lost after %d frames; reconnecting", self.name, self.stats.read)

    def _receiving(self) -> None:
        """A frame: the source is there. The first after a loss ends the outage and counts a reconnect."""
        if self.stats.connected:
            return
        with self.stats.lock:
            self.stats.connected = True
            lost_at, self.stats.lost_at = self.stats.lost_at, None
            if lost_at is not None:
                outage = self.clock() - lost_at
                self.stats.outage_s += outage
                self.stats.reconnects += 1
        self.backoff.reset()
        if lost_at is not None:
            self._count_outage(self.clock(), reconnects=1)
            log.info("source %s: back after %.1f s", self.name, self.clock() - lost_at)
