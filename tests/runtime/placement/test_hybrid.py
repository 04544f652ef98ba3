"""Runtime + placement policy + cloud router together, over a real mosquitto with the awsiotsdk client.

The router is stopped mid-run: the breaker opens and requests are served locally, none lost; the
router comes back: offloading resumes. Every request gets exactly one answer throughout.
"""

from __future__ import annotations

import base64
import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from edgeinfer.messages import (
    OffloadRequest,
    Prediction,
    Result,
    infer_topic,
    offload_result_topic,
    offload_topic,
    result_topic,
)
from edgeinfer.runtime.config import RuntimeConfig
from edgeinfer.runtime.engine import Engine
from edgeinfer.runtime.placement import BreakerState, HybridPlacement, OffloadConfig, OffloadPolicy
from edgeinfer.runtime.server import InferenceServer
from edgeinfer.sim.broker import MosquittoBroker
from edgeinfer.transport import MemoryBus, Message
from edgeinfer.transport.mqtt import MqttPubSub
from edgeinfer_bench.offload import EdgeBus
from edgeinfer_cloud.router.backends import OnnxBackend
from edgeinfer_cloud.router.router import Router, RouterConfig
from tests.helpers import images
from tests.helpers.images import solid_jpeg
from tests.helpers.wait import wait_for

THING = "edge-1"
CLASSIC_IPC_MAX = 16 * 1024 * 1024  # maxIpcMessageBytes of a classic-only deployment


# Local pub/sub in memory; `iot` goes to the real broker (what the nucleus's IoT Core bridge does).
SplitBus = EdgeBus


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[MosquittoBroker]:
    b = MosquittoBroker(work_dir=tmp_path / "mqtt").start()
    yield b
    b.stop()


class CloudRouter:
    def __init__(self, broker: MosquittoBroker, store: Path) -> None:
        self.client = MqttPubSub.connect_tcp(broker.host, broker.port)
        self.router = Router(self.client, OnnxBackend.load(store, max_batch_size=4), RouterConfig()).start()

    def stop(self) -> None:
        self.router.stop()
        self.client.close()


class MemoryCloud:
    """The cloud on a MemoryBus: answers each offload with one `label` prediction while `on`, and
    keeps what it was asked."""

    def __init__(self, bus: MemoryBus, label: str) -> None:
        self.bus = bus
        self.label = label
        self.on = True
        self.asked: list[OffloadRequest] = []
        bus.subscribe(offload_topic(THING), self._answer, target="iot")

    def _answer(self, message: Message) -> None:
        req = OffloadRequest.parse(message.payload)
        self.asked.append(req)
        if self.on:
            answer = Result(req.request.id, "ok", "", [Prediction(5, self.label, 0.9)], placement="cloud")
            self.bus.publish(offload_result_topic(THING), answer.to_json(), target="iot")


@contextlib.contextmanager
def hybrid_server(
    engine: Engine, cfg: RuntimeConfig, config: OffloadConfig
) -> Iterator[tuple[MemoryBus, HybridPlacement]]:
    """A started server on a MemoryBus with a HybridPlacement of `config` (the tiny model local)."""
    bus = MemoryBus()
    server = InferenceServer(bus, engine, cfg, THING)
    hybrid = HybridPlacement(bus, THING, OffloadPolicy(config, local_models=["tiny"])).start()
    server.set_placement(hybrid, hybrid)
    server.start()
    try:
        yield bus, hybrid
    finally:
        server.stop()
        hybrid.stop()


def test_router_down_breaker_opens_served_locally_router_back_offloading_resumes(
    broker: MosquittoBroker, make_engine: Callable[..., Engine], tiny_store: Path
) -> None:
    cfg = RuntimeConfig(max_batch_size=4, subscribe_iot=False)
    edge_iot = MqttPubSub.connect_tcp(broker.host, broker.port, client_id="edge-1")
    bus = SplitBus(edge_iot)
    engine = make_engine(cfg)
    server = InferenceServer(bus, engine, cfg, THING)
    policy: OffloadPolicy[Any] = OffloadPolicy(
        OffloadConfig(
            cloud_timeout_ms=400, breaker_failures=2, breaker_cooldown_s=0.5, breaker_max_cooldown_s=1
        ),
        max_batch_size=4,
        local_models=[engine.manifest.name],
    )
    hybrid = HybridPlacement(bus, THING, policy).start()
    server.set_placement(hybrid, hybrid)
    server.start()
    answers: dict[str, list[Result]] = {}
    lock = threading.Lock()

    def on_result(message: Message) -> None:
        result = Result.parse(message.payload)
        with lock:
            answers.setdefault(result.id or "", []).append(result)

    bus.subscribe(result_topic(THING), on_result)
    image = base64.b64encode(solid_jpeg((10, 250, 10))).decode()

    def send(rid: str) -> None:
        doc = {"id": rid, "image": image, "offload": "always", "top_k": 1}
        bus.publish(infer_topic(THING), json.dumps(doc).encode())

    def placement(rid: str) -> str | None:
        with lock:
            got = answers.get(rid)
        return got[0].placement if got else None

    cloud = CloudRouter(broker, tiny_store)
    try:
        # 1. the router is up: offloaded requests are answered by the cloud
        for i in range(4):
            send(f"up{i}")
        assert wait_for(lambda: all(placement(f"up{i}") for i in range(4)))
        assert [placement(f"up{i}") for i in range(4)] == ["cloud"] * 4
        assert wait_for(lambda: policy.breaker.state is BreakerState.CLOSED)

        # 2. the router stops mid-run: late offloads are served locally, the breaker opens
        cloud.stop()
        for i in range(8):
            send(f"down{i}")
            time.sleep(0.05)
        assert wait_for(lambda: all(placement(f"down{i}") for i in range(8)))
        assert {placement(f"down{i}") for i in range(8)} == {"edge"}
        assert wait_for(lambda: policy.breaker.opened_count >= 1)
        assert all(answers[f"down{i}"][0].status == "ok" for i in range(8))

        # 3. the router is back: after the cooldown a probe succeeds and offloading resumes
        cloud = CloudRouter(broker, tiny_store)
        n = 0
        while placement(f"back{n - 1}") != "cloud" and n < 200:
            send(f"back{n}")
            assert wait_for(lambda n=n: placement(f"back{n}") is not None)  # type: ignore[misc]
            n += 1
            time.sleep(0.05)
        assert placement(f"back{n - 1}") == "cloud"
        assert wait_for(lambda: policy.breaker.state is BreakerState.CLOSED)
        for i in range(4):
            send(f"again{i}")
        assert wait_for(lambda: all(placement(f"again{i}") for i in range(4)))
        assert [placement(f"again{i}") for i in range(4)] == ["cloud"] * 4

        # exactly one answer per request, even with late cloud answers around
        time.sleep(0.6)
        sent = 4 + 8 + n + 4
        with lock:
            assert len(answers) == sent
            assert all(len(v) == 1 for v in answers.values()), {k: len(v) for k, v in answers.items()}
    finally:
        cloud.stop()
        server.stop()
        hybrid.stop()
        edge_iot.close()


def test_low_confidence_cascade_asks_the_cloud_and_falls_back_to_the_held_answer(
    make_engine: Callable[..., Engine],
) -> None:
    cfg = RuntimeConfig(max_batch_size=2)
    config = OffloadConfig(cascade_threshold=0.5, cloud_timeout_ms=200, cloud_model="lite2")
    with hybrid_server(make_engine(cfg), cfg, config) as (bus, _):
        cloud = MemoryCloud(bus, "heavy")
        grey = base64.b64encode(solid_jpeg((128, 128, 128))).decode()
        red = base64.b64encode(solid_jpeg((250, 1, 1))).decode()
        for rid, img in (("unsure", grey), ("sure", red)):
            bus.publish(infer_topic(THING), json.dumps({"id": rid, "image": img}).encode())
        assert wait_for(lambda: len(bus.messages_on(result_topic(THING))) == 2)
        res = {r.id: r for r in (Result.parse(m.payload) for m in bus.messages_on(result_topic(THING)))}
        assert res["unsure"].placement == "cloud"
        assert res["unsure"].predictions[0].label == "heavy"
        assert res["sure"].placement == "edge"
        # only the unsure one went, to the heavy model
        assert [a.request.model for a in cloud.asked] == ["lite2"]
        # the cloud stays silent: the held edge answer goes out after the wait, exactly once
        cloud.on = False
        bus.publish(infer_topic(THING), json.dumps({"id": "unsure2", "image": grey}).encode())
        assert wait_for(lambda: len(bus.messages_on(result_topic(THING))) == 3)
        time.sleep(0.3)
        last = [Result.parse(m.payload) for m in bus.messages_on(result_topic(THING))]
        assert len(last) == 3
        assert last[-1].id == "unsure2"
        assert last[-1].placement == "edge"
        assert last[-1].predictions[0].score < 0.5


def test_create_placement_is_opt_in(make_engine: Callable[..., Engine]) -> None:
    from edgeinfer.runtime.placement import EdgeOnly, create_placement

    bus = MemoryBus()
    engine = make_engine(RuntimeConfig(max_batch_size=2))
    policy, offloader = create_placement(bus, RuntimeConfig(), THING, engine=engine)
    assert isinstance(policy, EdgeOnly)
    assert offloader is None
    cfg = RuntimeConfig(placement={"enabled": True, "cascadeThreshold": 0.3})
    policy, offloader = create_placement(bus, cfg, THING, engine=engine)
    assert isinstance(policy, HybridPlacement)
    try:
        assert offloader is policy
        assert policy.policy.config.cascade_threshold == 0.3
        assert policy.policy.local_models >= {"tiny"}
        assert policy.policy.service.fit.coef is not None  # seeded from the warm-up
        assert bus.messages_on("#") == []
    finally:
        policy.stop()


def test_hybrid_decide_maps_onto_the_seam() -> None:
    from edgeinfer.messages import ErrorCode, Request
    from edgeinfer.runtime.placement import PlacementContext

    bus = MemoryBus()
    hybrid = HybridPlacement(bus, THING, OffloadPolicy(OffloadConfig(), local_models=["tiny"]))

    def ctx(outstanding: int = 0, left: float | None = 100.0) -> PlacementContext:
        return PlacementContext(THING, "local", 0, outstanding, 64, 8, 0.0, 0.0, left, "cpu")

    assert hybrid.decide(Request("p", image_path="/x.jpg"), ctx()).where == "edge"
    refused = hybrid.decide(Request("q", image_path="/x.jpg", model="lite2"), ctx())
    assert refused.where == "reject"
    assert refused.code is ErrorCode.BAD_REQUEST
    assert hybrid.decide(Request("m", image=b"jpg", model="lite2"), ctx()).where == "cloud"
    assert hybrid.decide(Request("e", image=b"jpg"), ctx()).where == "edge"
    late = hybrid.decide(Request("d", image=b"jpg", deadline_ms=1), ctx(left=1.0))
    assert late.where == "reject"
    assert late.code is ErrorCode.DEADLINE_EXCEEDED


def test_offload_with_the_bus_offline_is_served_locally_at_once() -> None:
    from edgeinfer.messages import Request
    from edgeinfer.runtime.placement import PlacementContext

    bus = MemoryBus(fail_publish=True)
    hybrid = HybridPlacement(bus, THING, OffloadPolicy(OffloadConfig(breaker_failures=1)))
    served: list[str] = []
    replies: list[Result] = []
    ctx = PlacementContext(
        THING, "local", 0, 0, 64, 8, 0.0, 0.0, None, "cpu", local=lambda: served.append("x")
    )
    hybrid.offload(Request("o", image=b"jpg", offload="always"), ctx, replies.append)
    assert served == ["x"]
    assert replies == []
    assert hybrid.policy.breaker.state is BreakerState.OPEN
    assert hybrid.policy.inflight == 0


def _ctx(served: list[str], left: float | None = None) -> Any:
    from edgeinfer.runtime.placement import PlacementContext

    return PlacementContext(
        THING, "local", 0, 0, 64, 8, 0.0, 0.0, left, "cpu", local=lambda: served.append("x")
    )


def test_an_offload_over_the_ipc_message_cap_is_not_published_and_is_served_here() -> None:
    from edgeinfer.messages import IPC_MAX_BYTES, Request, offload_topic

    photo = images.photo((640, 480))
    assert len(photo) > IPC_MAX_BYTES
    bus = MemoryBus()
    hybrid = HybridPlacement(bus, THING, OffloadPolicy(OffloadConfig()))  # the default cap: lite's
    assert hybrid.max_ipc_bytes == IPC_MAX_BYTES
    served: list[str] = []
    replies: list[Result] = []
    try:
        hybrid.offload(Request("big", image=photo, offload="always"), _ctx(served), replies.append)
        assert wait_for(lambda: served == ["x"], 10)
    finally:
        hybrid.stop()
    assert bus.messages_on(offload_topic(THING)) == []  # nucleus lite would close the connection
    assert replies == []
    assert hybrid.policy.inflight == 0
    assert hybrid.policy.breaker.state is BreakerState.CLOSED  # not the cloud's failure
    small = HybridPlacement(bus, THING, OffloadPolicy(OffloadConfig()))
    try:
        small.offload(Request("small", image=b"jpg", offload="always"), _ctx([]), replies.append)
        assert len(bus.messages_on(offload_topic(THING))) == 1
    finally:
        small.stop()


def test_a_live_ipc_cap_reaches_a_running_placement() -> None:
    from edgeinfer.messages import IPC_MAX_BYTES, Request, offload_topic

    photo = images.photo((640, 480))
    assert len(photo) > IPC_MAX_BYTES
    bus = MemoryBus()
    hybrid = HybridPlacement(bus, THING, OffloadPolicy(OffloadConfig())).start()
    try:
        hybrid.apply_config(RuntimeConfig(max_ipc_message_bytes=CLASSIC_IPC_MAX))
        hybrid.offload(Request("big", image=photo, offload="always"), _ctx([]), lambda _: None)
        assert wait_for(lambda: len(bus.messages_on(offload_topic(THING))) == 1, 10)
    finally:
        hybrid.stop()


def test_a_1080p_offload_is_re_encoded_at_the_models_size_and_fits_through_iot_core() -> None:
    import cv2
    import numpy as np

    from edgeinfer.messages import IOT_CORE_MAX_BYTES, OffloadRequest, Request, offload_topic

    photo = images.photo((1920, 1080))
    assert len(base64.b64encode(photo)) > IOT_CORE_MAX_BYTES  # as it came, it would not fit
    bus = MemoryBus()
    hybrid = HybridPlacement(
        bus,
        THING,
        OffloadPolicy(OffloadConfig()),
        image_side=256,
        image_keep=224,
        max_ipc_bytes=CLASSIC_IPC_MAX,
    )
    served: list[str] = []
    try:
        hybrid.offload(Request("hd", image=photo, offload="always"), _ctx(served), lambda r: None)
        assert wait_for(lambda: len(bus.messages_on(offload_topic(THING))) == 1, 10)
    finally:
        hybrid.stop()
    (msg,) = bus.messages_on(offload_topic(THING))
    assert len(msg.payload) < IOT_CORE_MAX_BYTES
    sent = OffloadRequest.parse(msg.payload).request.image
    assert sent is not None
    img = cv2.imdecode(np.frombuffer(sent, dtype=np.uint8), cv2.IMREAD_COLOR)
    assert img is not None
    assert min(img.shape[:2]) == 256
    assert img.shape[1] / img.shape[0] == pytest.approx(1920 / 1080, rel=0.01)
    assert served == ["x"]  # served locally when the offload's time ran out at stop (no router here)


def test_an_offloads_budget_loses_the_time_it_waited_for_its_re_encode() -> None:
    from edgeinfer.messages import OffloadRequest, Request, offload_topic
    from tests.helpers.clock import FakeClock

    class SlowEncoderClock(FakeClock):
        """Each reading is 40 ms after the one before: the encoder thread's reading comes later."""

        def __call__(self) -> float:
            self.now += 0.04
            return self.now

    clock = SlowEncoderClock()
    bus = MemoryBus()
    policy: OffloadPolicy[Any] = OffloadPolicy(OffloadConfig(), clock=clock)
    hybrid = HybridPlacement(
        bus, THING, policy, image_side=256, image_keep=224, max_ipc_bytes=CLASSIC_IPC_MAX, clock=clock
    )
    try:
        hybrid.offload(
            Request("hd", image=images.photo((1920, 1080)), offload="always"),
            _ctx([], left=500.0),
            lambda r: None,
        )
        assert wait_for(lambda: len(bus.messages_on(offload_topic(THING))) == 1, 10)
    finally:
        hybrid.stop()
    (msg,) = bus.messages_on(offload_topic(THING))
    origin = OffloadRequest.parse(msg.payload).origin
    assert origin.deadline_left_ms is not None
    # The router counts what is left from `origin.sent_at`, stamped when it was sent: what the
    # re-encode took is gone from it, so the cloud does not answer "in time" after the deadline.
    assert origin.deadline_left_ms < 500.0
    assert origin.deadline_left_ms >= 500.0 - 40.0 * 10


def test_an_offload_that_cannot_fit_is_served_locally_and_is_not_a_cloud_failure() -> None:
    from edgeinfer.messages import Request, offload_topic

    bus = MemoryBus()
    hybrid = HybridPlacement(bus, THING, OffloadPolicy(OffloadConfig(breaker_failures=1)), image_side=256)
    served: list[str] = []
    # 140,000 bytes that are no image: nothing to re-encode, and over 128 KB as they are.
    hybrid.offload(Request("big", image=b"\x01" * 140_000, offload="always"), _ctx(served), lambda r: None)
    assert served == ["x"]
    assert bus.messages_on(offload_topic(THING)) == []  # never handed to the nucleus
    assert hybrid.policy.breaker.state is BreakerState.CLOSED
    assert hybrid.policy.breaker.consecutive_failures == 0
    assert hybrid.policy.counters["too_large"] == 1
    assert hybrid.policy.inflight == 0
    assert hybrid.policy.publishing == 0


class HoldingBus(MemoryBus):
    """A nucleus that takes publishes but never reports them done (its in-flight window is full)."""

    def publish_nowait(self, topic: str, payload: bytes, **kw: Any) -> None:
        kw.pop("on_done", None)
        self.publish(topic, payload, **kw)


def test_no_more_offloads_than_the_nucleus_keeps_in_flight() -> None:
    from edgeinfer.messages import Request, offload_topic

    bus = HoldingBus()
    hybrid = HybridPlacement(bus, THING, OffloadPolicy(OffloadConfig()))
    served: list[str] = []
    ctx = _ctx(served)
    decisions = []
    for i in range(8):
        req = Request(f"a{i}", image=b"jpg", offload="always")
        decision = hybrid.decide(req, ctx)
        decisions.append(decision.where)
        if decision.where == "cloud":
            hybrid.offload(req, ctx, lambda r: None)
    assert decisions == ["cloud"] * 5 + ["edge"] * 3  # maxInflightPublishes 5, as the nucleus
    assert len(bus.messages_on(offload_topic(THING))) == 5
    assert hybrid.policy.publishing == 5


def test_a_cloud_answer_to_a_re_encoded_offload_has_its_boxes_in_the_request_pixels() -> None:
    from edgeinfer.messages import (
        Box,
        Detection,
        OffloadRequest,
        Request,
        offload_result_topic,
        offload_topic,
    )

    bus = MemoryBus()
    hybrid = HybridPlacement(
        bus, THING, OffloadPolicy(OffloadConfig()), image_side=270, max_ipc_bytes=CLASSIC_IPC_MAX
    ).start()
    replies: list[Result] = []
    try:
        hybrid.offload(
            Request("det", image=images.photo((1920, 1080)), offload="always"), _ctx([]), replies.append
        )
        assert wait_for(lambda: len(bus.messages_on(offload_topic(THING))) == 1, 10)
        sent = OffloadRequest.parse(bus.messages_on(offload_topic(THING))[0].payload).request
        answer = Result(
            sent.id,
            "ok",
            "",
            placement="cloud",
            detections=[Detection(0, "dog", 0.9, Box(10, 20, 100, 200))],  # in the 480×270 image
        )
        bus.publish(offload_result_topic(THING), answer.to_json(), target="iot")
        assert wait_for(lambda: len(replies) == 1, 10)
    finally:
        hybrid.stop()
    (result,) = replies
    assert result.id == "det"
    assert result.detections is not None
    box = result.detections[0].box
    assert (box.x_min, box.y_min, box.x_max, box.y_max) == pytest.approx((40, 80, 400, 800))


def test_the_lag_upstream_reaches_the_policy_and_counts_in_a_cascades_budget() -> None:
    from edgeinfer.messages import Latency, Prediction, Request
    from edgeinfer.runtime.placement import PlacementContext
    from tests.helpers.clock import FakeClock

    clock, wall = FakeClock(), FakeClock(1_800_000_000.0)
    config = OffloadConfig(cascade_threshold=0.5)
    hybrid = HybridPlacement(
        MemoryBus(), THING, OffloadPolicy(config, local_models=["tiny"], clock=clock), clock=clock, wall=wall
    )

    def ctx(age: float | None, left: float) -> PlacementContext:
        return PlacementContext(THING, "iot", 0, 0, 64, 8, 0.0, 0.0, left, "cpu", age_ms=age)

    for i in range(3):  # the time a request spent on the way is the policy's lag
        clock.advance(0.01)
        hybrid.decide(Request(f"d{i}", image=b"jpg", deadline_ms=100), ctx(age=70, left=30))
    assert hybrid.policy.behind() is not None
    other = HybridPlacement(MemoryBus(), THING, OffloadPolicy(config, clock=clock), clock=clock)
    for _ in range(3):  # answered DEADLINE_EXCEEDED on arrival: never asked to `decide`
        other.on_late_arrival(None, -5.0)
    assert other.policy.behind() == "an arrival past its deadline"

    unsure = Result("c", "ok", "", [Prediction(1, "x", 0.2)], latency_ms=Latency(queue=1, inference=4))
    replies: list[Result] = []
    fresh = Request("c", image=b"jpg", deadline_ms=100)
    assert hybrid.cascade(fresh, unsure, replies.append)  # 95 ms left: time for the cloud's ~60
    stale = Request("s", image=b"jpg", deadline_ms=100, sent_at=wall() - 0.090)
    assert not hybrid.cascade(stale, unsure, replies.append)  # 90 of its 100 ms spent upstream
    due = Request("t", image=b"jpg", deadline_at=wall() + 0.010)
    assert not hybrid.cascade(due, unsure, replies.append)  # its absolute deadline bounds it too
    hybrid.stop()
    assert replies == [unsure]  # the cascade's held edge answer, once


def test_requests_arriving_late_over_the_bus_are_offloaded_though_the_edge_is_idle(
    make_engine: Callable[..., Engine],
) -> None:
    """The whole path: the server shows the policy each request's lag; three that spent 60 % of
    their deadline on the way put the device behind, and the next goes to the cloud, which the
    light-load rule and the idle edge would have kept here."""
    from edgeinfer.messages import iso_utc

    cfg = RuntimeConfig(max_batch_size=2)
    with hybrid_server(make_engine(cfg), cfg, OffloadConfig(backlog_hold_s=60.0)) as (bus, hybrid):
        MemoryCloud(bus, "cloudy")
        img = base64.b64encode(solid_jpeg((250, 1, 1))).decode()

        def send(rid: str, lag_s: float) -> None:
            doc = {"id": rid, "image": img, "deadline_ms": 10_000, "sent_at": iso_utc(time.time() - lag_s)}
            bus.publish(infer_topic(THING), json.dumps(doc).encode())

        send("fresh", 0.0)
        for i in range(4):
            send(f"late{i}", 6.0)  # 6 of its 10 s spent upstream
        assert wait_for(lambda: len(bus.messages_on(result_topic(THING))) == 5)
        results = [Result.parse(m.payload) for m in bus.messages_on(result_topic(THING))]
        where = {r.id: r.placement for r in results}
        assert where == {
            "fresh": "edge",
            "late0": "edge",
            "late1": "edge",
            "late2": "cloud",
            "late3": "cloud",
        }
        assert hybrid.policy.counters["behind"] == 2
