"""The runtime's sources (`source` and `sources`): started, stopped and changed by name, live.

`SourceManager.apply` takes the configured list and brings the running set to it: a source added is
started, one removed is stopped, one whose settings changed is started again with them; the others
run on untouched. Each source's frames go to the model its configuration names (`ServerSink`: their
input made for that model's engine, which is loaded when a source needs it), gathered across the
sources on that model into batches (`FrameMux`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgeinfer.messages import TimingRecord
from edgeinfer.runtime.config import SourceConfig
from edgeinfer.runtime.sources.mux import FrameMux
from edgeinfer.runtime.sources.runner import CountSink, FrameFormat, SourceRunner

if TYPE_CHECKING:
    from edgeinfer.runtime.server import InferenceServer

log = logging.getLogger(__name__)


class ServerSink:
    """The server as the sources see it: `submit_frame`, and each model's input (`frame_format`)."""

    def __init__(self, server: InferenceServer) -> None:
        self.server = server
        self.submit_frame = server.submit_frame
        self._unserved: set[str] = set()

    def frame_format(self, model: str) -> FrameFormat | None:
        """`model`'s input side and letterboxing (a pipeline's: its detector's), or None when it is
        not loaded (its load is asked for) or not served."""
        models = self.server.models
        slot = self.server.frame_slot(model)
        if slot is None:
            if model not in self._unserved:  # said once; a model deployed later is found then
                self._unserved.add(model)
                log.warning("a source's model %r is not served here (models: %s)", model, models.names())
            return None
        engine = slot.engine
        if engine is None:
            models.load(slot)
            return None
        return engine.input_size, engine.detector


@dataclass(frozen=True)
class SourceCounters:
    """One source's counters since it started, as telemetry reads them."""

    name: str
    served: int
    dropped: int
    reconnects: int
    outage_s: float
    connected: bool


class SourceManager:
    def __init__(
        self,
        sink: ServerSink,
        thing: str,
        *,
        record_drop: Callable[[TimingRecord], None] | None = None,
        batch_window_s: float = 0.0,
        counts: CountSink | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sink = sink
        self.thing = thing
        self.record_drop = record_drop
        self.counts = counts  # each source's counter increments, to telemetry
        self.clock = clock
        self.runners: dict[str, SourceRunner] = {}
        self._lock = threading.Lock()  # the runners dict, held briefly (a runner's thread takes it)
        self._applying = threading.Lock()  # one `apply` at a time, for as long as it takes
        self.mux = FrameMux(sink, self.sending_to, batch_window_s)

    def sending_to(self, model: str) -> int:
        """The sources whose frames go to `model` and that have frames now (not lost)."""
        with self._lock:
            runners = list(self.runners.values())
        return sum(1 for r in runners if r.cfg.model == model and r.stats.connected)

    def apply(self, configured: Sequence[SourceConfig]) -> None:
        """Run exactly the `configured` sources (each named): start, stop or restart what differs."""
        wanted = {cfg.name: cfg for cfg in configured}
        with self._applying:
            with self._lock:
                going = [(n, r) for n, r in self.runners.items() if wanted.get(n) != r.cfg]
                for name, _ in going:
                    del self.runners[name]
            # Stopped with the lock released: a runner's thread takes it (`sending_to`) on its way
            # to the server, and its stop waits for that thread. Each is stopped before a source of
            # its name starts again, so the two do not read one camera together.
            for name, runner in going:
                runner.stop()
                log.info("source %s stopped", name)
            for name, cfg in wanted.items():
                if self.get(name) is None:
                    self._start(cfg)

    def _start(self, cfg: SourceConfig) -> None:
        runner = SourceRunner(
            cfg,
            self.mux,
            self.thing,
            0,
            record_drop=self.record_drop,
            clock=self.clock,
            frame_format=lambda: self.sink.frame_format(cfg.model),
            counts=self.counts,
        )
        try:
            runner.start()
        except OSError as exc:
            log.error("source %s not started: %s", cfg.name, exc)
            return
        with self._lock:
            self.runners[cfg.name] = runner  # a file or folder that cannot be opened is not kept

    def get(self, name: str) -> SourceRunner | None:
        with self._lock:
            return self.runners.get(name)

    def counters(self) -> list[SourceCounters]:
        now = self.clock()
        with self._lock:
            runners = list(self.runners.values())
        return [
            SourceCounters(
                name=r.name,
                served=r.stats.answered,
                dropped=r.stats.dropped,
                reconnects=r.stats.reconnects,
                outage_s=r.stats.outage_now(now),
                connected=r.stats.connected,
            )
            for r in runners
        ]

    def stop(self) -> None:
        self.apply([])
