"""The bus adapter: `HybridPlacement` fills the runtime's placement seam with `OffloadPolicy`.

It is the server's policy and offloader, publishes offloads on `edgeinfer/{thing}/offload`, takes
answers from `edgeinfer/{thing}/offload/result`, serves late ones through the server's edge path, and
gets the engine's batch timings and every result through the seam's hooks. `create_placement` builds
it from the recipe's `placement` object for the runtime component (opt-in: `enabled: true`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgeinfer.messages import (
    IOT_CORE_MAX_BYTES,
    IPC_MAX_BYTES,
    Box,
    ErrorCode,
    OffloadOrigin,
    OffloadRequest,
    Request,
    Result,
    error_result,
    fits_iot_core,
    iso_utc,
    offload_result_topic,
    offload_topic,
)
from edgeinfer.runtime.ipc_frame import framed_size
from edgeinfer.runtime.placement.config import OffloadConfig
from edgeinfer.runtime.placement.ledger import Ticket
from edgeinfer.runtime.placement.policy import OffloadPolicy
from edgeinfer.runtime.placement.seam import (
    EDGE,
    Decision,
    EdgeOnly,
    Offloader,
    PlacementContext,
    PlacementPolicy,
    Reply,
)
from edgeinfer.runtime.placement.wire import needs_reencode, reencode
from edgeinfer.transport import Bus, Message, Subscription, Target, TransportError

if TYPE_CHECKING:
    from edgeinfer.runtime.config import RuntimeConfig
    from edgeinfer.runtime.engine import Engine

__all__ = ["HybridPlacement", "create_placement"]

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    reply: Callable[[Result], None]
    local: Callable[[], None] | None
    scale: float = 1.0  # from the sent (re-encoded) image's pixels to the request's own


class HybridPlacement(PlacementPolicy):
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
        bus: Bus,
        thing: str,
        policy: OffloadPolicy[_Pending] | None = None,
        *,
        target: Target = "iot",
        image_side: int = 0,
        image_keep: int = 0,
        max_ipc_bytes: int = IPC_MAX_BYTES,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.bus = bus
        self.thing = thing
        self.policy: OffloadPolicy[_Pending] = policy or OffloadPolicy(clock=clock)
        self.target = target
        # The shorter side offloaded images are re-encoded to (0: sent as they are).
        self.image_side = self.policy.config.offload_image_side or image_side
        self.image_keep = image_keep  # the pixels the network looks at (its crop of `image_side`)
        # The runtime's `maxIpcMessageBytes`: an offload carries its image, and a PublishToIoTCore
        # over nucleus lite's cap would close the runtime's whole IPC connection.
        self.max_ipc_bytes = max_ipc_bytes
        self._encoder: concurrent.futures.ThreadPoolExecutor | None = None
        self._wire_bytes = 20_000.0  # running mean of re-encoded offload images (for predictions)
        self.clock = clock
        self.wall = wall
        self._sub: Subscription | None = None
        self._wake = threading.Condition()
        self._stopping = threading.Event()
        self._timer: threading.Thread | None = None
        self._ahead: dict[str, int] = {}  # request id -> requests ahead when it was kept here
        self._ahead_lock = threading.Lock()

    @classmethod
    def from_config(
        cls,
        bus: Bus,
        thing: str,
        placement: Mapping[str, object] | None,
        *,
        max_batch_size: int,
        local_models: Iterable[str],
        image_side: int = 0,
        image_keep: int = 0,
        max_ipc_bytes: int = IPC_MAX_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> HybridPlacement:
        """From the runtime recipe's `placement` object (see `OffloadConfig`; raises ConfigError)."""
        cfg = OffloadConfig.from_recipe(placement)
        policy: OffloadPolicy[_Pending] = OffloadPolicy(
            cfg, max_batch_size=max_batch_size, local_models=local_models, clock=clock
        )
        return cls(
            bus,
            thing,
            policy,
            image_side=image_side,
            image_keep=image_keep,
            max_ipc_bytes=max_ipc_bytes,
            clock=clock,
        )

    # ----------------------------------------------------------------------------------- lifecycle

    def start(self) -> HybridPlacement:
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
        if self._encoder is not None:
            self._encoder.shutdown(wait=True)  # what it holds is sent (or served) first
        for ticket in self.policy.drain():
            self._fallback(ticket, "the runtime is stopping")

    # ------------------------------------------------------------------------------- seam: decide

    def decide(self, request: Request, ctx: PlacementContext) -> Decision:
        if request.image is None:  # image_path requests name a local file: never offloaded
            if request.model is not None and request.model not in self.policy.local_models:
                return Decision("reject", ErrorCode.BAD_REQUEST, "image_path requests are not offloaded")
            return EDGE
        decision = self.policy.decide_left(
            request,
            ahead=int(ctx.outstanding),
            payload_bytes=self._payload_estimate(request.image),
            deadline_left_ms=ctx.deadline_left_ms,
            lag_ms=ctx.age_ms,
        )
        if decision.where == "edge":
            with self._ahead_lock:
                if len(self._ahead) < 10_000:
                    self._ahead[request.id] = int(ctx.outstanding)
        return decision

    # ------------------------------------------------------------------------------ seam: offload

    def offload(self, request: Request, ctx: PlacementContext, reply: Reply) -> None:
        now = self.clock()
        left = ctx.deadline_left_ms
        arrived = now
        shadow = request
        if left is not None:  # the policy counts the deadline from arrival: rebuild it from what is left
            shadow = dataclasses.replace(request, deadline_ms=left)
        pending = _Pending(reply, ctx.local)
        ticket = self.policy.begin_offload(
            shadow, pending, payload_bytes=self._payload_estimate(request.image), arrived=arrived, now=now
        )
        # The cloud counts the deadline from `origin` (what is left now): the client's own times stay here.
        wire = dataclasses.replace(request, id=ticket.wire_id, reply_to=None, sent_at=None, deadline_at=None)
        self._dispatch(ticket, wire, left, "offload")

    # ------------------------------------------------------------------------------ seam: cascade

    def cascade(self, request: Request, result: Result, reply: Reply) -> bool:
        """After an edge answer: when its top-1 probability is under `cascadeThreshold`, hold it and ask
        the cloud's (heavier) model. True: taken over — `reply` gets exactly one of the two answers."""
        if request.image is None or result.status != "ok" or not result.predictions:
            return False
        top1 = max(p.score for p in result.predictions)
        left = self._left_after(request, result)
        asked = request if left is None else dataclasses.replace(request, deadline_ms=max(0.0, left))
        if not self.policy.wants_cascade(asked, top1, payload_bytes=len(request.image)):
            return False
        now = self.clock()
        left = self._left_after(request, result)
        shadow = request if left is None else dataclasses.replace(request, deadline_ms=max(0.0, left))
        ticket = self.policy.begin_offload(
            shadow,
            _Pending(reply, None),
            payload_bytes=self._payload_estimate(request.image),
            now=now,
            held=result,
        )
        wire = dataclasses.replace(
            request,
            id=ticket.wire_id,
            reply_to=None,
            model=self.policy.config.cloud_model or None,
            sent_at=None,
            deadline_at=None,
        )
        self._dispatch(ticket, wire, left, "cascade")
        return True

    def _left_after(self, request: Request, result: Result) -> float | None:
        """What is left of `request`'s deadline after the edge's answer `result` (None: no deadline):
        counted from its sending when it says when (the time upstream is spent too), else from its
        arrival here; `deadline_at` bounds it either way."""
        ends: list[float] = []
        wall_ms = self.wall() * 1000.0
        if request.deadline_ms is not None:
            if request.sent_at is not None:
                ends.append(request.sent_at * 1000.0 + request.deadline_ms - wall_ms)
            else:
                lat = result.latency_ms
                ends.append(request.deadline_ms - (lat.queue + lat.decode + lat.inference))
        if request.deadline_at is not None:
            ends.append(request.deadline_at * 1000.0 - wall_ms)
        return min(ends, default=None)

    def _payload_estimate(self, image: bytes | None) -> int:
        """The bytes an offload of `image` will carry (what the cloud latency model is fitted on)."""
        if image is None:
            return 0
        if needs_reencode(image, self.image_side):
            return min(len(image), int(self._wire_bytes))
        return len(image)

    def _dispatch(self, ticket: Ticket[_Pending], wire: Request, left: float | None, what: str) -> None:
        """Send now, or re-encode the image first on the encoder thread (never on the transport's
        thread, which reads the next request meanwhile). At most `maxInflightPublishes` offloads are
        between here and the nucleus: the policy offers no more (`publish_started`)."""
        self.policy.publish_started()
        decided = self.clock()
        if wire.image is None or not needs_reencode(wire.image, self.image_side):
            self._send(ticket, wire, left, what, decided)
            return
        if self._encoder is None:
            self._encoder = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="edgeinfer-offload-encode"
            )
        try:
            self._encoder.submit(self._encode_and_send, ticket, wire, left, what, decided)
        except RuntimeError:  # shutting down: sent as it is
            self._send(ticket, wire, left, what, decided)

    def _encode_and_send(
        self, ticket: Ticket[_Pending], wire: Request, left: float | None, what: str, decided: float
    ) -> None:
        try:
            image, scale = reencode(
                wire.image or b"",
                self.image_side,
                keep=self.image_keep,
                quality=self.policy.config.offload_jpeg_quality,
            )
            ticket.payload_bytes = len(image)
            ticket.item.scale = scale
            self._wire_bytes = 0.9 * self._wire_bytes + 0.1 * len(image)
            wire = dataclasses.replace(wire, image=image)
        except Exception:
            log.exception("re-encoding the offload of %s failed; sending it as it is", ticket.request_id)
        self._send(ticket, wire, left, what, decided)

    def _send(
        self, ticket: Ticket[_Pending], wire: Request, left: float | None, what: str, decided: float
    ) -> None:
        """Publish an offload without waiting for the nucleus; a publish that fails now or is refused
        later is served as the policy says. One that would not fit through IoT Core, or whose IPC
        message would pass `max_ipc_bytes`, is not sent, and is served here without counting against
        the cloud. `left` was what remained when the offload
        was `decided`: the router counts it from the origin's `sent_at`, stamped now, so the time in
        between (the re-encode, the wait for the encoder) comes off it."""
        if left is not None:
            left -= (self.clock() - decided) * 1000.0
        payload = OffloadRequest(wire, OffloadOrigin(self.thing, left, iso_utc(self.wall()))).to_json()
        too_large = self._too_large(what, payload)
        if too_large is not None:
            self.policy.publish_finished()
            if self.policy.cancel(ticket):
                self._fallback(ticket, too_large)
            return
        try:
            self.bus.publish_nowait(
                offload_topic(self.thing),
                payload,
                target=self.target,
                qos=1,
                on_done=lambda exc: self._published(ticket, what, exc),
            )
        except TransportError as exc:
            self._published(ticket, what, exc)
            return
        with self._wake:
            self._wake.notify_all()

    def _too_large(self, what: str, payload: bytes) -> str | None:
        """Why an offload's payload may not be published, or None when it may."""
        if not fits_iot_core(payload):
            return f"the {what} is {len(payload)} bytes, over IoT Core's {IOT_CORE_MAX_BYTES}"
        framed = framed_size(offload_topic(self.thing), len(payload))
        if framed > self.max_ipc_bytes:
            return f"the {what} takes a {framed}-byte IPC message, over the runtime's {self.max_ipc_bytes}"
        return None

    def _published(self, ticket: Ticket[_Pending], what: str, exc: Exception | None) -> None:
        self.policy.publish_finished()
        self._publish_failed(ticket, what, exc)

    def apply_config(self, cfg: RuntimeConfig) -> None:
        """A live `maxIpcMessageBytes` caps the offloads sent from now on (the `placement` object's
        own keys are the component's: a change there builds a new policy)."""
        self.max_ipc_bytes = cfg.max_ipc_message_bytes

    # ------------------------------------------------------------------------------ engine hooks

    def on_late_arrival(self, age_ms: float | None, left_ms: float) -> None:
        """A request answered DEADLINE_EXCEEDED on arrival: a sign of a backlog upstream."""
        self.policy.observe_lag(age_ms, left_ms)

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

    def _on_result(self, message: Message) -> None:
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
            outcome.ticket.item.reply(_in_request_pixels(outcome.result, outcome.ticket.item.scale))

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


def _in_request_pixels(result: Result, scale: float) -> Result:
    """A cloud result's boxes in the pixels of the image the client sent, not of the smaller one the
    offload carried."""
    if scale == 1.0 or not result.detections:
        return result
    result.detections = [
        dataclasses.replace(
            d,
            box=Box(d.box.x_min * scale, d.box.y_min * scale, d.box.x_max * scale, d.box.y_max * scale),
        )
        for d in result.detections
    ]
    return result


def create_placement(
    bus: Bus, cfg: RuntimeConfig, thing: str, *, engine: Engine | None = None
) -> tuple[PlacementPolicy, Offloader | None]:
    """The runtime component's hook (`edgeinfer.runtime.component`): `(policy, offloader)` for the
    server's placement seam from the recipe's `placement` object.

    Offloading is opt-in (`placement.enabled: true`): without a router to answer, every offload would
    only wait for its fallback. Disabled, the server keeps its edge-only default.
    """
    doc = cfg.placement or {}
    # Opt-in: a placement object that does not say `enabled` leaves offloading off (the class's own
    # default is on, for the policy's users outside the component).
    if "enabled" not in doc or not OffloadConfig.from_recipe(doc).enabled:
        return EdgeOnly(), None
    names: list[str] = []
    if engine is not None:
        names = [engine.manifest.name, engine.model_ref.variant]
    hybrid = HybridPlacement.from_config(
        bus,
        thing,
        doc,
        max_batch_size=cfg.max_batch_size,
        local_models=names,
        image_side=engine.input_size if engine is not None else 0,
        image_keep=engine.detail if engine is not None else 0,
        max_ipc_bytes=cfg.max_ipc_message_bytes,
    )
    engine_ms = engine.warmup_ms if engine is not None else {}
    for n, ms in engine_ms.items():  # a first a·n + b from the warm-up, before any real batch
        hybrid.policy.batch_finished(int(n), float(ms))
    log.info("placement: hybrid (offload to the cloud router when only it meets a deadline)")
    return hybrid.start(), hybrid
