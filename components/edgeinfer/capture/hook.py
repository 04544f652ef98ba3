"""The runtime's side of capture: an `AnswerHook` that selects and hands over, nothing more.

On the answering thread it only looks up the model's samplers and asks them (a few comparisons and,
when chosen, a queue put that never blocks: a full queue counts the answer, it does not wait). A
writer thread makes the record (the image re-encoded only when a size cap asks for it) and spools it;
the uploader thread sends the spool. So serving pays for the choice, and the disk and the network
work off its path.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeinfer.capture.config import CaptureConfig
from edgeinfer.capture.counts import CaptureCounts, Sink
from edgeinfer.capture.credentials import CredentialChain
from edgeinfer.capture.record import Record, to_jpeg
from edgeinfer.capture.s3 import S3Client
from edgeinfer.capture.samplers import Selector
from edgeinfer.capture.spool import Spool
from edgeinfer.capture.uploader import Uploader
from edgeinfer.messages import Request, Result
from edgeinfer.runtime.answer import AnswerHook, Job

__all__ = ["CaptureHook", "start_capture"]

log = logging.getLogger(__name__)

# How long stop waits for the writer to take its end marker, and then to end.
STOP_WAIT_S = 10.0


@dataclass
class _Chosen:
    request: Request
    source: str | None
    computed: Result
    answered: Result
    reason: str
    wall: float


class CaptureHook(AnswerHook):
    def __init__(
        self,
        cfg: CaptureConfig,
        thing: str,
        spool: Spool,
        uploader: Uploader | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.cfg = cfg
        self.thing = thing
        self.spool = spool
        self.uploader = uploader
        self.clock = clock
        self.wall = wall
        self.selectors: dict[str, Selector | None] = {}  # None: the model has no samplers
        self._choosing = threading.Lock()
        # Shared with the spool and the uploader, and counted from several threads: one locked tally.
        self.counts: CaptureCounts = spool.counts
        self._queue: queue.Queue[_Chosen | None] = queue.Queue(cfg.queue_size)
        self._thread: threading.Thread | None = None

    # --------------------------------------------------------------------------- the answering thread

    def on_answer(self, job: Job, computed: Result, answered: Result) -> None:
        model = computed.model or answered.model
        name = model.name if model is not None else ""
        # Answering threads ask at once: a model's selector is made once, and a sampler's limits are
        # checked and taken as one step, or two threads could both take a last place.
        with self._choosing:
            if name not in self.selectors:
                settings = self.cfg.for_model(name)
                self.selectors[name] = (
                    Selector(settings, clock=self.clock)
                    if settings is not None and settings.samplers
                    else None
                )
            selector = self.selectors[name]
            reason = selector.choose(computed, answered) if selector is not None else None
        if reason is None:
            return
        self.counts.add("chosen")
        try:
            self._queue.put_nowait(_Chosen(job.request, job.source, computed, answered, reason, self.wall()))
        except queue.Full:
            self.counts.add("busy")

    # ------------------------------------------------------------------------------- the writer thread

    def start(self) -> CaptureHook:
        self._thread = threading.Thread(target=self._write_loop, name="edgeinfer-capture-write", daemon=True)
        self._thread.start()
        if self.uploader is not None:
            self.uploader.start()
        return self

    def stop(self) -> None:
        """What was chosen is spooled first; the uploader stops after (the spool keeps the rest)."""
        if self._thread is not None:
            try:  # a writer stuck on a full queue must not hold up the runtime's stop
                self._queue.put(None, timeout=STOP_WAIT_S)
            except queue.Full:
                log.warning(
                    "capture's writer did not take its stop in %g s; stopping without it", STOP_WAIT_S
                )
            self._thread.join(STOP_WAIT_S)
            self._thread = None
        if self.uploader is not None:
            self.uploader.stop()

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                self.write(item)
            except Exception:
                log.exception("capture record not written")

    def write(self, item: _Chosen) -> None:
        image = _image_of(item.request)
        if image is None:
            self.counts.add("no_image")
            return
        model = item.computed.model or item.answered.model
        settings = self.cfg.for_model(model.name if model is not None else "")
        assert settings is not None  # chosen by its samplers
        try:
            jpeg = to_jpeg(image, settings.max_image_side, settings.jpeg_quality)
        except ValueError:
            self.counts.add("bad_image")
            return
        record = Record.make(
            prefix=self.cfg.prefix,
            thing=self.thing,
            request=item.request,
            computed=item.computed,
            answered=item.answered,
            reason=item.reason,
            wall=item.wall,
            image=jpeg,
            source=item.source,
        )
        self.spool.put(record)
        self.counts.add("spooled")
        if self.uploader is not None:
            self.uploader.poke()

    def stats(self) -> dict[str, Any]:
        """Counters for telemetry: what was chosen, spooled, dropped by the caps, uploaded."""
        out: dict[str, Any] = self.counts.totals()
        out["dropped"] = self.spool.dropped_counts()
        out["spool_records"] = len(self.spool)
        out["spool_bytes"] = self.spool.bytes
        return out


def _image_of(request: Request) -> bytes | None:
    if request.image is not None:
        return request.image
    if request.image_path:
        try:
            return Path(request.image_path).read_bytes()
        except OSError:
            return None
    return None


def start_capture(
    doc: Any, thing: str, work_dir: str, hooks: list[AnswerHook], counts: Sink | None = None
) -> CaptureHook | None:
    """Read the `capture` node (None: off) and, when enabled, start capture and add its hook to
    `hooks`; `counts` takes each counter's increments (the timing publisher's `add_capture`, which
    brings them to the telemetry window). A node that does not read is logged and capture stays off:
    serving goes on."""
    from edgeinfer.config import ConfigError

    try:
        cfg = CaptureConfig.from_recipe(doc)
    except ConfigError as exc:
        log.error("capture off: %s", exc)
        return None
    if not cfg.enabled:
        return None
    folder = Path(cfg.spool_dir or os.path.join(work_dir, "capture-spool"))
    tally = CaptureCounts() if counts is None else CaptureCounts(counts)
    spool = Spool(
        folder,
        max_bytes=int(cfg.spool_max_mb * 1024 * 1024),
        max_age_s=cfg.spool_max_age_h * 3600,
        counts=tally,
    )
    region = cfg.region or os.environ.get("AWS_REGION", "") or os.environ.get("AWS_DEFAULT_REGION", "")
    client = S3Client(cfg.bucket, region, CredentialChain(), endpoint=cfg.endpoint)
    hook = CaptureHook(cfg, thing, spool, Uploader(spool, client, bytes_per_s=cfg.upload_bytes_per_s)).start()
    hooks.append(hook)
    log.info("capture on: %d records spooled in %s, uploading to %s", len(spool), folder, cfg.bucket)
    return hook
