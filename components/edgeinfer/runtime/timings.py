"""Per-request stage timings, published in small batches on `edgeinfer/local/timings`, off the hot path.

`record()` only appends to a list under a lock; a background thread publishes a `TimingBatch` when
`max_records` are waiting or `flush_interval_ms` after the first one, whichever comes first. If the
bus refuses the publish the batch is dropped (timings are telemetry, never worth blocking a result).

A batch stays under `BATCH_MAX_BYTES` whatever its records hold (ids of up to 256 characters, a
detector's labels, the executions of many small batches): one that would be larger goes as two
halves, and so on. Nucleus lite closes a component's whole IPC connection over a message above
`IPC_MAX_BYTES`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping

from edgeinfer.messages import IPC_MAX_BYTES, TIMINGS_TOPIC, TimingBatch, TimingRecord, iso_utc
from edgeinfer.transport import PubSub, TransportError

log = logging.getLogger(__name__)

# The bus sends a binary message: its payload travels base64 inside the IPC frame's JSON (4 bytes for
# every 3), beside the envelope (topic, headers, framing) that the rest leaves room for.
BATCH_MAX_BYTES = (IPC_MAX_BYTES - 1000) * 3 // 4


class TimingPublisher:
    def __init__(
        self,
        bus: PubSub,
        thing: str,
        *,
        max_records: int = 32,
        flush_interval_ms: float = 250.0,
        enabled: bool = True,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.bus = bus
        self.thing = thing
        self.max_records = max_records
        self.flush_interval_ms = flush_interval_ms
        self.enabled = enabled
        self.clock = clock
        self.wall = wall
        self._records: list[TimingRecord] = []
        self._executions: list[int] = []
        self._capture: Counter[str] = Counter()  # capture's counters since the last batch
        self._sources: dict[str, Counter[str]] = {}  # each frame source's, likewise
        self._first: float | None = None
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stop = False
        self.published = 0
        self.failed = 0

    def record(self, rec: TimingRecord) -> None:
        if not self.enabled:
            return
        with self._cond:
            self._records.append(rec)
            if self._first is None:
                self._first = self.clock()
                self._cond.notify()  # the thread now has a flush time to wait for
            elif len(self._records) >= self.max_records:
                self._cond.notify()

    def execution(self, batch_size: int) -> None:
        if not self.enabled:
            return
        with self._cond:
            self._executions.append(batch_size)
            if self._first is None:
                self._first = self.clock()
                self._cond.notify()

    def add_capture(self, counts: Mapping[str, int]) -> None:
        """Capture's counter increments (`edgeinfer.capture.counts`), carried by the next batch: they
        reach the telemetry window open when they happened, also when no request comes meanwhile."""
        if not self.enabled:
            return
        with self._cond:
            self._capture.update(counts)
            if self._first is None:
                self._first = self.clock()
                self._cond.notify()

    def add_source(self, name: str, counts: Mapping[str, int]) -> None:
        """A frame source's counter increments (`runtime.sources`), carried by the next batch."""
        if not self.enabled:
            return
        with self._cond:
            self._sources.setdefault(name, Counter()).update(counts)
            if self._first is None:
                self._first = self.clock()
                self._cond.notify()

    def due(self, now: float) -> bool:
        with self._cond:
            return self._due(now)

    def _due(self, now: float) -> bool:
        if self._first is None:
            return False
        return len(self._records) >= self.max_records or (now - self._first) * 1000 >= self.flush_interval_ms

    def flush(self) -> int:
        """Publish what is waiting now (called by the thread, and by tests). Returns records sent."""
        with self._cond:
            records, executions, capture = self._records, self._executions, dict(self._capture)
            self._records, self._executions, self._first = [], [], None
            self._capture.clear()
            sources = {name: dict(c) for name, c in self._sources.items()}
            self._sources.clear()
        if not records and not executions and not capture and not sources:
            return 0
        stamp = iso_utc(self.wall())
        for start in range(0, max(1, len(records)), self.max_records):
            chunk = records[start : start + self.max_records]
            first = start == 0
            self._publish(
                TimingBatch(
                    self.thing,
                    chunk,
                    executions if first else [],
                    stamp,
                    capture if first else {},
                    sources=sources if first else {},
                )
            )
        return len(records)

    def _publish(self, batch: TimingBatch) -> None:
        payload = batch.to_json()
        records, executions = batch.records, batch.executions
        if len(payload) > BATCH_MAX_BYTES and (len(records) > 1 or len(executions) > 1):
            r, e = len(records) // 2, len(executions) // 2
            self._publish(
                TimingBatch(
                    batch.thing,
                    records[:r],
                    executions[:e],
                    batch.timestamp,
                    batch.capture,
                    sources=batch.sources,
                )
            )
            self._publish(TimingBatch(batch.thing, records[r:], executions[e:], batch.timestamp))
            return
        try:
            self.bus.publish(TIMINGS_TOPIC, payload, target="local")
            self.published += 1
        except TransportError as exc:
            self.failed += 1
            log.debug("timings not published: %s", exc)

    def hello(self) -> None:
        """Publish an empty batch (start-up: warms the publish path; telemetry ignores it)."""
        try:
            self.bus.publish(TIMINGS_TOPIC, TimingBatch(self.thing, [], [], iso_utc(self.wall())).to_json())
        except TransportError as exc:
            log.debug("timings hello not published: %s", exc)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="edgeinfer-timings", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stop and not self._due(self.clock()):
                    timeout = None
                    if self._first is not None:
                        timeout = max(0.001, self.flush_interval_ms / 1000 - (self.clock() - self._first))
                    self._cond.wait(timeout)
                stop = self._stop
            self.flush()
            if stop:
                return

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        else:
            self.flush()
