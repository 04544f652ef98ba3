"""Turns the runtime's `TimingBatch` messages into one `TelemetryWindow` per window.

The aggregator is plain, synchronous and clock-driven: `add()` folds records in (cheap: five histogram
records and a few counters per request), `poll()` closes every window whose end has passed on the
injected clock. Tests drive it with a fake clock; the component calls `poll()` from its loop.

What a window counts (the wire shape is `edgeinfer.messages.TelemetryWindow`):

- `count`: requests answered in the window (ok and error; dropped frames are not requests);
- `latency_ms`: p50/p90/p99/max per stage over the requests answered `ok` (errors such as BAD_REQUEST
  answer in microseconds and would only hide the real latency), edge and cloud alike;
- `errors`: error results by stable code; `dropped`, `offloaded`, `cascaded`: flagged records;
- `throughput_rps`: `count / window_s`;
- `batch`: `executions` (engine runs), `inferences` (images run) and `mean_size` (inferences/execution);
- `queue_depth`: mean and max of the depth each record saw when it was queued;
- `provider`: the execution provider that ran most requests in the window (the last one seen when the
  window is empty);
- `capture`: capture's counters (`edgeinfer.capture.counts`: chosen, spooled, uploaded, dropped by
  size or age, upload failures...) as the runtime counted them in the window; absent when capture is off;
- `sources`: per frame source (docs/sources.md), by name: frames served and dropped, reconnects and
  milliseconds without frames (`outage_ms`; an outage under way is counted as its attempts fail);
- `system.forward`: the runtime's results outbox (pending, spooled, sent, dropped: totals, the latest
  the runtime reported; absent until it reports; docs/iot-path.md);
- `models`: per model that answered (name, version, variant and the provider that ran it), its `ok`
  answers, how many had a top score below `low_confidence` (a classifier's top-1, a detector's most
  confident detection; a detector's answer with no detection is not counted low), the answers per class
  (a classifier's top-1, a detector's detections) for the `MAX_CLASSES` most frequent and the rest as
  "other", and a histogram of those scores over `SCORE_BINS`. The most frequent `MAX_MODELS` models,
  so that a window stays well under nucleus lite's IPC message cap. A model update shows in the first
  window after it: its records name the new version.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from edgeinfer.messages import (
    ErrorCode,
    ModelQuality,
    ModelRef,
    StageQuantiles,
    TelemetryWindow,
    TimingBatch,
    TimingRecord,
    iso_utc,
)
from edgeinfer.telemetry.histogram import Histogram

__all__ = [
    "DEFAULT_LOW_CONFIDENCE",
    "MAX_CLASSES",
    "MAX_MODELS",
    "OTHER",
    "SCORE_BINS",
    "STAGES",
    "WindowAggregator",
]

log = logging.getLogger(__name__)

STAGES = ("queue", "decode", "inference", "postprocess", "total")
_QUANTILES = (0.5, 0.9, 0.99)

SystemSampler = Callable[[], Mapping[str, Any]]

DEFAULT_LOW_CONFIDENCE = 0.5  # a top score below it counts as a low-confidence answer (`lowConfidence`)
SCORE_BINS = tuple(i / 10 for i in range(11))  # the histogram's edges: ten bins over [0, 1]
MAX_CLASSES = 8  # per model and window, the most frequent classes; the rest are summed as OTHER
MAX_MODELS = 8  # per window, the models with the most answers
MAX_LABEL = 40  # a class label is cut to this many characters in a window
OTHER = "other"


def _bin(score: float, n: int) -> int:
    """The bin of `score` among `n` equal bins over [0, 1]; 1.0 in the last, anything outside (or NaN)
    in the nearer end bin."""
    if not score > 0:
        return 0
    return min(n - 1, int(score * n))


class _ModelAccumulator:
    """One model's answers in an open window."""

    def __init__(self) -> None:
        self.count = 0
        self.low = 0
        self.classes: Counter[str] = Counter()
        self.bins = [0] * (len(SCORE_BINS) - 1)

    def add(self, rec: TimingRecord, threshold: float) -> None:
        self.count += 1
        top = rec.top
        if top and max(p.score for p in top) < threshold:
            self.low += 1
        bins = self.bins
        for p in top:
            self.classes[p.label[:MAX_LABEL]] += 1
            bins[_bin(p.score, len(bins))] += 1

    def quality(self, model: ModelRef, provider: str | None) -> ModelQuality:
        kept = self.classes.most_common(MAX_CLASSES)
        classes = dict(kept)
        rest = sum(self.classes.values()) - sum(classes.values())
        if rest:
            classes[OTHER] = classes.get(OTHER, 0) + rest
        return ModelQuality(
            name=model.name,
            version=model.version,
            variant=model.variant,
            provider=provider,
            count=self.count,
            low_confidence=self.low,
            classes=classes,
            bins=list(SCORE_BINS),
            counts=list(self.bins),
        )


class _Accumulator:
    """The counters of one open window."""

    def __init__(self) -> None:
        self.hists = {stage: Histogram() for stage in STAGES}
        self.count = 0
        self.errors: Counter[str] = Counter()
        self.dropped = 0
        self.offloaded = 0
        self.cascaded = 0
        self.executions = 0
        self.inferences = 0
        self.depth_sum = 0  # over the `count` answered records
        self.depth_max = 0
        self.providers: Counter[str] = Counter()
        self.models: dict[tuple[ModelRef, str | None], _ModelAccumulator] = {}
        self.capture: Counter[str] = Counter()
        self.sources: dict[str, Counter[str]] = {}

    def add(self, rec: TimingRecord, low_confidence: float = DEFAULT_LOW_CONFIDENCE) -> None:
        if rec.dropped:
            self.dropped += 1
            return
        self.count += 1
        if rec.offloaded:
            self.offloaded += 1
        if rec.cascaded:
            self.cascaded += 1
        depth = rec.queue_depth
        self.depth_sum += depth
        if depth > self.depth_max:  # noqa: PLR1730
            self.depth_max = depth
        if rec.provider:
            self.providers[rec.provider] += 1
        if rec.status != "ok":
            self.errors[(rec.code or ErrorCode.INTERNAL).value] += 1
            return
        if rec.model is not None:
            key = (rec.model, rec.provider)
            model = self.models.get(key)
            if model is None:
                model = self.models[key] = _ModelAccumulator()
            model.add(rec, low_confidence)
        lat = rec.latency_ms
        hists = self.hists
        hists["queue"].record(lat.queue)
        hists["decode"].record(lat.decode)
        hists["inference"].record(lat.inference)
        hists["postprocess"].record(lat.postprocess)
        hists["total"].record(lat.total)

    def add_executions(self, sizes: Iterable[int]) -> None:
        for size in sizes:
            if size > 0:
                self.executions += 1
                self.inferences += size

    def model_qualities(self) -> list[ModelQuality]:
        """The `MAX_MODELS` models with the most answers, most first (then by name and version)."""
        ranked = sorted(
            self.models.items(), key=lambda item: (-item[1].count, item[0][0].name, item[0][0].version)
        )
        return [acc.quality(model, provider) for (model, provider), acc in ranked[:MAX_MODELS]]


class WindowAggregator:
    """Folds timing records into fixed windows of `window_s` seconds and emits `TelemetryWindow`s.

    Thread-safe: `add()` is called on the transport's thread, `poll()` on the component's loop.
    `clock` measures the windows (monotonic); `wall` stamps them (epoch seconds). `first_seq` lets a
    restarted component continue the sequence its spool remembers.
    """

    def __init__(
        self,
        thing: str,
        *,
        window_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        system: SystemSampler | None = None,
        first_seq: int = 0,
        low_confidence: float = DEFAULT_LOW_CONFIDENCE,
    ) -> None:
        if not window_s > 0:
            raise ValueError("window_s must be positive")
        self.thing = thing
        self.window_s = float(window_s)
        self._clock = clock
        self._wall = wall
        self._system = system
        self._lock = threading.Lock()
        self._acc = _Accumulator()
        self._start = clock()
        self._next_window_s = self.window_s
        self._end = self._start + self.window_s
        self.next_seq = first_seq
        self._last_provider: str | None = None
        self.low_confidence = low_confidence  # applies to the records added from now on
        self.bad_messages = 0
        self._forward: dict[str, int] = {}  # the runtime's outbox counters, the latest reported

    # ---------------------------------------------------------------------------------------- input

    def add(self, batch: TimingBatch) -> None:
        with self._lock:
            acc, low = self._acc, self.low_confidence
            for rec in batch.records:
                acc.add(rec, low)
            acc.add_executions(batch.executions)
            acc.capture.update(batch.capture)
            for name, counts in batch.sources.items():
                acc.sources.setdefault(name, Counter()).update(counts)
            if batch.forward:
                self._forward = dict(batch.forward)

    def add_payload(self, payload: bytes) -> bool:
        """Parse and add a `TimingBatch` payload; a malformed one is counted and skipped, never raised."""
        try:
            batch = TimingBatch.parse(payload)
        except Exception as exc:  # any malformed payload: log and keep going
            self.bad_messages += 1
            log.warning("skipping a malformed timing message: %s", exc)
            return False
        self.add(batch)
        return True

    def set_window(self, window_s: float) -> None:
        """Change the window length; applies from the next window on."""
        if not window_s > 0:
            raise ValueError("window_s must be positive")
        with self._lock:
            self._next_window_s = float(window_s)

    # --------------------------------------------------------------------------------------- output

    def seconds_left(self) -> float:
        return max(0.0, self._end - self._clock())

    def poll(self) -> list[TelemetryWindow]:
        """Close the current window if its end has passed; returns the closed windows (0 or 1)."""
        now = self._clock()
        with self._lock:
            if now < self._end:
                return []
            acc, start, end = self._acc, self._start, self._end
            self._acc = _Accumulator()
            self.window_s = self._next_window_s
            # The next window starts where this one ended. If the loop stalled for more than a whole
            # window, this window spans the stall (its records arrived during it) and the next one
            # starts now: no burst of empty windows, and throughput stays records / real span.
            if now < end + self.window_s:
                self._start = end
            else:
                self._start = end = now
            self._end = self._start + self.window_s
            seq = self.next_seq
            self.next_seq += 1
        return [self._build(acc, seq, end - start)]

    def flush(self) -> TelemetryWindow:
        """Close the current window now, however short (used at shutdown)."""
        now = self._clock()
        with self._lock:
            acc, start = self._acc, self._start
            self._acc = _Accumulator()
            self.window_s = self._next_window_s
            self._start = now
            self._end = now + self.window_s
            seq = self.next_seq
            self.next_seq += 1
        return self._build(acc, seq, max(now - start, 1e-9))

    def _build(self, acc: _Accumulator, seq: int, window_s: float) -> TelemetryWindow:
        latency: dict[str, StageQuantiles] = {}
        for stage, hist in acc.hists.items():
            p50, p90, p99 = hist.quantiles(_QUANTILES)
            latency[stage] = StageQuantiles(p50=p50, p90=p90, p99=p99, max=hist.max)
        if acc.providers:
            self._last_provider = acc.providers.most_common(1)[0][0]
        system: dict[str, Any] = {}
        if self._system is not None:
            try:
                system = dict(self._system())
            except Exception as exc:  # system figures are best effort: never lose a window over them
                log.warning("system metrics failed: %s", exc)
        if self._forward:
            system["forward"] = dict(self._forward)
        return TelemetryWindow(
            thing=self.thing,
            seq=seq,
            window_s=round(window_s, 3),
            count=acc.count,
            errors=dict(sorted(acc.errors.items())),
            dropped=acc.dropped,
            offloaded=acc.offloaded,
            cascaded=acc.cascaded,
            throughput_rps=acc.count / window_s if window_s > 0 else 0.0,
            latency_ms=latency,
            batch={
                "executions": acc.executions,
                "inferences": acc.inferences,
                "mean_size": round(acc.inferences / acc.executions, 3) if acc.executions else 0.0,
            },
            queue_depth={
                "mean": round(acc.depth_sum / acc.count, 3) if acc.count else 0.0,
                "max": acc.depth_max,
            },
            provider=self._last_provider,
            system=system,
            timestamp=iso_utc(self._wall()),
            models=acc.model_qualities(),
            capture=dict(sorted(acc.capture.items())),
            sources={name: dict(sorted(c.items())) for name, c in sorted(acc.sources.items())},
        )
