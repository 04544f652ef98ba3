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
        self.selectors: dict[str, Selector] = {}
        self.counts = {"chosen": 0, "spooled": 0, "busy": 0, "no_image": 0, "bad_image": 0}
        self._queue: queue.Queue[_Chosen | None] = queue.Queue(cfg.queue_size)
        self._thread: threading.Thread | None = None

    # --------------------------------------------------------------------------- the answering thread

    def on_answer(self, job: Job, computed: Result, answered: Result) -> None:
        model = computed.model or answered.model
        name = model.name if model is not None else ""
        selector = self.selectors.get(name)
        if selector is None:
            settings = self.cfg.for_model(name)
            if settings is None or not settings.samplers:
                return
            selector = self.selectors[name] = Selector(settings, clock=self.clock)
        reason = selector.choose(computed, answered)
        if reason is None:
            return
        self.counts["chosen"] += 1
        try:
            self._queue.put_nowait(_Chosen(job.request, job.source, computed, answered, reason, self.wall()))
        except queue.Full:
            self.counts["busy"] += 1

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
            self.counts["no_image"] += 1
            return
        model = item.computed.model or item.answered.model
        settings = self.cfg.for_model(model.name if model is not None else "")
        assert settings is not None  # chosen by its samplers
        try:
            jpeg = to_jpeg(image, settings.max_image_side, settings.jpeg_quality)
        except ValueError:
            self.counts["bad_image"] += 1
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
        self.counts["spooled"] += 1
        if self.uploader is not None:
            self.uploader.poke()

    def stats(self) -> dict[str, Any]:
        """Counters for telemetry: what was chosen, spooled, dropped by the caps, uploaded."""
        out: dict[str, Any] = dict(self.counts)
        out["dropped"] = dict(self.spool.dropped)
        out["spool_records"] = len(self.spool)
        out["spool_bytes"] = self.spool.bytes
        if self.uploader is not None:
            out.update(uploaded=self.uploader.uploaded, upload_failures=self.uploader.failures)
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


def start_capture(doc: Any, thing: str, work_dir: str, hooks: list[AnswerHook]) -> CaptureHook | None:
    """Read the `capture` node (None: off) and, when enabled, start capture and add its hook to
    `hooks`. A node that does not read is logged and capture stays off: serving goes on."""
    from edgeinfer.config import ConfigError

    try:
        cfg = CaptureConfig.from_recipe(doc)
    except ConfigError as exc:
        log.error("capture off: %s", exc)
        return None
    if not cfg.enabled:
        return None
    folder = Path(cfg.spool_dir or os.path.join(work_dir, "capture-spool"))
    spool = Spool(folder, max_bytes=int(cfg.spool_max_mb * 1024 * 1024), max_age_s=cfg.spool_max_age_h * 3600)
    region = cfg.region or os.environ.get("AWS_REGION", "") or os.environ.get("AWS_DEFAULT_REGION", "")
    client = S3Client(cfg.bucket, region, CredentialChain(), endpoint=cfg.endpoint)
    hook = CaptureHook(cfg, thing, spool, Uploader(spool, client, bytes_per_s=cfg.upload_bytes_per_s)).start()
    hooks.append(hook)
    log.info("capture on: %d records spooled in %s, uploading to %s", len(spool), folder, cfg.bucket)
    return hook
