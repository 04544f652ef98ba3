"""The edge placement policy: serve here, offload to the cloud router, or answer DEADLINE_EXCEEDED.

Pure logic, clock injected (`clock()` in seconds, `time.monotonic` by default); `HybridPlacement`
(`hybrid.py`) calls it from the runtime's placement seam and does all I/O itself. Nothing here sleeps
or touches a socket. The predictions come from `estimators.py`, offloads in flight are kept in the
exactly-once `Ledger` (`ledger.py`), a dead cloud is kept out by the `CircuitBreaker` (`breaker.py`).
Over 500 lines because it is one class: every decision and every outcome it learns from (answers,
timeouts, the adaptive limit) read and write the same state under one lock.

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
* **Light load** (engine busy less than `offload_min_utilization` of the last `utilization_window_s`,
  and fewer than that share of the window's arrivals finding a full batch ahead of them): the edge
  keeps everything; the cloud is for a device out of capacity, not for its Poisson bursts. The second
  signal is for an edge whose engine shares its cores with decode and the transport: in `bench
  offload` on one core the engine was 44-65 % busy at 1.5-2x its capacity, and the first rule alone
  kept deadline requests on an edge that could not serve them.
* **An adaptive limit** on offloads in flight (AIMD, like TCP's window): +1/limit for an answer back
  with headroom, ×0.8 for one that missed (once per `cloud_limit_hold_s`). A late offload costs twice —
  the router's time, then the edge's when it is served here after all — so the edge sends only what
  the router answers in time. Measured in `bench offload` at 1.5x: late cloud answers fell from 15-23 %
  of offloads to 2-7 %, the limit settling at 6-8 in flight.
The cloud's conservative prediction takes its residual quantile from samples sent with as many in
flight or more (`LinearFit.residual_quantile(at=)`): round trips spread out near the router's knee.

**Behind** (`backlog_*`): the engine's busy share and the arrivals' queue say nothing of a backlog
in front of the runtime (a broker's queue, a clogged bridge): in a 2,000 req/s flood over IoT Core
the runtime saw ~7 req/s and kept everything local. What does show it is how late requests arrive
(`lag_ms`: now − `sent_at`): one that spent most of its deadline on the way, or a lag that keeps
growing, for a few arrivals in a row. Behind, the light-load rule is off, and a deadline request goes
to the cloud whenever the cloud is sure to meet what is left (under the adaptive limit), before the
edge's own prediction, which does not see the backlog, is asked.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Generic, NamedTuple, TypeVar

from edgeinfer import stats
from edgeinfer.messages import ErrorCode, Request, Result
from edgeinfer.runtime.placement.breaker import BreakerState, CircuitBreaker
from edgeinfer.runtime.placement.config import OffloadConfig
from edgeinfer.runtime.placement.estimators import CloudLatencyModel, LinearFit, ServiceTimeModel
from edgeinfer.runtime.placement.ledger import CloudOutcome, Fallback, Ledger, Ticket
from edgeinfer.runtime.placement.seam import Decision, Where

__all__ = ["OffloadPolicy"]

T = TypeVar("T")

# Error codes from the cloud that are the request's fault, not the cloud's: forward them as they are.
_REQUEST_FAULTS = {ErrorCode.BAD_REQUEST, ErrorCode.BAD_IMAGE, ErrorCode.TOO_LARGE}
_COUNTER: dict[Where, str] = {"edge": "local", "cloud": "offloaded", "reject": "rejected"}


def _sliding_min(window: deque[tuple[float, float]], now: float, value: float, span_s: float) -> float:
    """Add `(now, value)` to a monotonic deque and return the least value of the last `span_s`."""
    while window and window[0][0] < now - span_s:
        window.popleft()
    while window and window[-1][1] >= value:
        window.pop()
    window.append((now, value))
    return window[0][1]


def _round3(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


class _Verdict(NamedTuple):
    where: Where
    reason: str
    code: ErrorCode | None = None


@dataclass
class _Situation(Generic[T]):
    """One decision's request and what the policy predicts for it. The expected latencies, the load
    and the cloud's room are worked out when the first rule that reads them asks (the rules before
    decide on the sure predictions alone)."""

    policy: OffloadPolicy[T]
    request: Request
    ahead: int
    payload_bytes: int
    now: float
    behind: str | None  # why the device is behind a backlog upstream, None while it is not
    local_ms: float  # the sure predictions (certainty quantiles)
    cloud_ms: float
    budget: float | None  # the deadline left less the margin; None: no deadline

    @property
    def missing_model(self) -> bool:
        model = self.request.model
        return model is not None and model not in self.policy.local_models

    @cached_property
    def local_exp(self) -> float:
        return self.policy.predict_local_ms(self.ahead, self.now, conservative=False)

    @cached_property
    def utilization(self) -> float | None:
        return self.policy.utilization(self.now)

    @cached_property
    def queued(self) -> float | None:
        return self.policy.queued_share(self.now)

    @cached_property
    def ready(self) -> bool:
        """The cloud can take a deadline offload: ready, and room under the adaptive limit (more in
        flight than the router answers in time only turns into late answers, each served here again)."""
        return self.policy._deadline_offload_ready()

    @cached_property
    def cloud_exp(self) -> float:
        return self.policy.predict_cloud_ms(self.payload_bytes, 0.5) if self.ready else math.inf

    @property
    def cloud_why(self) -> str:
        return f"cloud {self.cloud_exp:.0f} ms" if self.ready else "no room in the cloud"


class OffloadPolicy(Generic[T]):
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
        self._arrivals: deque[tuple[float, bool]] = deque(maxlen=4096)  # (when, a full batch ahead)
        # (when, lag ms) of recent arrivals that said when they were sent, each smaller than every one
        # after it: the front is the least lag of the last `utilization_window_s` (a sliding minimum),
        # and of the last `backlog_floor_s` (the lag of a request that met no queue: clock offset + link)
        self._lags: deque[tuple[float, float]] = deque()
        self._floor_lags: deque[tuple[float, float]] = deque()
        self._floor_since = 0.0  # since when `_floor_lags` has spanned arrivals without a gap
        self._late_run = 0  # arrivals in a row that were a sign of a backlog
        self._behind_until = -math.inf
        self._behind_why = ""
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
        self._ledger: Ledger[T] = Ledger()
        self.publishing = 0  # offloads not yet taken by the nucleus (see `max_inflight_publishes`)
        self._busy_until: float | None = None  # predicted end of the batch now running
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
            "behind": 0,  # offloads because the device was behind a backlog upstream
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

    def queued_share(self, now: float | None = None, min_arrivals: int = 20) -> float | None:
        """Share of the last `utilization_window_s`'s arrivals that found a full batch (or more) ahead
        of them; None with fewer than `min_arrivals` (a burst of a few is not a load)."""
        now = self.clock() if now is None else now
        with self._lock:
            since = now - self.config.utilization_window_s
            while self._arrivals and self._arrivals[0][0] < since:
                self._arrivals.popleft()
            if len(self._arrivals) < min_arrivals:
                return None
            return sum(1 for _, full in self._arrivals if full) / len(self._arrivals)

    def observe_lag(self, lag_ms: float | None, left_ms: float | None, now: float | None = None) -> None:
        """A request arrived `lag_ms` after it was sent (None: it did not say when), with `left_ms`
        of its deadline left (None: it has none; 0 or less: it arrived too late, and was answered so).
        Sets the device behind (see the module docstring)."""
        now = self.clock() if now is None else now
        cfg = self.config
        with self._lock:
            why = ""
            if lag_ms is None or not math.isfinite(lag_ms):
                if left_ms is None or left_ms > 0:
                    return  # nothing known about this one's way here
                why = "an arrival past its deadline" if cfg.backlog_lag_share > 0 else ""
            else:
                lag = max(0.0, lag_ms)  # a sender's clock a little ahead of this one's
                recent = _sliding_min(self._lags, now, lag, cfg.utilization_window_s)
                # What every request spends on the way (a sender's clock behind this one's, a slow
                # link) is no backlog: only the lag above the floor counts.
                span = max(cfg.backlog_floor_s, 0.0)
                if not self._floor_lags or self._floor_lags[-1][0] < now - span:
                    self._floor_since = now  # a first arrival, or the first after a long gap
                floor = _sliding_min(self._floor_lags, now, lag, span)
                # Until it spans `backlog_floor_s` the floor is not known: a device that starts (or
                # reconnects) into a backlog has seen no request that met none.
                waited = lag - floor if now - self._floor_since >= span else lag
                total = lag + max(0.0, left_ms) if left_ms is not None else 0.0
                if cfg.backlog_lag_share > 0 and total > 0 and waited >= cfg.backlog_lag_share * total:
                    why = (
                        f"arrived {lag:.0f} ms after it was sent, {waited:.0f} ms over the usual:"
                        f" {100 * waited / total:.0f} % of its deadline"
                    )
                elif cfg.backlog_growth_ms > 0 and lag - recent >= cfg.backlog_growth_ms:
                    # A growing lag is a growing queue; a constant one cancels out against the window's least.
                    grown = lag - recent
                    why = f"arrival lag {lag:.0f} ms, up {grown:.0f} ms in {cfg.utilization_window_s:g} s"
            self._late_run = self._late_run + 1 if why else 0
            if why and self._late_run >= cfg.backlog_arrivals:
                self._behind_until = now + cfg.backlog_hold_s
                self._behind_why = why

    def behind(self, now: float | None = None) -> str | None:
        """Why the device is behind a backlog upstream, or None while it is not."""
        now = self.clock() if now is None else now
        with self._lock:
            return self._behind_why if now < self._behind_until else None

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
            ahead = len(self._ledger)
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
        lag_ms: float | None = None,
    ) -> Decision:
        """Where to serve `request`, given `ahead` requests in front of it on the device.

        `arrived` is when the runtime received it (the deadline counts from there, less `lag_ms`, the
        time it spent on the way when known); defaults to now.
        A returned OFFLOAD has already taken the breaker's probe slot: call `begin_offload` next.
        """
        now = self.clock() if now is None else now
        arrived = now if arrived is None else arrived
        left = None
        if request.deadline_ms is not None:
            left = request.deadline_ms - (now - arrived) * 1000.0 - max(0.0, lag_ms or 0.0)
        return self.decide_left(
            request, ahead=ahead, payload_bytes=payload_bytes, deadline_left_ms=left, now=now, lag_ms=lag_ms
        )

    def decide_left(
        self,
        request: Request,
        *,
        ahead: int,
        payload_bytes: int,
        deadline_left_ms: float | None,
        now: float | None = None,
        lag_ms: float | None = None,
    ) -> Decision:
        """`decide` with the time left given directly (None: no deadline), as the runtime knows it;
        `lag_ms`: how long after its sending the request arrived (None: it did not say when it was
        sent)."""
        now = self.clock() if now is None else now
        with self._lock:
            self._arrivals.append((now, ahead >= max(1, self.max_batch_size)))
            if lag_ms is not None:
                self.observe_lag(lag_ms, deadline_left_ms, now)
            behind = self.behind(now)
            self._forget_stale_cloud(now)
            budget = None
            if deadline_left_ms is not None:
                budget = deadline_left_ms - self.config.deadline_margin_ms
            s = _Situation(
                self,
                request,
                ahead,
                payload_bytes,
                now,
                behind,
                self.predict_local_ms(ahead, now),
                self.predict_cloud_ms(payload_bytes),
                budget,
            )
            where, reason, code = self._verdict(s)
            self.counters[_COUNTER[where]] += 1
            return Decision(where, code, reason, s.local_ms, s.cloud_ms, budget)

    # Decisions: a table of small named rules, each asked in order; the first with a verdict decides.
    # Rules that take the breaker's probe slot (`breaker.allow()`) ask for it last, as the slot is
    # taken only by a request that goes.

    def _verdict(self, s: _Situation[T]) -> _Verdict:
        for rule in self._REQUEST_RULES:
            verdict = rule(self, s)
            if verdict is not None:
                return verdict
        if s.budget is None:
            return _Verdict("edge", "no deadline")
        for deadline_rule in self._DEADLINE_RULES:
            verdict = deadline_rule(self, s, s.budget)
            if verdict is not None:
                return verdict
        return self._neither(s, s.budget)

    def _offload_never(self, s: _Situation[T]) -> _Verdict | None:
        if s.request.offload != "never":
            return None
        if s.missing_model:
            return _Verdict(
                "reject",
                f"model {s.request.model!r} is not on this device and offload is 'never'",
                ErrorCode.BAD_REQUEST,
            )
        if s.budget is not None and s.local_ms > s.budget:
            return _Verdict(
                "reject",
                f"predicted {s.local_ms:.0f} ms here, over the {s.budget:.0f} ms left",
                ErrorCode.DEADLINE_EXCEEDED,
            )
        return _Verdict("edge", "offload is 'never'")

    def _model_missing(self, s: _Situation[T]) -> _Verdict | None:
        if not s.missing_model:
            return None
        if self._cloud_ready() and self.breaker.allow():
            return _Verdict("cloud", f"model {s.request.model!r} is not on this device")
        return _Verdict(
            "reject",
            f"model {s.request.model!r} is not on this device and the cloud is unavailable",
            ErrorCode.OVERLOADED,
        )

    def _offload_always(self, s: _Situation[T]) -> _Verdict | None:
        if s.request.offload != "always":
            return None
        if self._cloud_ready() and self.breaker.allow():
            return _Verdict("cloud", "offload is 'always'")
        return _Verdict("edge", "offload is 'always' but the cloud is unavailable")

    def _behind_backlog(self, s: _Situation[T], budget: float) -> _Verdict | None:
        # The edge's own prediction sees only its queue, not the backlog in front of it: every
        # request the cloud takes is one the device need not drain.
        if (
            s.behind is not None
            and self._deadline_offload_ready()
            and s.cloud_ms <= budget
            and self.breaker.allow()
        ):
            self.counters["behind"] += 1
            return _Verdict(
                "cloud",
                f"behind ({s.behind}): the cloud ({s.cloud_ms:.0f} ms) meets the {budget:.0f} ms left",
            )
        return None

    def _local_meets(self, s: _Situation[T], budget: float) -> _Verdict | None:
        if s.local_ms <= budget:
            return _Verdict("edge", f"local {s.local_ms:.0f} ms meets the {budget:.0f} ms budget")
        return None

    def _light_load(self, s: _Situation[T], budget: float) -> _Verdict | None:
        # Light load: the device has capacity to spare and keeps its own work; what is in doubt is a
        # Poisson burst or a jitter spike, over in a moment (without this rule a light load sends a
        # few requests to the cloud that the edge would have served within their deadline anyway).
        utilization, queued = s.utilization, s.queued
        if (
            s.behind is None
            and utilization is not None
            and utilization < self.config.offload_min_utilization
            and (queued is None or queued < self.config.offload_min_utilization)
        ):
            return _Verdict(
                "edge",
                f"light load ({100 * utilization:.0f} % busy): local expected {s.local_exp:.0f} ms"
                f" of {budget:.0f} ms",
            )
        return None

    def _only_cloud_meets(self, s: _Situation[T], budget: float) -> _Verdict | None:
        # Only the cloud is sure to meet it, and it is also expected to be faster. (Without the
        # second condition, a jitter spike in the edge's feedback residuals offloads requests at
        # light load that the edge serves in a fraction of the cloud's round trip.)
        if s.ready and s.cloud_ms <= budget and s.cloud_exp < s.local_exp and self.breaker.allow():
            return _Verdict("cloud", f"only the cloud ({s.cloud_ms:.0f} ms) meets the {budget:.0f} ms budget")
        return None

    def _cloud_expected(self, s: _Situation[T], budget: float) -> _Verdict | None:
        # Neither is sure to (quantiles): go where the *expected* latency still fits, if any.
        if s.cloud_exp < s.local_exp and s.cloud_exp <= budget and self.breaker.allow():
            return _Verdict("cloud", f"cloud expected {s.cloud_exp:.0f} ms of {budget:.0f} ms left")
        return None

    def _local_expected(self, s: _Situation[T], budget: float) -> _Verdict | None:
        if s.local_exp <= budget:
            return _Verdict("edge", f"local expected {s.local_exp:.0f} ms of {budget:.0f} ms left")
        return None

    def _probe(self, s: _Situation[T], budget: float) -> _Verdict | None:
        # It would fail here anyway: send it, so that a prediction learnt from a burst or a cold
        # router is measured again instead of keeping the cloud out until it is forgotten.
        cfg = self.config
        if (
            s.ready
            and cfg.cloud_probe_s > 0
            and self.cloud.samples  # a measured verdict (the prior alone is never this slow)
            and budget >= cfg.min_cloud_wait_ms  # time enough for the router to try it
            and not self._ledger
            and s.now - max(self._cloud_seen, self._cloud_probed) >= cfg.cloud_probe_s
            and self.breaker.allow()
        ):
            self._cloud_probed = s.now
            return _Verdict("cloud", f"probe: neither meets the {budget:.0f} ms left ({s.cloud_why})")
        return None

    def _neither(self, s: _Situation[T], budget: float) -> _Verdict:
        return _Verdict(
            "reject",
            f"neither meets the {budget:.0f} ms left: local {s.local_exp:.0f} ms, {s.cloud_why} (expected)",
            ErrorCode.DEADLINE_EXCEEDED,
        )

    _REQUEST_RULES = (_offload_never, _model_missing, _offload_always)
    _DEADLINE_RULES = (
        _behind_backlog,
        _local_meets,
        _light_load,
        _only_cloud_meets,
        _cloud_expected,
        _local_expected,
        _probe,
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

    def _deadline_offload_ready(self) -> bool:
        """The cloud is ready and the deadline offloads in flight are under the adaptive limit."""
        return self._cloud_ready() and len(self._ledger) < self.cloud_limit

    def _cloud_ready(self) -> bool:
        cfg = self.config
        return (
            cfg.enabled
            and len(self._ledger) < cfg.max_inflight
            and self.publishing < cfg.max_inflight_publishes
            and self.breaker.available()
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
            wire_id = self._ledger.wire_id(request.id)
            ticket = Ticket(
                wire_id=wire_id,
                request_id=request.id,
                item=item,
                sent_at=now,
                fallback_at=fallback_at,
                payload_bytes=payload_bytes,
                held=held,
                probe=self.breaker.state is BreakerState.HALF_OPEN,
                ahead=len(self._ledger),
            )
            self._ledger.open(ticket)
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
            if self._ledger.close(ticket.wire_id) is None:
                return False
            self._failure()
            self.counters["fallbacks"] += 1
            return True

    def cancel(self, ticket: Ticket[T], reason: str = "too_large") -> bool:
        """The offload is not sent, through no fault of the cloud's (it would not fit through IoT
        Core): closed without touching the breaker, the limit or the models. True: it was open."""
        with self._lock:
            if self._ledger.close(ticket.wire_id) is None:
                return False
            self.counters[reason] = self.counters.get(reason, 0) + 1
            return True

    def publish_started(self) -> None:
        """An offload is on its way to the nucleus (encoding, or handed over and not yet taken)."""
        with self._lock:
            self.publishing += 1

    def publish_finished(self) -> None:
        with self._lock:
            self.publishing = max(0, self.publishing - 1)

    def on_cloud_result(self, result: Result, now: float | None = None) -> CloudOutcome[T] | None:
        """A result arrived on `edgeinfer/{thing}/offload/result`. None: unknown, duplicate or too late."""
        now = self.clock() if now is None else now
        if result.id is None:
            return None
        with self._lock:
            ticket = self._ledger.close(result.id)
            if ticket is None:
                late = self._ledger.late(result.id)
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
            expired = self._ledger.take_due(now)
            for ticket in expired:
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
            return [Fallback(t, "no cloud answer in time") for t in expired]

    def next_due(self) -> float | None:
        """The earliest fallback time in flight (clock seconds), to arm a timer."""
        with self._lock:
            return self._ledger.next_due()

    def drain(self) -> list[Ticket[T]]:
        """On shutdown: every open ticket, removed, so the caller can still answer each one."""
        with self._lock:
            return self._ledger.drain()

    @property
    def inflight(self) -> int:
        return len(self._ledger)

    def _failure(self) -> None:
        self.breaker.record_failure()
        self.counters["cloud_failed"] += 1

    def snapshot(self) -> dict[str, object]:
        """For logs and telemetry: predictions' inputs, breaker state, counters."""
        with self._lock:
            coef = self.service.fit.coef
            return {
                "breaker": self.breaker.state.value,
                "breaker_opened": self.breaker.opened_count,
                "inflight": len(self._ledger),
                "publishing": self.publishing,
                "utilization": _round3(self.utilization()),
                "cloud_limit": round(self.cloud_limit, 2),
                "behind_now": self.behind(),  # why the device is behind a backlog upstream, if it is
                "service_ms": {"a": coef[0], "b": coef[1]} if coef else None,
                "cloud_ms_p90": self.predict_cloud_ms(0) if self.cloud.samples else None,
                "cloud_service_ms_p50_p90": [
                    round(stats.quantile(self.cloud.service, q, 0.0), 2) for q in (0.5, 0.9)
                ]
                if self.cloud.samples
                else None,
                **self.counters,
            }
