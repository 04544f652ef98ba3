"""The one place the runtime answers: every request, accepted or refused, gets exactly one result here.

`Answers.send(job, result)` claims the job (a second answer is ignored), leaves the in-flight count,
finishes the latency figures and stamps the time, puts DEADLINE_EXCEEDED in place of a result ready
after its deadline (never a late `ok`) and TOO_LARGE in place of one IoT Core would not carry or one
whose IPC message would pass `max_ipc_bytes` (nucleus lite closes the whole connection on it), writes
the result format (the contract's JSON, or DLR's), publishes it without waiting on the bus, and
counts it and records its timing. A `reply_to` the nucleus refuses at publish time still gets its one
answer: BAD_REQUEST on the default topic, which the recipe grants. A source's result bound for IoT
Core goes through `forward` instead when it is set: the outbox keeps it while IoT Core is away and
sends it, in order, after (`edgeinfer.runtime.forward` says where the line is and why).

Every answer passes the `AnswerHook`s (`Answers.hooks`) with the request, what was computed and what
went out: the placement policy's feedback is one, a capture of requests with their results would be
another. What an answer says about the model comes from the result, so one runtime may serve several.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgeinfer.messages import (
    IOT_CORE_MAX_BYTES,
    IPC_MAX_BYTES,
    TIMED_DETECTIONS,
    ErrorCode,
    Latency,
    ModelRef,
    Prediction,
    Request,
    Result,
    TimingRecord,
    error_result,
    fits_iot_core,
    iso_utc,
    result_topic,
)
from edgeinfer.runtime.inbound import Refusal, ReplyTarget
from edgeinfer.runtime.ipc_frame import framed_size
from edgeinfer.runtime.timings import TimingPublisher
from edgeinfer.runtime.updates import InFlight
from edgeinfer.transport import Bus, TransportError, UnauthorizedError
from edgeinfer.transport.outbox import Forwarder

if TYPE_CHECKING:
    import numpy as np

    from edgeinfer.messages import RequestHead
    from edgeinfer.runtime.decode import Letterbox

__all__ = ["AnswerHook", "Answers", "Job", "Stats"]

log = logging.getLogger(__name__)


@dataclass
class Job:
    """One request (or source frame) on its way through the runtime, answered exactly once."""

    request: Request
    reply: ReplyTarget
    arrived: float
    deadline: float | None = None
    image: np.ndarray | None = None
    geometry: Letterbox | None = None  # a detector's input: how the image was letterboxed
    decode_start: float = 0.0
    decode_end: float = 0.0
    source: str | None = None  # set for frames from a camera/video/folder source
    on_done: Callable[[], None] | None = None
    discard: bool = False  # a self-test job: the whole path runs, nothing is published
    head: RequestHead | None = None  # the image's base64 not yet decoded (done once it is taken on)
    answered: bool = False
    counted: bool = False  # in the in-flight count until answered (what deployments wait for)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def claim(self) -> bool:
        """True exactly once: the caller is the one that answers this job."""
        with self.lock:
            if self.answered:
                return False
            self.answered = True
            return True


@dataclass
class Stats:
    """The runtime's counters (`InferenceServer.stats`); the answers count `ok`, `errors` and
    `publish_failures`."""

    received: int = 0
    ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    batches: list[int] = field(default_factory=list)  # sizes of recent executions (last 1000)
    offloaded: int = 0
    publish_failures: int = 0
    expired_on_arrival: int = 0  # answered DEADLINE_EXCEEDED before any work: they waited upstream


class AnswerHook:
    """Sees every answer the runtime publishes (not a self-test's). The base does nothing."""

    def on_answer(self, job: Job, computed: Result, answered: Result) -> None:
        """`computed`: the result as the runtime made it; `answered`: what went out, which is an
        error in its place when it came late or too large. Called on the answering thread: quick, and
        an exception is logged, never raised to the runtime."""


class Answers:
    def __init__(
        self,
        bus: Bus,
        thing: str,
        *,
        timings: TimingPublisher,
        inflight: InFlight,
        stats: Stats,
        stats_lock: threading.Lock,
        queue_depth: Callable[[], int] = lambda: 0,
        result_format: str = "edgeinfer",
        max_ipc_bytes: int = IPC_MAX_BYTES,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.bus = bus
        self.thing = thing
        self.timings = timings
        self.inflight = inflight
        self.stats = stats
        self._stats_lock = stats_lock
        self.queue_depth = queue_depth
        self.result_format = result_format  # the runtime's `resultFormat`; a request may ask for dlr
        self.max_ipc_bytes = max_ipc_bytes  # the runtime's `maxIpcMessageBytes`
        self.clock = clock
        self.wall = wall
        self.hooks: list[AnswerHook] = []
        # A source's IoT-bound results, kept on disk while IoT Core is away (None: straight out).
        self.forward: Forwarder | None = None

    # ------------------------------------------------------------------------------------- answering

    def send(self, job: Job, result: Result) -> None:
        """Answer `job` with `result`, unless it was answered already."""
        if not self._settle(job, result):
            return
        now = self.clock()
        computed = self._finish(job, result, now)
        answered, payload = self._encode(job, self._in_time(job, computed, now))
        self._publish(job, answered, payload)
        for hook in list(self.hooks):
            try:
                hook.on_answer(job, computed, answered)
            except Exception:
                log.exception("answer hook %s failed", type(hook).__name__)
        self._count(answered, +1)
        self._record(answered)

    def fail(
        self,
        job: Job,
        code: ErrorCode,
        message: str,
        *,
        model: ModelRef | None = None,
        provider: str | None = None,
    ) -> None:
        """Answer `job` with an error (`model`, `provider`: what would have served it)."""
        result = error_result(job.request.id, code, message, timestamp="", model=model, provider=provider)
        self.send(job, result)

    def refuse(self, refusal: Refusal, arrived: float) -> None:
        """An error for a request that never became a job (bad payload, refused reply topic)."""
        job = Job(Request(id=refusal.request_id or ""), refusal.reply, arrived)
        self.send(job, error_result(refusal.request_id, refusal.code, refusal.message, timestamp=""))

    def _settle(self, job: Job, result: Result) -> bool:
        """Claim the job and let go of what waits on it; True when there is an answer to publish."""
        if not job.claim():
            return False
        if job.counted:
            self.inflight.leave()
        if job.on_done is not None:
            job.on_done()
        if job.discard:
            result.to_json()  # a self-test warms the encoding too
            return False
        return True

    def _finish(self, job: Job, result: Result, now: float) -> Result:
        """The latency figures completed (an edge result's postprocess is what the stages left) and
        the time stamped."""
        lat = result.latency_ms
        total_ms = (now - job.arrived) * 1000
        if result.status == "ok" and result.placement == "edge":
            lat.postprocess = max(0.0, total_ms - lat.queue - lat.decode - lat.inference)
        lat.total = total_ms
        result.timestamp = iso_utc(self.wall())
        return result

    @staticmethod
    def _in_time(job: Job, result: Result, now: float) -> Result:
        """DEADLINE_EXCEEDED in place of a result ready after its deadline: the client has given up on
        it, and an `ok` would say it was in time. The timings stay, so it says where the time went."""
        if result.status != "ok" or job.deadline is None or now <= job.deadline:
            return result
        late_ms = (now - job.deadline) * 1000
        late = _instead(
            result, ErrorCode.DEADLINE_EXCEEDED, f"the result was ready {late_ms:.0f} ms after the deadline"
        )
        late.batch_size = result.batch_size
        return late

    def _encode(self, job: Job, result: Result) -> tuple[Result, bytes]:
        """The payload in the asked format; TOO_LARGE in place of one IoT Core would refuse (the
        client would hear nothing) or one whose IPC message would pass `max_ipc_bytes`."""
        if result.status == "ok" and "dlr" in (job.request.result_format, self.result_format):
            doc: dict[str, Any] = {"id": result.id, "status": "ok", **result.to_dlr_dict()}
            payload = json.dumps(doc, separators=(",", ":")).encode()
        else:
            payload = result.to_json()
        if job.reply.bus == "iot" and not fits_iot_core(payload):
            why = f"the result is {len(payload)} bytes, over IoT Core's {IOT_CORE_MAX_BYTES}: ask for less"
            result = _instead(result, ErrorCode.TOO_LARGE, why)
            payload = result.to_json()
        framed = framed_size(job.reply.topic, len(payload), job.reply.properties)
        if result.status == "ok" and framed > self.max_ipc_bytes:
            why = (
                f"the result takes a {framed}-byte IPC message, over the {self.max_ipc_bytes} the runtime "
                "sends: ask for fewer (max_detections / top_k)"
            )
            result = _instead(result, ErrorCode.TOO_LARGE, why)
            payload = result.to_json()
        return result, payload

    def _publish(self, job: Job, result: Result, payload: bytes) -> None:
        # Not waiting for the nucleus: the answering thread goes on at once; a refusal comes back
        # through `_published`.
        reply = job.reply
        forward = self.forward
        if forward is not None and job.source is not None and reply.bus == "iot":
            forward.submit(payload, reply.topic)  # a stream nobody waits on: kept until IoT Core is back
            return
        try:
            self.bus.publish_nowait(
                reply.topic,
                payload,
                target=reply.bus,
                qos=1 if reply.bus == "iot" else 0,
                on_done=lambda exc: self._published(job, result, exc),
                properties=reply.properties,
            )
        except TransportError as exc:
            self._publish_failed(job, exc)

    def _published(self, job: Job, result: Result, exc: TransportError | None) -> None:
        """The nucleus's answer to a result's publish (on a transport thread). A `reply_to` it refuses
        still gets its one answer: BAD_REQUEST on the default topic, which the recipe grants."""
        if exc is None:
            return
        default = result_topic(self.thing)
        if not isinstance(exc, UnauthorizedError) or job.reply.topic == default:
            self._publish_failed(job, exc)
            return
        log.warning("reply_to %s refused by the nucleus: %s", job.reply.topic, exc)
        err = error_result(
            result.id,
            ErrorCode.BAD_REQUEST,
            f"'reply_to' {job.reply.topic!r} is not a topic this component may publish to",
            timestamp=result.timestamp,
            latency=Latency(total=result.latency_ms.total),
            model=result.model,
            provider=result.provider,
        )
        self._count(result, -1)
        self._count(err, +1)
        try:
            self.bus.publish_nowait(
                default,
                err.to_json(),
                target=job.reply.bus,
                on_done=lambda exc2: self._publish_failed(job, exc2),
                properties=job.reply.properties,
            )
        except TransportError as exc2:
            self._publish_failed(job, exc2)

    def _publish_failed(self, job: Job, exc: Exception | None) -> None:
        if exc is None:
            return
        with self._stats_lock:
            self.stats.publish_failures += 1
        log.warning("result of %s not published on %s: %s", job.request.id, job.reply.topic, exc)

    # -------------------------------------------------------------------------------------- records

    def _count(self, result: Result, n: int) -> None:
        with self._stats_lock:
            if result.status == "ok":
                self.stats.ok += n
            elif result.error is not None:
                code = result.error.code.value
                self.stats.errors[code] = self.stats.errors.get(code, 0) + n

    def _record(self, result: Result) -> None:
        """The answer's timing record, with the model that answered and its top answer: every result
        passes here, so telemetry sees each model's identity and confidence."""
        record = TimingRecord(
            id=result.id,
            status=result.status,
            latency_ms=result.latency_ms,
            batch_size=result.batch_size,
            provider=result.provider,
            placement=result.placement,
            code=result.error.code if result.error else None,
            offloaded=result.placement == "cloud",
            queue_depth=self.queue_depth(),
            end=self.wall(),
            model=result.model,
        )
        if result.status == "ok" and result.model is not None:
            if result.detections is not None:
                best = sorted(result.detections, key=lambda d: d.score, reverse=True)[:TIMED_DETECTIONS]
                record.top = tuple(Prediction(d.index, d.label, d.score) for d in best)
                record.detector = True
            elif result.predictions:
                record.top = (result.predictions[0],)
        self.timings.record(record)


def _instead(result: Result, code: ErrorCode, message: str) -> Result:
    """An error answer in place of `result`, keeping where and how it was computed."""
    return error_result(
        result.id,
        code,
        message,
        timestamp=result.timestamp,
        latency=result.latency_ms,
        placement=result.placement,
        model=result.model,
        provider=result.provider,
    )
