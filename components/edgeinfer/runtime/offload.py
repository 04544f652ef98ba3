"""The edge placement policy: serve here, offload to the cloud router, or answer DEADLINE_EXCEEDED.

Pure logic, clock injected (`clock()` in seconds, `time.monotonic` by default); the runtime server
calls it through its placement seam and does all I/O itself. Nothing here sleeps or touches a socket.

Predictions
-----------
* **Local** latency of a request that joins now = what is left of the batch the engine is running,
  plus the batches ahead of it, plus its own batch, each from a service-time model `t(n) = a·n + b`
  fitted by least squares to recent batch executions (BentoML's adaptive batching model), plus the
  per-request overhead outside the engine (decode, post-processing; a running mean).
  Requests served here feed back (requests ahead at arrival → latency they really had) into a second
  fit; the prediction is the larger of the two (plus the feedback fit's 98th-percentile residual), so
  work the engine model cannot see — decode and replies sharing the engine's cores — is counted too.
  Feedback samples age out after `feedback_memory_s` (3 s): a side judged slow gets nothing to serve,
  so no new sample would ever overturn the verdict; measured in `bench offload`, one overloaded second
  at the start kept the edge idle for the rest of the run while requests were rejected.
* **Cloud** latency = network (a fit of `upload + RTT` against payload size over recent offloads, plus
  the 90th percentile of its residuals) + the cloud's own service time (90th percentile of the
  `latency_ms.total` the router reports). Before any offload has come back, `prior_cloud_ms` stands in.
  Offloads also feed back (own offloads in flight when sent → round trip): a burst queues at the
  router, so the prediction grows with what is already in flight (`prior_cloud_item_ms` each before
  there is data) and the edge never sends the cloud more than it answers in time. Once that fit has
  4 samples it alone predicts (the service times hold the router queue that a burst built up, and
  would count it again for an offload sent alone).

Decisions (`decide`)
--------------------
`offload: never` stays local; a `model` the device does not have goes to the cloud; `offload: always`
goes to the cloud while the breaker lets it; a request without a deadline stays local. Otherwise: stay
local while the local prediction meets the budget (deadline − time already spent − margin), offload
when only the cloud meets it (both at their certainty quantiles); when neither is sure to, go where
the *expected* latency still fits, and answer DEADLINE_EXCEEDED at once when not even that does.
A slow cloud is forgotten after `cloud_memory_s` without a sample, so offloads probe it again; before
that, a request that would be rejected anyway is sent as a probe when the verdict is older than
`cloud_probe_s` and nothing is in flight (it costs nothing, and keeps the verdict measured).

Two rules bound what goes to the cloud for a deadline (not `offload: always`, a missing model, or a
cascade):
* **Light load** (engine busy less than `offload_min_utilization` of the last `utilization_window_s`):
  the edge keeps everything; the cloud is for a device out of capacity, not for its Poisson bursts.
* **An adaptive limit** on offloads in flight (AIMD, like TCP's window): +1/limit for an answer back
  with headroom, ×0.8 for one that missed (once per `cloud_limit_hold_s`). A late offload costs twice —
  the router's time, then the edge's when it is served here after all — so the edge sends only what
  the router answers in time. Measured in `bench offload` at 1.5x: late cloud answers fell from 15-23 %
  of offloads to 2-7 %, the limit settling at 6-8 in flight.
The cloud's conservative prediction takes its residual quantile from samples sent with as many in
flight or more (`LinearFit.residual_quantile(at=)`): round trips spread out near the router's knee.

Wiring
------
`HybridPlacement` adapts this to the runtime's seam (`edgeinfer.runtime.placement`): it is the
server's policy and offloader, publishes offloads on `edgeinfer/{thing}/offload`, takes answers from
`edgeinfer/{thing}/offload/result`, serves late ones through the server's edge path, and gets the
engine's batch timings and every result through the seam's hooks. `create_placement` builds it from
the recipe's `placement` object for the runtime component (opt-in: `enabled: true`).

Exactly one result
------------------
Every offload is tracked (`begin_offload`) until exactly one of these happens first: the cloud answer
arrives (`on_cloud_result`), its fallback time passes (`due`), or the publish fails (`on_publish_failed`).
The first wins and removes the ticket; anything later for the same ticket is ignored. A request whose
cloud answer does not come in time is served locally (or, for a low-confidence cascade, the local
answer that was held back is published).

Circuit breaker
---------------
Consecutive cloud failures (timeouts, INTERNAL / OVERLOADED answers, failed publishes) open the
breaker — a timeout only when no answer at all came from the cloud since that offload was sent (the
cloud is then slow, not down: counted as `cloud_slow`, left to the latency model and the limit; at
1.5x the breaker had opened 7-32 times in 10 s, each time closed by the next late answer): no
offloading for `breaker_cooldown_s`; then one probe request goes out (half-open). Its success closes
the breaker; its failure opens it again with a doubled cooldown (up to a maximum).
An answer that comes after its request was served locally is not forwarded, but it proves the cloud
is up (the breaker closes) and its round trip teaches the latency model that the cloud is slow — so
a slow cloud stops being chosen by prediction, and only a dead one is kept out by the breaker.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import logging
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from edgeinfer import stats
from edgeinfer.messages import ErrorCode, Request, Result
from edgeinfer.runtime.config import camel as _camel

__all__ = [
    "Action",
    "BreakerState",
    "CircuitBreaker",
    "CloudLatencyModel",
    "CloudOutcome",
    "Decision",
    "Fallback",
    "HybridPlacement",
    "LinearFit",
    "OffloadConfig",
    "PlacementPolicy",
    "ServiceTimeModel",
    "Ticket",
    "create_placement",
]

T = TypeVar("T")

log = logging.getLogger(__name__)

# Error codes from the cloud that are the request's fault, not the cloud's: forward them as they are.
_REQUEST_FAULTS = {ErrorCode.BAD_REQUEST, ErrorCode.BAD_IMAGE, ErrorCode.TOO_LARGE}


# ------------------------------------------------------------------------------------ configuration


@dataclass
class OffloadConfig:
    """The runtime recipe's `placement` object (camelCase keys: `enabled`, `deadlineMarginMs`, …)."""

    enabled: bool = True
    deadline_margin_ms: float = 5.0  # kept free in every budget, for jitter
    cascade_threshold: float = 0.0  # >0: edge top-1 probability below this asks the cloud's model
    cloud_model: str = ""  # model name asked for on a cascade ("" = the router's default)
    cloud_timeout_ms: float = 2000.0  # wait for the cloud when the request has no deadline
    min_cloud_wait_ms: float = 50.0  # never fall back sooner than this after sending
    prior_cloud_ms: float = 60.0  # predicted cloud latency before any offload came back
    prior_cloud_item_ms: float = 10.0  # … plus this per offload already in flight (the cloud's queue)
    max_inflight: int = 256  # offloads waiting for an answer at once
    # Deadline offloads in flight are capped by an adaptive limit (AIMD, as TCP's window): +1/limit
    # for each answer back with headroom (round trip <= `cloud_limit_headroom` of the time it had),
    # ×`cloud_limit_backoff` for an answer that missed (at most once per `cloud_limit_hold_s`).
    cloud_limit_initial: float = 4.0
    cloud_limit_headroom: float = 0.75
    cloud_limit_backoff: float = 0.8
    cloud_limit_hold_s: float = 0.1
    breaker_failures: int = 3  # consecutive failures that open the breaker
    breaker_cooldown_s: float = 2.0  # first wait before a probe
    breaker_max_cooldown_s: float = 30.0
    window: int = 64  # recent samples kept by each model
    cloud_memory_s: float = 20.0  # forget the cloud's latency after this long without a new sample
    feedback_memory_s: float = 3.0  # feedback samples (local and cloud) older than this are dropped
    cloud_probe_s: float = 0.5  # cloud predicted too slow and not measured for this long: offload one
    # request that would be rejected anyway (none in flight), so a pessimistic verdict is tested again
    # Light load: below this engine utilisation (busy share of the last `utilization_window_s`, once
    # batches have been seen for `utilization_min_s`), deadline offloads stop: the cloud is for a
    # device that runs out of capacity, not for the Poisson bursts of one that has plenty (0 = off).
    offload_min_utilization: float = 0.7
    utilization_window_s: float = 2.0
    utilization_min_s: float = 0.25
    local_quantile: float = 0.98  # how sure "the edge meets the budget" must be (feedback residuals)
    cloud_quantile: float = 0.9  # how sure "the cloud meets the budget" must be
    local_models: list[str] = field(default_factory=list)  # names served here ([] = the loaded one)

    @classmethod
    def from_recipe(cls, doc: Mapping[str, Any] | None) -> tuple[OffloadConfig, list[str]]:
        """Read camelCase keys; values of the wrong type are reported and left at their default."""
        cfg = cls()
        problems: list[str] = []
        for name in cfg.__dataclass_fields__:
            key = _camel(name)
            if not doc or key not in doc:
                continue
            value, default = doc[key], getattr(cfg, name)
            if isinstance(default, bool):
                ok = isinstance(value, bool)
            elif isinstance(default, (int, float)):
                ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
                value = type(default)(value) if ok else value
            elif isinstance(default, list):
                ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
            else:
                ok = isinstance(value, str)
            if ok:
                setattr(cfg, name, value)
            else:
                problems.append(f"placement.{key} has the wrong type or range: {value!r}")
        if cfg.cascade_threshold > 1:
            problems.append("placement.cascadeThreshold must be from 0 to 1")
            cfg.cascade_threshold = 0.0
        if cfg.breaker_failures < 1:
            problems.append("placement.breakerFailures must be at least 1")
            cfg.breaker_failures = 1
        if not 0 < cfg.cloud_limit_backoff < 1:
            problems.append("placement.cloudLimitBackoff must be between 0 and 1")
            cfg.cloud_limit_backoff = cls.cloud_limit_backoff
        cfg.cloud_limit_initial = max(1.0, cfg.cloud_limit_initial)
        if cfg.offload_min_utilization > 1:
            problems.append("placement.offloadMinUtilization must be from 0 to 1")
            cfg.offload_min_utilization = cls.offload_min_utilization
        for name in ("local_quantile", "cloud_quantile"):
            if not 0.5 <= getattr(cfg, name) < 1:
                problems.append(f"placement.{_camel(name)} must be from 0.5 to below 1")
                setattr(cfg, name, getattr(cls, name))
        if cfg.window < 2:
            problems.append("placement.window must be at least 2")
            cfg.window = 2
        return cfg, problems


# ------------------------------------------------------------------------------------------- models


class LinearFit:
    """Least-squares `y = a·x + b` over the last `window` samples, clamped to a, b ≥ 0.

    With a single distinct x the slope is unknown: the fit goes through the origin (`a = mean y/x`),
    which is what `t(n) = a·n` would say for an engine with no fixed cost — a safe over-estimate for
    larger n when the real `b` is positive.
    """

    def __init__(
        self,
        window: int = 64,
        *,
        memory_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._samples: deque[tuple[float, float]] = deque(maxlen=window)
        self._times: deque[float] = deque(maxlen=window)
        self._coef: tuple[float, float] | None = None
        self.memory_s = memory_s  # samples older than this are dropped (None: kept until pushed out)
        self.clock = clock

    def __len__(self) -> int:
        self._expire()
        return len(self._samples)

    def add(self, x: float, y: float) -> None:
        if math.isfinite(x) and math.isfinite(y) and y >= 0:
            self._samples.append((float(x), float(y)))
            self._times.append(self.clock())
            self._coef = None

    def _expire(self) -> None:
        if self.memory_s is None or not self._times:
            return
        oldest = self.clock() - self.memory_s
        while self._times and self._times[0] < oldest:
            self._times.popleft()
            self._samples.popleft()
            self._coef = None

    @property
    def coef(self) -> tuple[float, float] | None:
        self._expire()
        if self._coef is None and self._samples:
            self._coef = self._fit()
        return self._coef

    def _fit(self) -> tuple[float, float]:
        xs = [s[0] for s in self._samples]
        ys = [s[1] for s in self._samples]
        n = len(xs)
        mx, my = sum(xs) / n, sum(ys) / n
        sxx = sum((x - mx) ** 2 for x in xs)
        if sxx <= 1e-12:
            return (my / mx, 0.0) if mx > 0 else (0.0, my)
        a = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
        b = my - a * mx
        if a < 0:  # noise: y does not grow with x; a flat model
            return 0.0, my
        if b < 0:  # through the origin instead
            sxy = sum(x * y for x, y in zip(xs, ys, strict=True))
            sx2 = sum(x * x for x in xs)
            return (sxy / sx2 if sx2 > 0 else 0.0), 0.0
        return a, b

    def predict(self, x: float) -> float | None:
        coef = self.coef
        if coef is None:
            return None
        return coef[0] * x + coef[1]

    def residual_quantile(self, q: float, at: float | None = None, min_samples: int = 8) -> float:
        """The `q` quantile of the residuals (at least 0). With `at`, only of samples with
        `x >= at - 1` (at least the `min_samples` with the largest x): where the spread grows with x
        (a queue near its knee), one quantile over all samples is too wide at low x and too narrow at
        high x."""
        coef = self.coef
        if coef is None:
            return 0.0
        samples: list[tuple[float, float]] = list(self._samples)
        if at is not None:
            near = [s for s in samples if s[0] >= at - 1]
            if len(near) < min_samples:
                near = sorted(samples, key=lambda s: s[0])[-min_samples:]
            samples = near
        res = sorted(y - (coef[0] * x + coef[1]) for x, y in samples)
        return max(0.0, stats.quantile(res, q, 0.0))


def _round3(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


class ServiceTimeModel:
    """The engine's batch execution time `t(n) = a·n + b` in ms, from recent executions."""

    def __init__(self, window: int = 64, prior_ms_per_item: float = 10.0) -> None:
        self.fit = LinearFit(window)
        self.prior_ms_per_item = prior_ms_per_item

    def observe(self, batch_size: int, ms: float) -> None:
        if batch_size > 0:
            self.fit.add(batch_size, ms)

    def predict(self, batch_size: int) -> float:
        if batch_size <= 0:
            return 0.0
        value = self.fit.predict(batch_size)
        return self.prior_ms_per_item * batch_size if value is None else value


class CloudLatencyModel:
    """End-to-end cloud latency in ms: network (upload + RTT, fitted on payload size) + cloud service."""

    def __init__(self, window: int = 64, prior_ms: float = 60.0, quantile: float = 0.9) -> None:
        self.network = LinearFit(window)
        self.service: deque[float] = deque(maxlen=window)
        self.prior_ms = prior_ms
        self.quantile = quantile

    def observe(self, payload_bytes: int, round_trip_ms: float, cloud_service_ms: float) -> None:
        service = max(0.0, min(cloud_service_ms, round_trip_ms))
        self.network.add(payload_bytes, max(0.0, round_trip_ms - service))
        self.service.append(service)

    @property
    def samples(self) -> int:
        return len(self.service)

    def predict(self, payload_bytes: int, quantile: float | None = None) -> float:
        """`quantile` of the residuals and service times (default: the model's, 0.9)."""
        q = self.quantile if quantile is None else quantile
        net = self.network.predict(payload_bytes)
        if net is None:
            return self.prior_ms
        net += self.network.residual_quantile(q)
        return net + stats.quantile(self.service, q, 0.0)


# ------------------------------------------------------------------------------------------ breaker


class BreakerState(str, enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    def __init__(
        self,
        failures: int = 3,
        cooldown_s: float = 2.0,
        max_cooldown_s: float = 30.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.threshold = failures
        self.base_cooldown_s = cooldown_s
        self.max_cooldown_s = max_cooldown_s
        self.clock = clock
        self.state = BreakerState.CLOSED
        self.consecutive_failures = 0
        self.cooldown_s = cooldown_s
        self.opened_at = 0.0
        self.opened_count = 0
        self._probe_out = False

    def available(self) -> bool:
        """Would `allow()` say yes? (Does not take the half-open probe.)"""
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.OPEN:
            return self.clock() - self.opened_at >= self.cooldown_s
        return not self._probe_out

    def allow(self) -> bool:
        """May a request go to the cloud now? In half-open state exactly one probe is let through."""
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.OPEN:
            if self.clock() - self.opened_at < self.cooldown_s:
                return False
            self.state = BreakerState.HALF_OPEN
            self._probe_out = False
        if self._probe_out:
            return False
        self._probe_out = True
        return True

    def record_success(self) -> None:
        self.consecutive_failures = 0
        if self.state is not BreakerState.CLOSED:
            self.state = BreakerState.CLOSED
            self.cooldown_s = self.base_cooldown_s
            self._probe_out = False

    def record_failure(self) -> None:
        self.consecutive_failures += 1
        if self.state is BreakerState.HALF_OPEN:
            self.cooldown_s = min(self.max_cooldown_s, self.cooldown_s * 2)
            self._open()
        elif self.state is BreakerState.CLOSED and self.consecutive_failures >= self.threshold:
            self._open()

    def _open(self) -> None:
        self.state = BreakerState.OPEN
        self.opened_at = self.clock()
        self.opened_count += 1
        self._probe_out = False


# ----------------------------------------------------------------------------------------- decisions


class Action(str, enum.Enum):
    LOCAL = "local"
    OFFLOAD = "offload"
    REJECT = "reject"  # answer with `Decision.code` now


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    local_ms: float | None = None  # predictions, for logs and tests
    cloud_ms: float | None = None
    budget_ms: float | None = None
    code: ErrorCode | None = None  # set for REJECT

    @property
    def message(self) -> str:
        return self.reason


@dataclass
class Ticket(Generic[T]):
    """One offload in flight. `wire_id` is the id sent to the cloud (unique among those in flight)."""

    wire_id: str
    request_id: str
    item: T
    sent_at: float
    fallback_at: float
    payload_bytes: int
    held: Result | None = None  # a cascade's local answer, published if the cloud does not answer
    probe: bool = False
    ahead: int = 0  # this device's offloads already in flight when it was sent


@dataclass
class CloudOutcome(Generic[T]):
    """What to do with a cloud answer: publish `result` (already carrying the client's request id),
    or, when `serve_locally`, serve `ticket.item` locally instead (the cloud failed)."""

    ticket: Ticket[T]
    result: Result | None
    serve_locally: bool = False


@dataclass
class Fallback(Generic[T]):
    """An offload whose answer did not come in time: publish `ticket.held` or serve it locally."""

    ticket: Ticket[T]
    reason: str


class PlacementPolicy(Generic[T]):
    """Thread-safe; one per runtime. `T` is whatever the server wants back on a fallback."""

    def __init__(
        self,
        config: OffloadConfig | None = None,
        *,
        max_batch_size: int = 8,
        local_models: Iterable[str] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config or OffloadConfig()
        self.max_batch_size = max_batch_size
        self.local_models = set(self.config.local_models) | set(local_models)
        self.clock = clock
        self.service = ServiceTimeModel(self.config.window)
        self.cloud = CloudLatencyModel(
            self.config.window, self.config.prior_cloud_ms, self.config.cloud_quantile
        )
        self._cloud_seen = 0.0  # clock of the last cloud latency sample
        self._cloud_answered = -math.inf  # clock of the last answer from the cloud (any, even late)
        self._busy: deque[tuple[float, float]] = deque(maxlen=4096)  # engine batches (start, end)
        self._batch_start: float | None = None
        self._observed_since: float | None = None  # first batch after a gap longer than the window
        self.cloud_limit = self.config.cloud_limit_initial  # deadline offloads in flight (AIMD)
        self._limit_cut_at = -math.inf
        self._cloud_probed = -math.inf  # clock of the last probe offload (see `cloud_probe_s`)
        # Feedback: (own offloads in flight when sent → round trip it took). A burst of offloads
        # queues at the router; this is what keeps the edge from sending more than it can absorb.
        self.cloud_fit = self._feedback_fit(128)
        self.breaker = CircuitBreaker(
            self.config.breaker_failures,
            self.config.breaker_cooldown_s,
            self.config.breaker_max_cooldown_s,
            clock=clock,
        )
        self._overhead: deque[float] = deque(maxlen=self.config.window)
        # Feedback: (requests ahead at arrival, latency it really had) of requests served here. It
        # catches what the engine model cannot see: decode and reply work sharing the engine's cores.
        self.local_fit = self._feedback_fit(256)
        self._lock = threading.RLock()
        self._tickets: dict[str, Ticket[T]] = {}
        # Offloads already served locally, kept a while: a late answer still measures the cloud.
        self._expired: OrderedDict[str, Ticket[T]] = OrderedDict()
        self._busy_until: float | None = None  # predicted end of the batch now running
        self._seq = itertools.count(1)
        self.counters: dict[str, int] = {
            "local": 0,
            "offloaded": 0,
            "rejected": 0,
            "cascaded": 0,
            "cloud_ok": 0,
            "cloud_failed": 0,
            "fallbacks": 0,
            "late_cloud_answers": 0,
            "cloud_slow": 0,  # fallbacks while the cloud kept answering (not breaker failures)
        }

    def _feedback_fit(self, window: int) -> LinearFit:
        """A feedback fit whose samples age out after `feedback_memory_s`: a side that looked slow
        gets no new samples (nothing is sent there), so an old verdict must not outlive its cause."""
        memory = self.config.feedback_memory_s or None
        return LinearFit(max(self.config.window, window), memory_s=memory, clock=self.clock)

    # --------------------------------------------------------------------------- engine feedback

    def batch_started(self, batch_size: int, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        with self._lock:
            self._busy_until = now + self.service.predict(batch_size) / 1000.0
            self._batch_start = now
            last_end = self._busy[-1][1] if self._busy else -math.inf
            if self._observed_since is None or now - last_end > self.config.utilization_window_s:
                self._observed_since = now

    def batch_finished(self, batch_size: int, compute_ms: float, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        with self._lock:
            self.service.observe(batch_size, compute_ms)
            self._busy_until = None
            if self._batch_start is not None:
                self._busy.append((self._batch_start, now))
                self._batch_start = None

    def utilization(self, now: float | None = None) -> float | None:
        """Share of the last `utilization_window_s` the engine spent running batches (0 to 1).

        None while it is unknown: no batch seen yet, or the first batch after a gap longer than the
        window started less than `utilization_min_s` ago (an engine that was idle, or whose hooks were
        not wired: the share is taken over the time batches have been seen, not the whole window)."""
        now = self.clock() if now is None else now
        window = self.config.utilization_window_s
        with self._lock:
            if self._observed_since is None or window <= 0:
                return None
            last_end = self._busy[-1][1] if self._busy else -math.inf
            if self._batch_start is None and now - last_end > window:
                return 0.0  # idle for a whole window
            seen = min(window, now - self._observed_since)
            if seen < self.config.utilization_min_s:
                return None
            since = now - seen
            while self._busy and self._busy[0][1] <= since:
                self._busy.popleft()
            busy = sum(min(end, now) - max(start, since) for start, end in self._busy if end > since)
            if self._batch_start is not None:
                busy += now - max(self._batch_start, since)
            return max(0.0, min(1.0, busy / seen))

    def observe_local(self, ahead: int, latency_ms: float) -> None:
        """A request served here had `ahead` requests in front of it and took `latency_ms` in all."""
        if ahead >= 0 and math.isfinite(latency_ms) and latency_ms >= 0:
            with self._lock:
                self.local_fit.add(ahead, latency_ms)

    def observe_overhead(self, ms: float) -> None:
        """Per-request time outside the engine (decode + post-process) of a request served here."""
        if math.isfinite(ms) and ms >= 0:
            with self._lock:
                self._overhead.append(ms)

    # ------------------------------------------------------------------------------- predictions

    def predict_local_ms(self, ahead: int, now: float | None = None, *, conservative: bool = True) -> float:
        """Latency of a request that joins now behind `ahead` requests (queued or being decoded).

        `conservative` adds the feedback fit's `local_quantile` residual (the one that decides whether
        the edge *meets* a budget); without it, the expected latency (used to pick the better place
        when neither is sure to meet it)."""
        now = self.clock() if now is None else now
        with self._lock:
            busy = 0.0 if self._busy_until is None else max(0.0, (self._busy_until - now) * 1000.0)
            size = max(1, self.max_batch_size)
            full, rest = divmod(max(0, ahead), size)
            compute = full * self.service.predict(size) + self.service.predict(rest + 1)
            overhead = stats.quantile(self._overhead, 0.9, 0.0) if self._overhead else 0.0
            model = busy + compute + overhead
            if len(self.local_fit) >= 16:
                seen = self.local_fit.predict(max(0, ahead))
                if seen is not None:
                    q = self.config.local_quantile
                    spread = self.local_fit.residual_quantile(q) if conservative else 0.0
                    return max(model, seen + spread)
            # No feedback yet (a start, or an idle spell longer than `feedback_memory_s`): count the
            # decode and reply work of each request ahead too. On a small device it shares the
            # engine's CPU; bench offload saw requests admitted with 7-12 ahead at predicted 75-94 ms
            # take 111-133 ms, at the start of every run, before 16 answers had come back.
            per_request = stats.quantile(self._overhead, 0.5, 0.0) if self._overhead else 0.0
            return model + max(0, ahead) * per_request

    def predict_cloud_ms(self, payload_bytes: int, quantile: float | None = None) -> float:
        """Round trip of an offload sent now, behind this device's offloads already in flight."""
        with self._lock:
            q = self.config.cloud_quantile if quantile is None else quantile
            ahead = len(self._tickets)
            base = self.cloud.predict(payload_bytes, q)
            if len(self.cloud_fit) >= 4:
                # Measured round trips against own offloads in flight: this already holds the queueing
                # that a burst causes at the router, which `base` (service times that include the
                # router's queue, at any depth) would count again for a request sent alone.
                seen = self.cloud_fit.predict(ahead)
                if seen is not None:
                    # The spread of round trips sent with as many in flight (or more): a router near
                    # its capacity turns a few more in flight into many late answers (bench offload:
                    # never late with <= 7 in flight, 20-50 % late with 8-11, while one residual
                    # quantile over all samples predicted 92-103 ms for them).
                    return seen + self.cloud_fit.residual_quantile(q, at=ahead)
            return base + ahead * self.config.prior_cloud_item_ms

    # --------------------------------------------------------------------------------- decisions

    def decide(
        self,
        request: Request,
        *,
        ahead: int,
        payload_bytes: int,
        arrived: float | None = None,
        now: float | None = None,
    ) -> Decision:
        """Where to serve `request`, given `ahead` requests in front of it on the device.

        `arrived` is when the runtime received it (the deadline counts from there); defaults to now.
        A returned OFFLOAD has already taken the breaker's probe slot: call `begin_offload` next.
        """
        now = self.clock() if now is None else now
        arrived = now if arrived is None else arrived
        left = None if request.deadline_ms is None else request.deadline_ms - (now - arrived) * 1000.0
        return self.decide_left(
            request, ahead=ahead, payload_bytes=payload_bytes, deadline_left_ms=left, now=now
        )

    def decide_left(
        self,
        request: Request,
        *,
        ahead: int,
        payload_bytes: int,
        deadline_left_ms: float | None,
        now: float | None = None,
    ) -> Decision:
        """`decide` with the time left given directly (None: no deadline), as the runtime knows it."""
        now = self.clock() if now is None else now
        cfg = self.config
        with self._lock:
            self._forget_stale_cloud(now)
            local_ms = self.predict_local_ms(ahead, now)
            cloud_ms = self.predict_cloud_ms(payload_bytes)
            budget = None
            if deadline_left_ms is not None:
                budget = deadline_left_ms - cfg.deadline_margin_ms

            def result(action: Action, reason: str, code: ErrorCode | None = None) -> Decision:
                key = {"local": "local", "offload": "offloaded", "reject": "rejected"}[action.value]
                self.counters[key] += 1
                return Decision(action, reason, local_ms, cloud_ms, budget, code)

            missing_model = request.model is not None and request.model not in self.local_models
            if request.offload == "never":
                if missing_model:
                    return result(
                        Action.REJECT,
                        f"model {request.model!r} is not on this device and offload is 'never'",
                        ErrorCode.BAD_REQUEST,
                    )
                if budget is not None and local_ms > budget:
                    return result(
                        Action.REJECT,
                        f"predicted {local_ms:.0f} ms here, over the {budget:.0f} ms left",
                        ErrorCode.DEADLINE_EXCEEDED,
                    )
                return result(Action.LOCAL, "offload is 'never'")
            if missing_model:
                if self._cloud_ready() and self.breaker.allow():
                    return result(Action.OFFLOAD, f"model {request.model!r} is not on this device")
                return result(
                    Action.REJECT,
                    f"model {request.model!r} is not on this device and the cloud is unavailable",
                    ErrorCode.OVERLOADED,
                )
            if request.offload == "always":
                if self._cloud_ready() and self.breaker.allow():
                    return result(Action.OFFLOAD, "offload is 'always'")
                return result(Action.LOCAL, "offload is 'always' but the cloud is unavailable")
            if budget is None:
                return result(Action.LOCAL, "no deadline")
            if local_ms <= budget:
                return result(Action.LOCAL, f"local {local_ms:.0f} ms meets the {budget:.0f} ms budget")
            local_exp = self.predict_local_ms(ahead, now, conservative=False)
            utilization = self.utilization(now)
            if utilization is not None and utilization < cfg.offload_min_utilization:
                # Light load: the device has capacity to spare and keeps its own work; what is in
                # doubt is a Poisson burst or a jitter spike, over in a moment (bench offload at 0.5x:
                # 0.5-3 % offloaded without this rule, for a share within the deadline of 99-100 %
                # either way).
                return result(
                    Action.LOCAL,
                    f"light load ({100 * utilization:.0f} % busy): local expected {local_exp:.0f} ms"
                    f" of {budget:.0f} ms",
                )
            # Deadline offloads also wait for room under the adaptive limit: more in flight than the
            # router answers in time only turns into late answers, each served here again (late).
            ready = self._cloud_ready() and len(self._tickets) < self.cloud_limit
            cloud_exp = self.predict_cloud_ms(payload_bytes, 0.5) if ready else math.inf
            # Only the cloud is sure to meet it, and it is also expected to be faster. (Without the
            # second condition, a jitter spike in the edge's feedback residuals offloads requests at
            # light load that the edge serves in a fraction of the cloud's round trip: bench offload
            # saw 1 % offloaded at 0.5x.)
            if ready and cloud_ms <= budget and cloud_exp < local_exp and self.breaker.allow():
                return result(
                    Action.OFFLOAD, f"only the cloud ({cloud_ms:.0f} ms) meets the {budget:.0f} ms budget"
                )
            # Neither is sure to (quantiles): go where the *expected* latency still fits, if any.
            if cloud_exp < local_exp and cloud_exp <= budget and self.breaker.allow():
                return result(Action.OFFLOAD, f"cloud expected {cloud_exp:.0f} ms of {budget:.0f} ms left")
            if local_exp <= budget:
                return result(Action.LOCAL, f"local expected {local_exp:.0f} ms of {budget:.0f} ms left")
            why = f"cloud {cloud_exp:.0f} ms" if ready else "no room in the cloud"
            if (
                ready
                and cfg.cloud_probe_s > 0
                and self.cloud.samples  # a measured verdict (the prior alone is never this slow)
                and budget >= cfg.min_cloud_wait_ms  # time enough for the router to try it
                and not self._tickets
                and now - max(self._cloud_seen, self._cloud_probed) >= cfg.cloud_probe_s
                and self.breaker.allow()
            ):
                # It would fail here anyway: send it, so that a prediction learnt from a burst or a
                # cold router is measured again instead of keeping the cloud out until it is forgotten.
                self._cloud_probed = now
                return result(Action.OFFLOAD, f"probe: neither meets the {budget:.0f} ms left ({why})")
            return result(
                Action.REJECT,
                f"neither meets the {budget:.0f} ms left: local {local_exp:.0f} ms, {why} (expected)",
                ErrorCode.DEADLINE_EXCEEDED,
            )

    def _observe_cloud(self, ticket: Ticket[T], rtt_ms: float, service_ms: float, now: float) -> None:
        self._cloud_answered = now
        self._forget_stale_cloud(now)
        self.cloud.observe(ticket.payload_bytes, rtt_ms, service_ms)
        self.cloud_fit.add(ticket.ahead, rtt_ms)
        self._cloud_seen = now

    def _adapt_limit(self, ticket: Ticket[T], now: float, *, missed: bool = False) -> None:
        """AIMD on the deadline-offload limit from one outcome (see `OffloadConfig.cloud_limit_*`)."""
        cfg = self.config
        if missed:
            if now - self._limit_cut_at >= cfg.cloud_limit_hold_s:  # one cut per congestion episode
                self.cloud_limit = max(1.0, self.cloud_limit * cfg.cloud_limit_backoff)
                self._limit_cut_at = now
            return
        had_s = ticket.fallback_at - ticket.sent_at
        if (
            now - ticket.sent_at
        ) <= cfg.cloud_limit_headroom * had_s and ticket.ahead + 1 >= self.cloud_limit - 1:
            # Room to spare, and the limit was (nearly) in use: one more in flight per limit's worth.
            self.cloud_limit = min(float(cfg.max_inflight), self.cloud_limit + 1.0 / self.cloud_limit)

    def _forget_stale_cloud(self, now: float) -> None:
        """Once the cloud has looked too slow, nothing is offloaded and nothing new is measured: after
        `cloud_memory_s` without a sample, start again from the prior (which makes offloads probe it)."""
        if self.cloud.samples and now - self._cloud_seen > self.config.cloud_memory_s:
            self.cloud = CloudLatencyModel(
                self.config.window, self.config.prior_cloud_ms, self.config.cloud_quantile
            )
            self.cloud_fit = self._feedback_fit(128)

    def _cloud_ready(self) -> bool:
        return (
            self.config.enabled and len(self._tickets) < self.config.max_inflight and self.breaker.available()
        )

    def wants_cascade(
        self,
        request: Request,
        top1: float,
        *,
        payload_bytes: int,
        arrived: float | None = None,
        now: float | None = None,
    ) -> bool:
        """After a local answer: ask the cloud's heavier model when the edge is unsure and time allows.

        True has taken the breaker's probe slot: call `begin_offload(..., held=local_result)` next.
        """
        cfg = self.config
        if cfg.cascade_threshold <= 0 or top1 >= cfg.cascade_threshold or request.offload == "never":
            return False
        now = self.clock() if now is None else now
        arrived = now if arrived is None else arrived
        with self._lock:
            if request.deadline_ms is not None:
                budget = request.deadline_ms - (now - arrived) * 1000.0 - cfg.deadline_margin_ms
                if self.predict_cloud_ms(payload_bytes) > budget:
                    return False
            if not (self._cloud_ready() and self.breaker.allow()):
                return False
            self.counters["cascaded"] += 1
            return True

    # ---------------------------------------------------------------------------- offload tickets

    def begin_offload(
        self,
        request: Request,
        item: T,
        *,
        payload_bytes: int,
        arrived: float | None = None,
        now: float | None = None,
        held: Result | None = None,
    ) -> Ticket[T]:
        """Track an offload about to be published; send it with `ticket.wire_id` as its id."""
        now = self.clock() if now is None else now
        arrived = now if arrived is None else arrived
        cfg = self.config
        with self._lock:
            cloud_ms = self.predict_cloud_ms(payload_bytes)
            if request.deadline_ms is not None:
                deadline = arrived + request.deadline_ms / 1000.0
                wait = max(cfg.min_cloud_wait_ms / 1000.0, 2 * cloud_ms / 1000.0)
                fallback_at = min(deadline, now + wait)
                fallback_at = max(fallback_at, now + cfg.min_cloud_wait_ms / 1000.0)
            else:
                fallback_at = now + cfg.cloud_timeout_ms / 1000.0
            wire_id = request.id
            if wire_id in self._tickets:
                wire_id = f"{request.id}~{next(self._seq)}"
            ticket = Ticket(
                wire_id=wire_id,
                request_id=request.id,
                item=item,
                sent_at=now,
                fallback_at=fallback_at,
                payload_bytes=payload_bytes,
                held=held,
                probe=self.breaker.state is BreakerState.HALF_OPEN,
                ahead=len(self._tickets),
            )
            self._tickets[wire_id] = ticket
            return ticket

    def deadline_left_ms(self, request: Request, arrived: float, now: float | None = None) -> float | None:
        """What goes into `origin.deadline_left_ms`."""
        if request.deadline_ms is None:
            return None
        now = self.clock() if now is None else now
        return request.deadline_ms - (now - arrived) * 1000.0

    def on_publish_failed(self, ticket: Ticket[T]) -> bool:
        """The offload could not be sent. True: the ticket was still open — serve it locally now."""
        with self._lock:
            if self._tickets.pop(ticket.wire_id, None) is None:
                return False
            self._failure()
            self.counters["fallbacks"] += 1
            return True

    def on_cloud_result(self, result: Result, now: float | None = None) -> CloudOutcome[T] | None:
        """A result arrived on `edgeinfer/{thing}/offload/result`. None: unknown, duplicate or too late."""
        now = self.clock() if now is None else now
        if result.id is None:
            return None
        with self._lock:
            ticket = self._tickets.pop(result.id, None)
            if ticket is None:
                late = self._expired.pop(result.id, None)
                if late is not None:
                    self.counters["late_cloud_answers"] += 1
                    if result.status == "ok":
                        # The cloud is up, only slow: let the latency model learn it, and let the
                        # breaker (which is about failures) close again.
                        rtt_ms = (now - late.sent_at) * 1000.0
                        self._observe_cloud(late, rtt_ms, result.latency_ms.total, now)
                        self.breaker.record_success()
                return None
            result.id = ticket.request_id
            self._cloud_answered = now
            code = result.error.code if result.error is not None else None
            if result.status == "ok":
                self.breaker.record_success()
                self.counters["cloud_ok"] += 1
                rtt_ms = (now - ticket.sent_at) * 1000.0
                self._observe_cloud(ticket, rtt_ms, result.latency_ms.total, now)
                self._adapt_limit(ticket, now)
                return CloudOutcome(ticket, result)
            if code in _REQUEST_FAULTS:
                self.breaker.record_success()  # the cloud works; the request was bad
                return CloudOutcome(ticket, result)
            # INTERNAL, OVERLOADED, DEADLINE_EXCEEDED: the cloud did not serve it; serve it here.
            self._failure()
            self.counters["fallbacks"] += 1
            if ticket.held is not None:
                return CloudOutcome(ticket, ticket.held)
            return CloudOutcome(ticket, None, serve_locally=True)

    def due(self, now: float | None = None) -> list[Fallback[T]]:
        """Offloads whose answer did not come by their fallback time (each returned exactly once)."""
        now = self.clock() if now is None else now
        with self._lock:
            expired = [t for t in self._tickets.values() if t.fallback_at <= now]
            for ticket in expired:
                del self._tickets[ticket.wire_id]
                if self._cloud_answered > ticket.sent_at:
                    # The cloud has answered since this was sent: it is up, only slow. The latency
                    # model keeps slow offloads out; the breaker is for a cloud that is down (bench
                    # offload at 1.5x: 7-32 openings in 10 s, each closed by the next late answer,
                    # with offloading stopped in between).
                    self.counters["cloud_slow"] += 1
                else:
                    self._failure()
                self._adapt_limit(ticket, now, missed=True)
                self.counters["fallbacks"] += 1
                self._expired[ticket.wire_id] = ticket
                while len(self._expired) > 1024:
                    self._expired.popitem(last=False)
            return [Fallback(t, "no cloud answer in time") for t in expired]

    def next_due(self) -> float | None:
        """The earliest fallback time in flight (clock seconds), to arm a timer."""
        with self._lock:
            return min((t.fallback_at for t in self._tickets.values()), default=None)

    def drain(self) -> list[Ticket[T]]:
        """On shutdown: every open ticket, removed, so the caller can still answer each one."""
        with self._lock:
            out = list(self._tickets.values())
            self._tickets.clear()
            return out

    @property
    def inflight(self) -> int:
        return len(self._tickets)

    def _failure(self) -> None:
        self.breaker.record_failure()
        self.counters["cloud_failed"] += 1

    def snapshot(self) -> dict[str, Any]:
        """For logs and telemetry: predictions' inputs, breaker state, counters."""
        with self._lock:
            coef = self.service.fit.coef
            return {
                "breaker": self.breaker.state.value,
                "breaker_opened": self.breaker.opened_count,
                "inflight": len(self._tickets),
                "utilization": _round3(self.utilization()),
                "cloud_limit": round(self.cloud_limit, 2),
                "service_ms": {"a": coef[0], "b": coef[1]} if coef else None,
                "cloud_ms_p90": self.predict_cloud_ms(0) if self.cloud.samples else None,
                "cloud_service_ms_p50_p90": [
                    round(stats.quantile(self.cloud.service, q, 0.0), 2) for q in (0.5, 0.9)
                ]
                if self.cloud.samples
                else None,
                **self.counters,
            }


# ------------------------------------------------------------------------- the runtime's seam adapter


@dataclass
class _Pending:
    reply: Callable[[Result], None]
    local: Callable[[], None] | None


class HybridPlacement:
    """Fills the runtime's placement seam (`edgeinfer.runtime.placement`) with `PlacementPolicy`.

    It is both the seam's `PlacementPolicy` (`decide`) and its `Offloader` (`offload`): wire it with
    `server.set_placement(hybrid, hybrid)` after `hybrid.start()`. Offloads go out on
    `edgeinfer/{thing}/offload` (QoS 1, to IoT Core through `bus` with `target`); answers come back on
    `edgeinfer/{thing}/offload/result`. A timer thread serves the offloads whose answer is late: locally
    through `ctx.local` (the server's edge pipeline), or with an error when the server gave no way to.
    The engine hooks `on_batch_start` / `on_batch_end` feed the service-time model.
    """

    def __init__(
        self,
        bus: Any,
        thing: str,
        policy: PlacementPolicy[_Pending] | None = None,
        *,
        target: str = "iot",
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.bus = bus
        self.thing = thing
        self.policy: PlacementPolicy[_Pending] = policy or PlacementPolicy(clock=clock)
        self.target = target
        self.clock = clock
        self.wall = wall
        self._sub: Any = None
        self._wake = threading.Condition()
        self._stopping = threading.Event()
        self._timer: threading.Thread | None = None
        self._ahead: dict[str, int] = {}  # request id -> requests ahead when it was kept here
        self._ahead_lock = threading.Lock()

    @classmethod
    def from_config(
        cls,
        bus: Any,
        thing: str,
        placement: Mapping[str, Any] | None,
        *,
        max_batch_size: int,
        local_models: Iterable[str],
        clock: Callable[[], float] = time.monotonic,
    ) -> tuple[HybridPlacement, list[str]]:
        """From the runtime recipe's `placement` object (see `OffloadConfig`). Returns the problems too."""
        cfg, problems = OffloadConfig.from_recipe(placement)
        policy: PlacementPolicy[_Pending] = PlacementPolicy(
            cfg, max_batch_size=max_batch_size, local_models=local_models, clock=clock
        )
        return cls(bus, thing, policy, clock=clock), problems

    # ----------------------------------------------------------------------------------- lifecycle

    def start(self) -> HybridPlacement:
        from edgeinfer.messages import offload_result_topic

        self._sub = self.bus.subscribe(
            offload_result_topic(self.thing), self._on_result, target=self.target, qos=1
        )
        self._timer = threading.Thread(target=self._timer_loop, name="edgeinfer-offload-timer", daemon=True)
        self._timer.start()
        return self

    def stop(self) -> None:
        """Stop listening; every offload still open is served locally (or answered) now."""
        if self._sub is not None:
            try:
                self._sub.close()
            except Exception:
                log.debug("closing the offload subscription failed", exc_info=True)
            self._sub = None
        with self._wake:
            self._stopping.set()
            self._wake.notify_all()
        if self._timer is not None:
            self._timer.join(5)
        for ticket in self.policy.drain():
            self._fallback(ticket, "the runtime is stopping")

    # ------------------------------------------------------------------------------- seam: decide

    def decide(self, request: Request, ctx: Any) -> Any:
        from edgeinfer.runtime.placement import EDGE
        from edgeinfer.runtime.placement import Decision as SeamDecision

        if request.image is None:  # image_path requests name a local file: never offloaded
            if request.model is not None and request.model not in self.policy.local_models:
                return SeamDecision("reject", ErrorCode.BAD_REQUEST, "image_path requests are not offloaded")
            return EDGE
        decision = self.policy.decide_left(
            request,
            ahead=int(ctx.outstanding),
            payload_bytes=len(request.image),
            deadline_left_ms=ctx.deadline_left_ms,
        )
        if decision.action is Action.LOCAL:
            with self._ahead_lock:
                if len(self._ahead) < 10_000:
                    self._ahead[request.id] = int(ctx.outstanding)
            return EDGE
        if decision.action is Action.OFFLOAD:
            return SeamDecision("cloud", None, decision.reason)
        return SeamDecision("reject", decision.code, decision.reason)

    # ------------------------------------------------------------------------------ seam: offload

    def offload(self, request: Request, ctx: Any, reply: Callable[[Result], None]) -> None:
        now = self.clock()
        left = ctx.deadline_left_ms
        arrived = now
        shadow = request
        if left is not None:  # the policy counts the deadline from arrival: rebuild it from what is left
            shadow = dataclasses.replace(request, deadline_ms=left)
        pending = _Pending(reply, getattr(ctx, "local", None))
        ticket = self.policy.begin_offload(
            shadow, pending, payload_bytes=len(request.image or b""), arrived=arrived, now=now
        )
        self._send(ticket, dataclasses.replace(request, id=ticket.wire_id, reply_to=None), left, "offload")

    # ------------------------------------------------------------------------------ seam: cascade

    def cascade(self, request: Request, result: Result, reply: Callable[[Result], None]) -> bool:
        """After an edge answer: when its top-1 probability is under `cascadeThreshold`, hold it and ask
        the cloud's (heavier) model. True: taken over — `reply` gets exactly one of the two answers."""
        if request.image is None or result.status != "ok" or not result.predictions:
            return False
        top1 = max(p.score for p in result.predictions)
        if not self.policy.wants_cascade(request, top1, payload_bytes=len(request.image)):
            return False
        now = self.clock()
        spent_ms = result.latency_ms.queue + result.latency_ms.decode + result.latency_ms.inference
        left = None if request.deadline_ms is None else request.deadline_ms - spent_ms
        shadow = request if left is None else dataclasses.replace(request, deadline_ms=max(0.0, left))
        ticket = self.policy.begin_offload(
            shadow, _Pending(reply, None), payload_bytes=len(request.image), now=now, held=result
        )
        wire = dataclasses.replace(
            request, id=ticket.wire_id, reply_to=None, model=self.policy.config.cloud_model or None
        )
        self._send(ticket, wire, left, "cascade")
        return True

    def _send(self, ticket: Ticket[_Pending], wire: Request, left: float | None, what: str) -> None:
        """Publish an offload without waiting for the nucleus (`offload` runs on the transport's
        thread: inline handlers); a publish that fails now or is refused later is served as the
        policy says."""
        from edgeinfer.messages import OffloadOrigin, OffloadRequest, iso_utc, offload_topic
        from edgeinfer.transport import TransportError

        payload = OffloadRequest(wire, OffloadOrigin(self.thing, left, iso_utc(self.wall()))).to_json()
        try:
            self.bus.publish_nowait(
                offload_topic(self.thing),
                payload,
                target=self.target,
                qos=1,
                on_done=lambda exc: self._publish_failed(ticket, what, exc),
            )
        except TransportError as exc:
            self._publish_failed(ticket, what, exc)
            return
        with self._wake:
            self._wake.notify_all()

    # ------------------------------------------------------------------------------ engine hooks

    def on_batch_start(self, batch_size: int) -> None:
        self.policy.batch_started(batch_size)

    def on_batch_end(self, batch_size: int, compute_ms: float) -> None:
        self.policy.batch_finished(batch_size, compute_ms)

    def on_result(self, request_id: str | None, result: Result) -> None:
        """Every result the server publishes: edge answers feed the local latency feedback."""
        with self._ahead_lock:
            ahead = self._ahead.pop(request_id or "", None)
        if result.status == "ok" and result.placement == "edge":
            lat = result.latency_ms
            self.policy.observe_overhead(lat.decode + lat.postprocess)
            if ahead is not None:
                self.policy.observe_local(ahead, lat.total)

    # ---------------------------------------------------------------------------------- internals

    def _on_result(self, message: Any) -> None:
        try:
            result = Result.parse(message.payload)
        except Exception:
            log.warning("ignoring an unreadable offload result on %s", message.topic)
            return
        outcome = self.policy.on_cloud_result(result)
        if outcome is None:
            return
        if outcome.serve_locally or outcome.result is None:
            self._fallback(outcome.ticket, "the cloud could not serve it")
        else:
            outcome.ticket.item.reply(outcome.result)

    def _publish_failed(self, ticket: Ticket[_Pending], what: str, exc: Exception | None) -> None:
        """The offload never left (or the nucleus refused it): serve it as the policy says."""
        if exc is not None and self.policy.on_publish_failed(ticket):
            self._fallback(ticket, f"{what} publish failed: {exc}")

    def _fallback(self, ticket: Ticket[_Pending], reason: str) -> None:
        pending = ticket.item
        if ticket.held is not None:
            pending.reply(ticket.held)
            return
        if pending.local is not None:
            log.debug("serving %s locally: %s", ticket.request_id, reason)
            pending.local()
            return
        from edgeinfer.messages import error_result, iso_utc

        pending.reply(
            error_result(
                ticket.request_id,
                ErrorCode.DEADLINE_EXCEEDED,
                f"no cloud answer in time ({reason})",
                timestamp=iso_utc(self.wall()),
                placement="cloud",
            )
        )

    def _timer_loop(self) -> None:
        while True:
            with self._wake:
                if self._stopping.is_set():
                    return
                due_at = self.policy.next_due()
                wait = 0.5 if due_at is None else max(0.0, due_at - self.clock())
                if wait > 0:
                    self._wake.wait(min(wait, 0.5))
            if self._stopping.is_set():
                return
            for fallback in self.policy.due():
                try:
                    self._fallback(fallback.ticket, fallback.reason)
                except Exception:
                    log.exception("falling back on %s failed", fallback.ticket.request_id)


def create_placement(bus: Any, cfg: Any, thing: str, *, engine: Any = None) -> tuple[Any, Any]:
    """The runtime component's hook (`edgeinfer.runtime.__main__`): `(policy, offloader)` for the
    server's placement seam from the recipe's `placement` object.

    Offloading is opt-in (`placement.enabled: true`): without a router to answer, every offload would
    only wait for its fallback. Disabled, the server keeps its edge-only default.
    """
    from edgeinfer.runtime.placement import EdgeOnly

    doc = getattr(cfg, "placement", None) or {}
    if not doc.get("enabled", False):
        return EdgeOnly(), None
    names: list[str] = []
    if engine is not None:
        names = [engine.manifest.name, engine.model_ref.variant]
    hybrid, problems = HybridPlacement.from_config(
        bus, thing, doc, max_batch_size=int(getattr(cfg, "max_batch_size", 8)), local_models=names
    )
    for problem in problems:
        log.warning("placement: %s", problem)
    engine_ms = getattr(engine, "warmup_ms", None) or {}
    for n, ms in engine_ms.items():  # a first a·n + b from the warm-up, before any real batch
        hybrid.policy.batch_finished(int(n), float(ms))
    log.info("placement: hybrid (offload to the cloud router when only it meets a deadline)")
    return hybrid.start(), hybrid
