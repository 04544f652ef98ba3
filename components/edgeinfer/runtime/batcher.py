"""A dynamic batcher in the manner of Triton's: `max_batch_size`, `max_queue_delay_us`, a bounded queue
and per-request deadlines. Pure logic plus one condition variable; the clock is injected, so every
rule is tested by calling `poll(now)` without sleeping.

Requests move through three counts: *admitted* (a slot is reserved before any work is spent on them,
`admit()` says False when `max_queue_size` slots are taken → OVERLOADED), *incoming* (being decoded on
a worker thread) and *queued* (decoded, waiting for the engine). The engine thread asks for work only
when it is idle; `poll` then decides:

1. items past their deadline leave the queue as `expired` (answered DEADLINE_EXCEEDED, never computed);
2. a full batch goes at once;
3. otherwise the queue goes as it is when nothing more is being decoded (no waiting when the engine is
   idle and no request is on its way), when its oldest item has waited `max_queue_delay_us`, or when
   waiting longer and then running would make a queued item miss its deadline;
4. otherwise wait (for an arrival, or until the oldest item's delay runs out).

A batch that goes leaves behind, as `doomed` (answered DEADLINE_EXCEEDED, never computed), the items
whose deadline comes before now + its expected run time; the rest run as a smaller batch, the most
that still finish in time (a smaller batch runs sooner). The expected run time of a batch of n is the
engine's batch time `t(n) = a·n + b` fitted to recent runs of the same kind (`observe_run`; a batch
with every lane runs on every core, a lane's on one), plus the fit's `RUN_TIME_QUANTILE` residual;
nothing is doomed before a run of that kind has been seen.

Up to `lanes` batches run at once. `get()` hands one to an engine thread; `put_take(alone=True)`
hands it to the caller that queued the last item at an idle runtime (run to completion: no wake-up
of an engine thread and no hand-off back, ~0.2-0.4 ms per request on a small core). A batch holds
one lane, except one taken by `get()` or `put_take(alone=True)` while nothing else runs, is queued
or is being decoded, at a *quiet* runtime: it holds every lane (`BatchPoll.slots` == `lanes`) and may
use all the cores — the latency path for a request (or a source's frame) that arrived at an idle
runtime. Quiet: fewer than `full_session_max_contention` of the recent arrivals (an average over ~8,
fading over seconds without arrivals) found work in flight (with one lane, always). Under load the
runtime is idle for moments between requests too, and a batch there that took every core would make
the next arrival wait for all of it while costing more CPU per image than a lane; so under load
every batch takes one lane.
Beside a running lane, rule 3's "nothing on its way" no longer sends a partial batch: it waits up
to the delay to fill. Lanes stay taken until `done()`.
A lane's batch holds at most `lane_batch_size` items (default: its share of `max_batch_size`, so
the lanes together hold one full batch); a batch that holds every lane may be full. On one thread
an image costs the same in a batch of 4 as in one of 8 (4.97 vs 4.98 ms here) while the batch takes
twice as long, and every request in it waits for all of it: under load, lanes of 8 made the queue
behind them grow into batches of 6-8 that took 40-85 ms.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from edgeinfer.runtime.placement.estimators import ServiceTimeModel

T = TypeVar("T")

CONTENTION_WINDOW = 8  # arrivals the contention average spans (an exponential moving average)
CONTENTION_FADE_S = 1.0  # … and it fades with time between arrivals: a burst is forgotten in seconds
# How sure a batch's expected run time must be: the quantile the placement policy takes of the work
# outside the engine and of the cloud's answers. Too high on shared cores (a preempted run takes
# twice as long) and requests that would have made it are answered DEADLINE_EXCEEDED; one that is
# computed and finishes late is still answered DEADLINE_EXCEEDED, by the server, never `ok`.
RUN_TIME_QUANTILE = 0.9

__all__ = ["BatchPoll", "DynamicBatcher", "Queued"]


@dataclass
class Queued(Generic[T]):
    item: T
    enqueued: float
    deadline: float | None = None


@dataclass
class BatchPoll(Generic[T]):
    batch: list[Queued[T]] = field(default_factory=list)
    expired: list[Queued[T]] = field(default_factory=list)
    doomed: list[Queued[T]] = field(default_factory=list)  # taken for the batch, would end too late
    run_s: float = 0.0  # the expected run time the doomed were judged by (of the batch one larger)
    wait_s: float | None = None  # None: nothing queued, wait for an arrival
    slots: int = 0  # lanes the batch holds (give them back with `done(slots)`)
    lanes: int = 1  # of how many

    @property
    def alone(self) -> bool:
        """The batch holds every lane: nothing runs beside it, it may use every core."""
        return self.slots > 0 and self.slots >= self.lanes


class DynamicBatcher(Generic[T]):
    def __init__(
        self,
        max_batch_size: int = 8,
        max_queue_delay_us: int = 2000,
        max_queue_size: int = 64,
        *,
        clock: Callable[[], float] = time.monotonic,
        lanes: int = 1,
        full_session_max_contention: float = 0.25,
        lane_batch_size: int = 0,
    ) -> None:
        self.lanes = max(1, lanes)
        self.lane_batch_size_setting = lane_batch_size  # 0: the lane's share (see `lane_batch_size`)
        self.full_session_max_contention = full_session_max_contention
        self.contention = 0.0  # moving average: 1 for an arrival that found work in flight, else 0
        self._last_arrival: float | None = None
        self.max_batch_size = max_batch_size
        self.max_queue_delay_us = max_queue_delay_us
        self.max_queue_size = max_queue_size
        self.clock = clock
        self._queue: deque[Queued[T]] = deque()
        self._admitted = 0  # reserved slots: incoming + queued
        self._incoming = 0
        self._closed = False
        self._running = 0  # lanes held by batches handed out and not yet done()
        self._cond = threading.Condition()
        self.depth_max = 0
        # The engine's batch time, by kind: a batch with every lane (all cores), a lane's (one).
        self._run_time = {True: ServiceTimeModel(), False: ServiceTimeModel()}

    # ----------------------------------------------------------------------------------- producers

    def admit(self) -> bool:
        """Reserve a slot for a request about to be decoded. False: the queue is full (OVERLOADED)."""
        with self._cond:
            if self._closed or self._admitted >= self.max_queue_size:
                return False
            self._arrive()
            self._admitted += 1
            self._incoming += 1
            return True

    def _arrive(self) -> None:
        now = self.clock()
        if self._last_arrival is not None:
            self.contention *= math.exp(-max(0.0, now - self._last_arrival) / CONTENTION_FADE_S)
        self._last_arrival = now
        busy = self._admitted > 0 or self._running > 0
        self.contention += ((1.0 if busy else 0.0) - self.contention) / CONTENTION_WINDOW

    def wait_floor_s(self, batch_s: float, now: float | None = None) -> float:
        """The least a request admitted now waits for its batch to start: the full batches ahead of
        it, `lanes` side by side, `batch_s` each — of the queued requests those that will still be
        in time when their batch starts (the rest leave as expired, never run), then those being
        decoded. The batch running now and the request's own are not counted: a floor."""
        batch_s = max(0.0, batch_s)
        with self._cond:
            now = self.clock() if now is None else now
            per_round = max(1, self.lane_batch_size) * self.lanes
            ahead = 0
            for q in self._queue:
                if q.deadline is None or q.deadline > now + (ahead // per_round) * batch_s:
                    ahead += 1
            ahead += max(0, self._incoming)
            return (ahead // per_round) * batch_s

    def observe_run(self, batch_size: int, seconds: float, *, alone: bool) -> None:
        """A batch of `batch_size` ran in `seconds` (`alone`: it held every lane)."""
        with self._cond:
            self._run_time[alone or self.lanes == 1].observe(batch_size, seconds * 1000)

    def expected_run_s(self, batch_size: int, *, alone: bool) -> float:
        """What a batch of `batch_size` of that kind takes to run, at `RUN_TIME_QUANTILE`; 0 before
        one of its kind has run."""
        with self._cond:
            return self._expected_run_s(batch_size, alone or self.lanes == 1)

    def _expected_run_s(self, batch_size: int, alone: bool) -> float:
        fit = self._run_time[alone].fit
        ms = fit.predict(batch_size) if batch_size > 0 else None
        if ms is None:
            return 0.0
        return (ms + fit.residual_quantile(RUN_TIME_QUANTILE)) / 1000

    def release(self) -> None:
        """An admitted request left before reaching the queue (bad image, deadline during decode)."""
        with self._cond:
            self._admitted -= 1
            self._incoming -= 1
            self._cond.notify_all()

    def put(self, item: T, deadline: float | None = None, *, admitted: bool = True) -> bool:
        """A decoded item joins the queue. With `admitted=False` a slot is reserved here (sources)."""
        with self._cond:
            if not admitted:
                if self._closed or self._admitted >= self.max_queue_size:
                    return False
                self._arrive()
                self._admitted += 1
            else:
                self._incoming -= 1
            self._queue.append(Queued(item, self.clock(), deadline))
            self.depth_max = max(self.depth_max, len(self._queue))
            self._cond.notify_all()
            return True

    def put_take(self, item: T, deadline: float | None = None, *, alone: bool = False) -> BatchPoll[T] | None:
        """`put` an admitted item. With `alone` (the caller found the runtime idle), when the rules
        say go and a lane is free, take the batch here: it holds every lane if nothing else runs, is
        queued or is being decoded (the caller runs it, then calls `done(poll.slots)`). None: the item
        was refused (closed). An empty poll: an engine thread will take it."""
        with self._cond:
            self._incoming -= 1
            if self._closed:
                self._admitted -= 1
                return None
            self._queue.append(Queued(item, self.clock(), deadline))
            self.depth_max = max(self.depth_max, len(self._queue))
            out: BatchPoll[T] = BatchPoll()
            # Only the caller that knows the runtime was idle takes the batch; otherwise the engine
            # threads do. A decode worker that ran one would stop decoding for a whole batch: with
            # one decode thread (a one-core device) saturation fell from ~124 to ~82 req/s.
            if alone and self._running < self.lanes:
                out = self._take(self.clock(), alone=True)
            if self._queue:  # what is left is the engine threads'
                self._cond.notify_all()
            return out

    def done(self, slots: int = 1) -> None:
        """A batch finished: its lanes (`BatchPoll.slots`) are free again."""
        with self._cond:
            self._running = max(0, self._running - slots)
            self._cond.notify_all()

    def _take(self, now: float, *, alone: bool = False) -> BatchPoll[T]:
        """`_poll` with a free lane; a batch takes its lanes."""
        # A batch that may hold every lane may be a full one; otherwise it is a lane's. (What has
        # expired leaves first: it must not make the queue look longer than one batch.)
        expired = self._expire(now)
        whole = (
            alone
            and self._running == 0
            and self._incoming <= 0
            and len(self._queue) <= self.max_batch_size
            and self._quiet
        )
        out = self._poll(
            now, self.max_batch_size if whole else self.lane_batch_size, alone=whole or self.lanes == 1
        )
        out.expired[:0] = expired
        if out.batch:
            # A whole batch took the queue: it fits one batch and nothing runs or is on its way.
            out.slots = self.lanes if whole else 1
            out.lanes = self.lanes
            self._running += out.slots
        return out

    # ----------------------------------------------------------------------------------- consumer

    def poll(self, now: float) -> BatchPoll[T]:
        """Decide what the idle engine should do now (see the module docstring). Not blocking."""
        with self._cond:
            return self._poll(now, self.max_batch_size, alone=True)

    def _expire(self, now: float) -> list[Queued[T]]:
        """Take the items past their deadline out of the queue (and out of the admitted count)."""
        if not any(q.deadline is not None and q.deadline <= now for q in self._queue):
            return []
        expired: list[Queued[T]] = []
        keep: deque[Queued[T]] = deque()
        for q in self._queue:
            (expired if q.deadline is not None and q.deadline <= now else keep).append(q)
        self._queue = keep
        self._admitted -= len(expired)
        return expired

    def _poll(self, now: float, limit: int, *, alone: bool) -> BatchPoll[T]:
        out: BatchPoll[T] = BatchPoll(expired=self._expire(now))
        if self._queue:
            delay = self.max_queue_delay_us / 1e6
            age = now - self._queue[0].enqueued
            n = min(limit, len(self._queue))
            deadlines = [q.deadline for q in self._queue if q.deadline is not None]
            # Waiting, then running, must not make a queued request miss its deadline.
            run_s = self._expected_run_s(n, alone)
            urgent = bool(deadlines) and min(deadlines) - now - run_s <= delay - age
            # "Nothing more on its way" sends a partial batch only to an idle engine: beside a running
            # lane, a batch waits up to the delay to fill (many small lane batches starve decode).
            settled = self._incoming <= 0 and self._running == 0
            if len(self._queue) >= limit or settled or age >= delay or urgent:
                taken = [self._queue.popleft() for _ in range(n)]
                self._admitted -= n
                self._split(out, taken, now, alone)
            else:
                out.wait_s = delay - age
        return out

    def _split(self, out: BatchPoll[T], taken: list[Queued[T]], now: float, alone: bool) -> None:
        """`taken` into the batch and the doomed: the most of them that a batch of that many still
        finishes in time for (those with the latest deadlines), in queue order."""
        latest_first = sorted(taken, key=lambda q: -math.inf if q.deadline is None else -q.deadline)
        keep = 0
        for k in range(len(taken), 0, -1):
            deadline = latest_first[k - 1].deadline
            if deadline is None or deadline >= now + self._expected_run_s(k, alone):
                keep = k
                break
        if keep == len(taken):
            out.batch = taken
            return
        kept = {id(q) for q in latest_first[:keep]}
        out.batch = [q for q in taken if id(q) in kept]
        out.doomed = [q for q in taken if id(q) not in kept]
        out.run_s = self._expected_run_s(keep + 1, alone)

    def get(self, timeout: float | None = None) -> BatchPoll[T]:
        """Block until there is a batch or expired items (or `timeout` seconds, or close()). A batch
        is handed out only while a lane is free; the caller calls `done(poll.slots)` after running it."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                out = self._take(self.clock(), alone=True) if self._running < self.lanes else BatchPoll[T]()
                if out.batch or out.expired or out.doomed or self._closed:
                    return out
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return out
                wait = out.wait_s if left is None else min(left, out.wait_s or left)
                self._cond.wait(wait)

    # ------------------------------------------------------------------------------------ control

    def configure(
        self,
        *,
        max_batch_size: int | None = None,
        max_queue_delay_us: int | None = None,
        max_queue_size: int | None = None,
        lanes: int | None = None,
        full_session_max_contention: float | None = None,
        lane_batch_size: int | None = None,
    ) -> None:
        """Live update; items already admitted stay admitted, batches running keep their lanes."""
        with self._cond:
            if lane_batch_size is not None:
                self.lane_batch_size_setting = lane_batch_size
            if lanes is not None:
                self.lanes = max(1, lanes)
            if full_session_max_contention is not None:
                self.full_session_max_contention = full_session_max_contention
            if max_batch_size is not None:
                self.max_batch_size = max_batch_size
            if max_queue_delay_us is not None:
                self.max_queue_delay_us = max_queue_delay_us
            if max_queue_size is not None:
                self.max_queue_size = max_queue_size
            self._cond.notify_all()

    def close(self) -> list[Queued[T]]:
        """Refuse new work; return what was queued so the caller can still answer it."""
        with self._cond:
            self._closed = True
            left = list(self._queue)
            self._queue.clear()
            self._admitted -= len(left)
            self._cond.notify_all()
            return left

    def reopen(self) -> None:
        """Take work again after `close` (a model whose start failed, loaded again). What holds this
        batcher from before keeps using it: nothing is queued where no engine thread looks."""
        with self._cond:
            self._closed = False

    @property
    def closed(self) -> bool:
        """`close` was called (and not `reopen`): `admit` and `put` refuse everything."""
        return self._closed

    @property
    def lane_batch_size(self) -> int:
        """The most items a batch on one lane holds: the setting, or 0 → `max_batch_size` shared
        by the lanes (rounded up); never more than `max_batch_size`. With one lane every batch
        holds every lane, and may be full whatever the setting."""
        if self.lanes == 1:  # every batch holds the one lane, on the whole session
            return self.max_batch_size
        share = self.lane_batch_size_setting or -(-self.max_batch_size // self.lanes)
        return max(1, min(self.max_batch_size, share))

    @property
    def idle(self) -> bool:
        """Nothing admitted, queued or running (read under the lock: a batch taken moves its items
        from admitted to running in two steps, and the repository's eviction reads this)."""
        with self._cond:
            return self._admitted == 0 and self._running == 0

    @property
    def _quiet(self) -> bool:
        return self.lanes == 1 or self.contention < self.full_session_max_contention

    @property
    def quiet(self) -> bool:
        """Idle, and not under load: few recent arrivals found work in flight (see the module
        docstring). What gets a request the whole session, and run to completion on its thread.
        With one lane there is nothing to run beside it, and idle is enough."""
        return self.idle and self._quiet

    @property
    def depth(self) -> int:
        return len(self._queue)

    @property
    def outstanding(self) -> int:
        return self._admitted

    @property
    def incoming(self) -> int:
        return self._incoming
