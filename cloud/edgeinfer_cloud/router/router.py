"""The cloud-side hybrid router: serves the requests edge devices offload, answers each exactly once.

Wiring (all MQTT through the `PubSub` seam, `edgeinfer.transport.mqtt.MqttPubSub` in production):

* a **shared subscription** `$share/{group}/edgeinfer/+/offload`: the broker hands each offloaded
  request to one router of the group, so any number of router processes split the load;
* answers go to `edgeinfer/{thing}/offload/result` with `placement: "cloud"`, where `{thing}` is the
  thing in the topic the request came on. That thing must equal `origin.thing`: a device cannot make
  the router answer on another device's topic (the mismatch is answered BAD_REQUEST on the sender's
  own topic, which its IoT policy lets it publish and subscribe to);
* `edgeinfer/+/telemetry` feeds a fleet view (last window per thing).

Every message on the offload topic gets exactly one result, with a stable error code when it cannot be
served: garbage or an invalid request → BAD_REQUEST / BAD_IMAGE / TOO_LARGE; a thing that is not in
`known_things` (when that allow-list is set) → BAD_REQUEST; already past its deadline on arrival or
while queued → DEADLINE_EXCEEDED (never computed); a full queue → OVERLOADED; a backend failure →
INTERNAL. Nothing a device sends can stop a worker.

A request the router can no longer serve in time (the queue ahead of it and the expected service,
both from the backend's measured batch time, exceed what is left of its deadline) is answered
DEADLINE_EXCEEDED at once rather than held until it is late. One that arrives with nothing queued
and a worker idle is served whatever the estimate says: it measures the backend again, so a single
slow batch cannot leave an estimate that refuses every request and is never corrected.

A router may hold several connections (`Router([client, ...])`) in the one shared subscription and
batch what arrives on all of them; with `RouterConfig.pacing` each is paced within AWS IoT Core's
per-connection limits (`connections`, `pacer`; docs/router.md has the arithmetic). `load()` gives
the signal to scale on: the backend's busy share and the backlog.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from edgeinfer.messages import (
    ErrorCode,
    Latency,
    MessageError,
    OffloadRequest,
    Result,
    TelemetryWindow,
    error_result,
    iso_utc,
    offload_result_topic,
    parse_iso_utc,
)
from edgeinfer.transport import Message, PubSub, Subscription, TransportError
from edgeinfer_cloud.router.backends import Backend, BackendError, Job
from edgeinfer_cloud.router.connections import RouterConnection, paced_connections
from edgeinfer_cloud.router.metrics import CloudWatchMetrics
from edgeinfer_cloud.router.pacer import PacingConfig

log = logging.getLogger(__name__)

__all__ = ["FleetView", "Router", "RouterConfig", "offload_filter", "thing_from_topic"]

OFFLOAD_FILTER = "edgeinfer/+/offload"
TELEMETRY_FILTER = "edgeinfer/+/telemetry"


def offload_filter(group: str) -> str:
    return f"$share/{group}/{OFFLOAD_FILTER}" if group else OFFLOAD_FILTER


def thing_from_topic(topic: str, suffix: str = "offload") -> str | None:
    """`edgeinfer/{thing}/offload` → thing (None for any other shape)."""
    parts = topic.split("/")
    if len(parts) == 3 and parts[0] == "edgeinfer" and parts[2] == suffix and parts[1]:
        return parts[1]
    return None


@dataclass
class RouterConfig:
    group: str = "edgeinfer-router"  # shared-subscription group ("" = plain subscription)
    workers: int = 1
    max_batch_size: int = 8  # jobs taken from the queue per backend call (no waiting for more)
    max_queue: int = 256  # waiting requests; beyond this OVERLOADED
    max_payload_bytes: int = 4 * 1024 * 1024
    known_things: frozenset[str] | None = None  # None: any thing may offload
    qos: int = 1
    trust_sent_at: bool = True  # subtract the transit time measured from `origin.sent_at`
    max_clock_skew_s: float = 2.0  # a sent_at further in the future than this is ignored
    fleet_view: bool = True
    metrics_interval_s: float = 60.0
    pacing: PacingConfig | None = None  # None: unpaced (a local broker, the in-memory bus)
    service_smoothing: float = 0.2  # weight of the newest batch time in the expected service time


@dataclass
class _Work:
    request: OffloadRequest
    thing: str
    received: float  # monotonic
    expires: float | None  # monotonic
    connection: RouterConnection
    # Arrived with nothing queued and a worker idle: served even when the estimate says it is late,
    # so that one slow batch cannot leave an estimate that refuses everything and is never measured.
    probe: bool = False


@dataclass
class FleetView:
    """The last telemetry window of every thing that sent one (`edgeinfer/+/telemetry`)."""

    windows: dict[str, TelemetryWindow] = field(default_factory=dict)
    received: dict[str, float] = field(default_factory=dict)  # wall clock
    bad_messages: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def update(self, thing: str, window: TelemetryWindow, at: float) -> None:
        with self._lock:
            old = self.windows.get(thing)
            if old is not None and window.seq < old.seq and at - self.received.get(thing, 0) < 3600:
                return  # a spooled older window arriving late: keep the newest
            self.windows[thing] = window
            self.received[thing] = at

    def snapshot(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            out = {}
            for thing, w in sorted(self.windows.items()):
                total = w.latency_ms.get("total")
                out[thing] = {
                    "seq": w.seq,
                    "throughput_rps": w.throughput_rps,
                    "count": w.count,
                    "errors": sum(w.errors.values()),
                    "offloaded": w.offloaded,
                    "p50_ms": total.p50 if total else None,
                    "p99_ms": total.p99 if total else None,
                    "provider": w.provider,
                    "received": iso_utc(self.received[thing]),
                }
            return out


class Router:
    def __init__(
        self,
        pubsub: PubSub | Sequence[PubSub],
        backend: Backend,
        config: RouterConfig | None = None,
        *,
        metrics: CloudWatchMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config or RouterConfig()
        clients = list(pubsub) if isinstance(pubsub, Sequence) else [pubsub]
        if not clients:
            raise ValueError("a router needs at least one connection")
        self.connections = paced_connections(clients, self.config.pacing)
        self.pubsub = clients[0]
        self.backend = backend
        self.metrics = metrics
        self.clock = clock
        self.wall_clock = wall_clock
        self.fleet = FleetView()
        self._queue: queue.Queue[_Work | None] = queue.Queue(maxsize=self.config.max_queue)
        self._subs: list[Subscription] = []
        self._workers: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self.counters: dict[str, int] = {"received": 0, "answered": 0, "ok": 0, "publish_failed": 0}
        self.errors: dict[str, int] = {}
        self.batches: list[int] = []
        self._service_s: float | None = None  # expected time of one backend call (smoothed)
        self._busy_s = 0.0  # time spent in the backend, all workers together
        self._serving = 0  # workers holding a batch now
        self._load_mark: tuple[float, float] | None = None  # (clock, busy) when load() last sampled

    # ---------------------------------------------------------------------------------- lifecycle

    def start(self) -> Router:
        for i in range(max(1, self.config.workers)):
            worker = threading.Thread(target=self._work_loop, name=f"router-worker-{i}", daemon=True)
            worker.start()
            self._workers.append(worker)
        for conn in self.connections:
            self._subs.append(
                conn.subscribe(
                    offload_filter(self.config.group),
                    functools.partial(self.handle_offload, connection=conn),
                    qos=self.config.qos,
                    paced=True,
                )
            )
        if self.config.fleet_view:  # a plain subscription: one connection is enough
            self._subs.append(
                self.connections[0].subscribe(TELEMETRY_FILTER, self.handle_telemetry, qos=0, paced=False)
            )
        self._load_mark = (self.clock(), 0.0)
        if self.metrics is not None:
            threading.Thread(target=self._metrics_loop, name="router-metrics", daemon=True).start()
        log.info(
            "router serving %s (%s) on %s with %d worker(s) and %d connection(s)",
            self.backend.model_ref.name,
            self.backend.provider,
            offload_filter(self.config.group),
            len(self._workers),
            len(self.connections),
        )
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop taking requests, answer everything already taken, then stop the workers."""
        for sub in self._subs:
            with contextlib.suppress(Exception):
                sub.close()
        self._subs.clear()
        self._stopping.set()
        for _ in self._workers:
            self._queue.put(None)
        for worker in self._workers:
            worker.join(timeout_s)
        self._workers.clear()
        if self.metrics is not None:
            self.metrics.flush()

    def __enter__(self) -> Router:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----------------------------------------------------------------------------------- handlers

    def handle_offload(self, message: Message, connection: RouterConnection | None = None) -> None:
        """Transport thread: validate quickly, then queue for a worker or answer the error now (on
        the connection the request came on; None: the first)."""
        conn = connection or self.connections[0]
        with self._lock:
            self.counters["received"] += 1
        received = self.clock()
        thing = thing_from_topic(message.topic)
        if thing is None:  # cannot happen with our subscription; nowhere safe to answer
            log.warning("ignoring a message on unexpected topic %s", message.topic)
            return
        try:
            request = OffloadRequest.parse(message.payload, max_bytes=self.config.max_payload_bytes)
        except MessageError as exc:
            self._answer_error(
                thing, exc.request_id, exc.code, exc.message, received=received, connection=conn
            )
            return
        except Exception as exc:  # a bug in parsing must not leave the device without an answer
            log.exception("unexpected error parsing an offload from %s", thing)
            self._answer_error(
                thing,
                None,
                ErrorCode.INTERNAL,
                f"cannot parse the request: {exc}",
                received=received,
                connection=conn,
            )
            return
        rid = request.request.id
        if request.origin.thing != thing:
            self._answer_error(
                thing,
                rid,
                ErrorCode.BAD_REQUEST,
                f"origin.thing {request.origin.thing!r} does not match the topic's thing {thing!r}",
                received=received,
                connection=conn,
            )
            return
        known = self.config.known_things
        if known is not None and thing not in known:
            self._answer_error(
                thing,
                rid,
                ErrorCode.BAD_REQUEST,
                f"unknown thing {thing!r}",
                received=received,
                connection=conn,
            )
            return
        if not self.backend.serves(request.request.model):
            self._answer_error(
                thing,
                rid,
                ErrorCode.BAD_REQUEST,
                f"model {request.request.model!r} is not served here (serving {self.backend.model_ref.name})",
                received=received,
                connection=conn,
            )
            return
        expires = self._expiry(request, received)
        if expires is not None and expires <= received:
            self._answer_error(
                thing,
                rid,
                ErrorCode.DEADLINE_EXCEEDED,
                "the request was past its deadline on arrival",
                received=received,
                connection=conn,
            )
            return
        probe = self._idle()
        late = None if probe else self._cannot_make_it(expires, received)
        if late is not None:
            self._answer_error(
                thing, rid, ErrorCode.DEADLINE_EXCEEDED, late, received=received, connection=conn
            )
            return
        try:
            self._queue.put_nowait(_Work(request, thing, received, expires, conn, probe))
        except queue.Full:
            self._answer_error(
                thing,
                rid,
                ErrorCode.OVERLOADED,
                f"router queue full ({self.config.max_queue})",
                received=received,
                connection=conn,
            )

    def handle_telemetry(self, message: Message) -> None:
        thing = thing_from_topic(message.topic, "telemetry")
        if thing is None:
            return
        try:
            window = TelemetryWindow.from_dict(_json_object(message.payload))
        except Exception:
            self.fleet.bad_messages += 1
            return
        if window.thing != thing:
            self.fleet.bad_messages += 1
            return
        self.fleet.update(thing, window, self.wall_clock())

    def _expiry(self, request: OffloadRequest, received: float) -> float | None:
        left = request.origin.deadline_left_ms
        if left is None:
            return None
        transit = 0.0
        if self.config.trust_sent_at and request.origin.sent_at:
            with contextlib.suppress(ValueError):
                transit = self.wall_clock() - parse_iso_utc(request.origin.sent_at)
                if transit < -self.config.max_clock_skew_s:
                    transit = 0.0  # the device's clock runs ahead: ignore it
                transit = max(0.0, transit)
        return received + left / 1000.0 - transit

    def _idle(self) -> bool:
        """Nothing queued and a worker waiting: a request now is served at once."""
        with self._lock:
            serving = self._serving
        return self._queue.empty() and serving < max(1, self.config.workers)

    def _cannot_make_it(self, expires: float | None, now: float) -> str | None:
        """Why a request arriving now cannot be answered before `expires` (None: it can, or no
        estimate yet): the batches queued ahead of it shared among the workers, then its own."""
        service = self._service_s
        if expires is None or not service:
            return None
        batch = max(1, min(self.config.max_batch_size, self.backend.max_batch_size))
        workers = max(1, self.config.workers)
        ahead = math.ceil(self._queue.qsize() / batch) / workers
        expected = (ahead + 1) * service
        if now + expected <= expires:
            return None
        return (
            f"cannot be served in time: about {expected * 1000:.0f} ms of queue and service "
            f"> {(expires - now) * 1000:.0f} ms left"
        )

    def load(self) -> dict[str, float]:
        """The signal to scale on, since the last call: `busy_share` (the backend's busy time over
        the time the workers had, 0..1) and `backlog` (requests waiting now)."""
        now = self.clock()
        with self._lock:
            busy = self._busy_s
        mark = self._load_mark or (now, busy)
        self._load_mark = (now, busy)
        span = (now - mark[0]) * max(1, self.config.workers)
        share = min(1.0, (busy - mark[1]) / span) if span > 0 else 0.0
        return {"busy_share": share, "backlog": float(self._queue.qsize())}

    # ------------------------------------------------------------------------------------ workers

    def _work_loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            stop_after = False
            while len(batch) < max(1, min(self.config.max_batch_size, self.backend.max_batch_size)):
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop_after = True
                    break
                batch.append(item)
            with self._lock:
                self._serving += 1
            try:
                self._serve(batch)
            except Exception as exc:  # never lose a request to a bug
                log.exception("router worker failed on a batch of %d", len(batch))
                for work in batch:
                    self._answer_error(
                        work.thing,
                        work.request.request.id,
                        ErrorCode.INTERNAL,
                        f"router error: {exc}",
                        received=work.received,
                        connection=work.connection,
                    )
            finally:
                with self._lock:
                    self._serving -= 1
            if stop_after:
                return

    def _drop_hopeless(self, live: list[_Work], now: float) -> list[_Work]:
        """Answer at once those whose deadline falls before the expected service would end (not a
        probe: the estimate alone does not refuse it)."""
        service = self._service_s
        if not service:
            return live
        keep: list[_Work] = []
        for work in live:
            if not work.probe and work.expires is not None and now + service > work.expires:
                left_ms = (work.expires - now) * 1000
                self._answer_error(
                    work.thing,
                    work.request.request.id,
                    ErrorCode.DEADLINE_EXCEEDED,
                    f"cannot be served in time: about {service * 1000:.0f} ms of service "
                    f"> {left_ms:.0f} ms left",
                    received=work.received,
                    connection=work.connection,
                )
            else:
                keep.append(work)
        return keep

    def _serve(self, batch: list[_Work]) -> None:
        now = self.clock()
        live: list[_Work] = []
        for work in batch:
            if work.expires is not None and work.expires <= now:
                self._answer_error(
                    work.thing,
                    work.request.request.id,
                    ErrorCode.DEADLINE_EXCEEDED,
                    "the deadline passed while the request waited at the router",
                    received=work.received,
                    connection=work.connection,
                )
            else:
                live.append(work)
        if not live:
            return
        picked = self.clock()
        live = self._drop_hopeless(live, picked)
        if not live:
            return
        jobs = [
            Job(
                w.request.request.image or b"",
                w.request.request.top_k,
                w.request.request.model,
                max_detections=w.request.request.max_detections,
                score_threshold=w.request.request.score_threshold,
            )
            for w in live
        ]
        try:
            outcomes = self.backend.infer(jobs)
        except BackendError as exc:
            for work in live:
                self._answer_error(
                    work.thing,
                    work.request.request.id,
                    ErrorCode.INTERNAL,
                    str(exc),
                    received=work.received,
                    connection=work.connection,
                )
            return
        took = self.clock() - picked
        with self._lock:
            self._busy_s += took
            old = self._service_s
            weight = self.config.service_smoothing
            self._service_s = took if old is None else old + weight * (took - old)
            self.batches.append(len(live))
            if len(self.batches) > 10_000:
                del self.batches[:5000]
        for work, outcome in zip(live, outcomes, strict=True):
            latency = Latency(
                queue=(picked - work.received) * 1000,
                decode=outcome.decode_ms,
                inference=outcome.inference_ms,
                postprocess=outcome.postprocess_ms,
            )
            if outcome.code is not None:
                self._answer_error(
                    work.thing,
                    work.request.request.id,
                    outcome.code,
                    outcome.message,
                    received=work.received,
                    latency=latency,
                    connection=work.connection,
                )
                continue
            latency.total = (self.clock() - work.received) * 1000
            result = Result(
                id=work.request.request.id,
                status="ok",
                timestamp=iso_utc(self.wall_clock()),
                predictions=outcome.predictions,
                detections=outcome.detections,
                model=self.backend.model_ref,
                placement="cloud",
                provider=self.backend.provider,
                batch_size=len(live),
                latency_ms=latency,
            )
            self._publish(work.thing, result, work.connection)

    # ------------------------------------------------------------------------------------ answers

    def _answer_error(
        self,
        thing: str,
        request_id: str | None,
        code: ErrorCode,
        message: str,
        *,
        received: float,
        connection: RouterConnection,
        latency: Latency | None = None,
    ) -> None:
        latency = latency or Latency()
        latency.total = (self.clock() - received) * 1000
        result = error_result(
            request_id,
            code,
            message,
            timestamp=iso_utc(self.wall_clock()),
            latency=latency,
            placement="cloud",
            model=self.backend.model_ref,
            provider=self.backend.provider,
        )
        self._publish(thing, result, connection)

    def _publish(self, thing: str, result: Result, connection: RouterConnection) -> None:
        code = result.error.code.value if result.error is not None else None
        with self._lock:
            self.counters["answered"] += 1
            if code is None:
                self.counters["ok"] += 1
            else:
                self.errors[code] = self.errors.get(code, 0) + 1
        if self.metrics is not None:
            self.metrics.record(thing, ok=code is None, code=code, latency_ms=result.latency_ms.total)
        try:
            connection.publish(offload_result_topic(thing), result.to_json(), qos=self.config.qos)
        except TransportError as exc:
            with self._lock:
                self.counters["publish_failed"] += 1
            log.warning("cannot answer %s on %s: %s", result.id, offload_result_topic(thing), exc)

    def _metrics_loop(self) -> None:
        assert self.metrics is not None
        while not self._stopping.wait(self.config.metrics_interval_s):
            try:
                load = self.load()
                self.metrics.record_load(load["busy_share"], load["backlog"])
                self.metrics.flush()
            except Exception:
                log.exception("metrics flush failed")

    def stats(self) -> dict[str, Any]:
        with self._lock:
            batches = list(self.batches)
            return {
                **self.counters,
                "errors": dict(self.errors),
                "queued": self._queue.qsize(),
                "mean_batch": sum(batches) / len(batches) if batches else 0.0,
                "connections": {c.name: c.stats() for c in self.connections},
            }


def _json_object(payload: bytes) -> dict[str, Any]:
    import json

    doc = json.loads(payload)
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    return doc
