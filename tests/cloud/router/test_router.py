"""The router: logic on the in-memory bus, then the real thing over mosquitto with the awsiotsdk client."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from edgeinfer.messages import (
    ErrorCode,
    Latency,
    OffloadOrigin,
    OffloadRequest,
    Request,
    Result,
    StageQuantiles,
    TelemetryWindow,
    iso_utc,
    offload_result_topic,
    offload_topic,
    telemetry_topic,
)
from edgeinfer.sim.broker import MosquittoBroker
from edgeinfer.transport import MemoryBus, Message
from edgeinfer.transport.mqtt import MqttPubSub
from edgeinfer_cloud.router.router import FleetView, Router, RouterConfig, thing_from_topic
from tests.helpers.router import FakeBackend, jpeg
from tests.helpers.wait import wait_for


def offload(
    rid: str, thing: str = "dev-1", *, left_ms: float | None = 1000.0, sent_at: float | None = None, **kw: Any
) -> bytes:
    request = Request(id=rid, image=kw.pop("image", jpeg()), **kw)
    origin = OffloadOrigin(thing, left_ms, iso_utc(time.time() if sent_at is None else sent_at))
    return OffloadRequest(request, origin).to_json()


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def bus() -> MemoryBus:
    return MemoryBus()


@pytest.fixture
def router(bus: MemoryBus, fake_backend: FakeBackend) -> Iterator[Router]:
    r = Router(bus, fake_backend, RouterConfig(group="", known_things=frozenset({"dev-1", "dev-2"})))
    r.start()
    yield r
    r.stop()


def results(bus: MemoryBus, thing: str = "+") -> list[Result]:
    return [Result.parse(m.payload) for m in bus.messages_on(offload_result_topic(thing), "iot")]


def send(bus: MemoryBus, thing: str, payload: bytes) -> None:
    bus.publish(offload_topic(thing), payload, target="iot", qos=1)


# ------------------------------------------------------------------------------ logic (memory bus)


def test_serves_an_offload_and_answers_on_the_origin_topic(bus: MemoryBus, router: Router) -> None:
    send(bus, "dev-1", offload("a", top_k=1))
    assert wait_for(lambda: len(results(bus)) == 1)
    (msg,) = bus.messages_on("edgeinfer/+/offload/result")
    assert msg.topic == "edgeinfer/dev-1/offload/result"
    result = Result.parse(msg.payload)
    assert result.id == "a"
    assert result.status == "ok"
    assert result.placement == "cloud"
    assert result.predictions[0].label == "cock"
    assert result.model is not None
    assert result.model.name == "fake"
    assert result.latency_ms.total >= result.latency_ms.queue


@pytest.mark.parametrize(
    ("payload", "rid", "code"),
    [
        (b"\xff\xfe not json", None, ErrorCode.BAD_REQUEST),
        (b"[1,2,3]", None, ErrorCode.BAD_REQUEST),
        (b'{"id": "x", "image": "aGVsbG8="}', "x", ErrorCode.BAD_REQUEST),  # no origin
        (b'{"id": "y", "origin": {"thing": "dev-1"}}', "y", ErrorCode.BAD_REQUEST),  # no image
        (b'{"id": "z", "image": "!!!", "origin": {"thing": "dev-1"}}', "z", ErrorCode.BAD_IMAGE),
        (
            b'{"id": "p", "image_path": "/etc/passwd", "origin": {"thing": "dev-1"}}',
            "p",
            ErrorCode.BAD_REQUEST,
        ),
        (
            b'{"id": "t", "image": "aGk=", "top_k": 0, "origin": {"thing": "dev-1"}}',
            "t",
            ErrorCode.BAD_REQUEST,
        ),
    ],
)
def test_garbage_gets_a_stable_error_never_a_crash(
    bus: MemoryBus, router: Router, payload: bytes, rid: str | None, code: ErrorCode
) -> None:
    send(bus, "dev-1", payload)
    assert wait_for(lambda: len(results(bus)) == 1)
    (result,) = results(bus, "dev-1")
    assert result.id == rid
    assert result.status == "error"
    assert result.error is not None
    assert result.error.code is code
    assert result.placement == "cloud"
    # and the router still serves the next request
    send(bus, "dev-1", offload("after"))
    assert wait_for(lambda: any(r.id == "after" and r.status == "ok" for r in results(bus)))


def test_too_large_is_refused(bus: MemoryBus, fake_backend: FakeBackend) -> None:
    r = Router(bus, fake_backend, RouterConfig(group="", max_payload_bytes=2000)).start()
    try:
        send(bus, "dev-1", offload("big", image=b"\xff\xd8" + b"x" * 5000))
        assert wait_for(lambda: len(results(bus)) == 1)
        (result,) = results(bus)
        assert result.error is not None
        assert result.error.code is ErrorCode.TOO_LARGE
        assert result.id == "big"
    finally:
        r.stop()


def test_a_device_cannot_make_the_router_answer_on_another_devices_topic(
    bus: MemoryBus, router: Router
) -> None:
    # dev-2 publishes on its own topic but claims to be dev-1
    send(bus, "dev-2", offload("spoof", thing="dev-1"))
    assert wait_for(lambda: len(results(bus)) == 1)
    assert bus.messages_on(offload_result_topic("dev-1")) == []
    (result,) = results(bus, "dev-2")
    assert result.id == "spoof"
    assert result.error is not None
    assert result.error.code is ErrorCode.BAD_REQUEST
    assert "does not match" in result.error.message
    assert router.backend.calls == []  # type: ignore[attr-defined]


def test_unknown_thing_and_unknown_model(bus: MemoryBus, router: Router) -> None:
    send(bus, "stranger", offload("u", thing="stranger"))
    send(bus, "dev-1", offload("m", model="resnet-9000"))
    assert wait_for(lambda: len(results(bus)) == 2)
    by_id = {r.id: r for r in results(bus)}
    assert by_id["u"].error is not None
    assert by_id["u"].error.code is ErrorCode.BAD_REQUEST
    assert bus.messages_on(offload_result_topic("stranger"))
    assert by_id["m"].error is not None
    assert by_id["m"].error.code is ErrorCode.BAD_REQUEST


def test_past_deadline_on_arrival_is_not_computed(bus: MemoryBus, router: Router) -> None:
    send(bus, "dev-1", offload("late", left_ms=0))
    send(bus, "dev-1", offload("old", left_ms=50.0, sent_at=time.time() - 1.0))
    assert wait_for(lambda: len(results(bus)) == 2)
    for result in results(bus):
        assert result.error is not None
        assert result.error.code is ErrorCode.DEADLINE_EXCEEDED
    assert router.backend.calls == []  # type: ignore[attr-defined]


def test_deadline_passing_in_the_queue_is_answered_without_computing(
    bus: MemoryBus, fake_backend: FakeBackend
) -> None:
    clock = Clock()
    r = Router(bus, fake_backend, RouterConfig(group="", trust_sent_at=False), clock=clock)
    fake_backend.gate.clear()  # hold the worker inside infer()
    r.start()
    try:
        send(bus, "dev-1", offload("first", left_ms=None))
        # Inside infer(), not only off the queue: taken, it could still batch the second one with it.
        assert wait_for(lambda: fake_backend.entered == 1)  # the worker waits on the gate
        send(bus, "dev-1", offload("second", left_ms=100))
        clock.t += 1.0  # the second one's deadline passes while it waits
        fake_backend.gate.set()
        assert wait_for(lambda: len(results(bus)) == 2)
        by_id = {x.id: x for x in results(bus)}
        assert by_id["first"].status == "ok"
        assert by_id["second"].error is not None
        assert by_id["second"].error.code is ErrorCode.DEADLINE_EXCEEDED
        assert fake_backend.calls == [1]
    finally:
        r.stop()


def test_backend_error_is_internal_and_bad_image_is_bad_image(
    bus: MemoryBus, router: Router, fake_backend: FakeBackend
) -> None:
    send(bus, "dev-1", offload("bad", image=b"BAD image"))
    assert wait_for(lambda: len(results(bus)) == 1)
    fake_backend.fail = "session crashed"
    send(bus, "dev-1", offload("boom"))
    assert wait_for(lambda: len(results(bus)) == 2)
    by_id = {x.id: x for x in results(bus)}
    assert by_id["bad"].error is not None
    assert by_id["bad"].error.code is ErrorCode.BAD_IMAGE
    assert by_id["boom"].error is not None
    assert by_id["boom"].error.code is ErrorCode.INTERNAL
    fake_backend.fail = None
    send(bus, "dev-1", offload("fine"))
    assert wait_for(lambda: any(x.id == "fine" and x.status == "ok" for x in results(bus)))


def test_full_queue_answers_overloaded(bus: MemoryBus, fake_backend: FakeBackend) -> None:
    fake_backend.gate.clear()
    r = Router(bus, fake_backend, RouterConfig(group="", max_queue=2, max_batch_size=1)).start()
    try:
        for i in range(6):
            send(bus, "dev-1", offload(f"q{i}"))
        overloaded = [x for x in results(bus) if x.error and x.error.code is ErrorCode.OVERLOADED]
        assert len(overloaded) >= 3  # one in the worker, two queued, the rest refused at once
        fake_backend.gate.set()
        assert wait_for(lambda: len(results(bus)) == 6)
        assert sorted(x.id or "" for x in results(bus)) == [f"q{i}" for i in range(6)]
    finally:
        r.stop()


def test_stop_answers_everything_already_taken(bus: MemoryBus, fake_backend: FakeBackend) -> None:
    fake_backend.gate.clear()
    r = Router(bus, fake_backend, RouterConfig(group="", max_batch_size=1)).start()
    for i in range(5):
        send(bus, "dev-1", offload(f"s{i}"))
    threading.Timer(0.2, fake_backend.gate.set).start()
    r.stop()
    assert sorted(x.id or "" for x in results(bus)) == [f"s{i}" for i in range(5)]


def test_fleet_view_from_telemetry(bus: MemoryBus, router: Router) -> None:
    def window(thing: str, seq: int) -> bytes:
        return TelemetryWindow(
            thing=thing,
            seq=seq,
            window_s=10,
            count=100,
            errors={"BAD_IMAGE": 2},
            dropped=0,
            offloaded=7,
            throughput_rps=10.0,
            latency_ms={"total": StageQuantiles(5, 8, 12, 20)},
            batch={"executions": 50, "mean_size": 2.0},
            queue_depth={"mean": 1.0, "max": 3},
            provider="cpu",
            system={},
            timestamp=iso_utc(0),
        ).to_json()

    bus.publish(telemetry_topic("dev-1"), window("dev-1", 3), target="iot")
    bus.publish(telemetry_topic("dev-1"), window("dev-1", 2), target="iot")  # late spooled window
    bus.publish(telemetry_topic("dev-2"), b"garbage", target="iot")
    bus.publish(telemetry_topic("dev-2"), window("dev-1", 9), target="iot")  # wrong thing
    view = router.fleet.snapshot()
    assert list(view) == ["dev-1"]
    assert view["dev-1"]["seq"] == 3
    assert view["dev-1"]["p99_ms"] == 12
    assert view["dev-1"]["offloaded"] == 7
    assert router.fleet.bad_messages == 2
    assert isinstance(router.fleet, FleetView)


def test_thing_from_topic() -> None:
    assert thing_from_topic("edgeinfer/dev-1/offload") == "dev-1"
    assert thing_from_topic("edgeinfer//offload") is None
    assert thing_from_topic("edgeinfer/dev-1/offload/result") is None
    assert thing_from_topic("other/dev-1/offload") is None


# ---------------------------------------------------------------------- real broker, real client


class Device:
    """A device's view of the cloud: publishes offloads, collects answers on its own result topic."""

    def __init__(self, broker: MosquittoBroker, thing: str) -> None:
        self.thing = thing
        self.client = MqttPubSub.connect_tcp(broker.host, broker.port, client_id=f"device-{thing}")
        self.answers: list[Result] = []
        self.lock = threading.Lock()
        self.client.subscribe(offload_result_topic(thing), self._on, qos=1)

    def _on(self, message: Message) -> None:
        with self.lock:
            self.answers.append(Result.parse(message.payload))

    def send(self, rid: str, **kw: Any) -> None:
        self.client.publish(offload_topic(self.thing), offload(rid, self.thing, **kw), qos=1)

    def ids(self) -> list[str]:
        with self.lock:
            return [a.id or "" for a in self.answers]


@pytest.fixture
def make_router(broker: MosquittoBroker) -> Iterator[Callable[..., tuple[Router, MqttPubSub]]]:
    made: list[tuple[Router, MqttPubSub]] = []

    def make(backend: FakeBackend | None = None, **cfg: Any) -> tuple[Router, MqttPubSub]:
        client = MqttPubSub.connect_tcp(broker.host, broker.port, client_id=f"router-{len(made)}")
        router = Router(client, backend or FakeBackend(), RouterConfig(**cfg)).start()
        made.append((router, client))
        return router, client

    yield make
    for router, client in made:
        router.stop()
        client.close()


def test_router_over_mqtt_answers_and_refuses_spoofing(
    broker: MosquittoBroker, make_router: Callable[..., tuple[Router, MqttPubSub]]
) -> None:
    make_router()
    dev1, dev2 = Device(broker, "dev-1"), Device(broker, "dev-2")
    try:
        dev1.send("ok-1")
        dev2.client.publish(offload_topic("dev-2"), offload("spoof", "dev-1"), qos=1)
        dev2.client.publish(offload_topic("dev-2"), b"\x00garbage", qos=1)
        assert wait_for(lambda: len(dev1.answers) == 1 and len(dev2.answers) == 2)
        assert dev1.ids() == ["ok-1"]
        assert dev1.answers[0].placement == "cloud"
        codes = sorted(a.error.code.value for a in dev2.answers if a.error)
        assert codes == ["BAD_REQUEST", "BAD_REQUEST"]
    finally:
        dev1.client.close()
        dev2.client.close()


def test_two_routers_share_the_stream_and_nothing_is_answered_twice(
    broker: MosquittoBroker, make_router: Callable[..., tuple[Router, MqttPubSub]]
) -> None:
    b1, b2 = (
        FakeBackend("m", delay_s=0.002, max_batch_size=1),
        FakeBackend("m", delay_s=0.002, max_batch_size=1),
    )
    r1, _ = make_router(b1)
    r2, _ = make_router(b2)
    devices = [Device(broker, f"dev-{i}") for i in range(3)]
    try:
        n = 60
        for i in range(n):
            devices[i % 3].send(f"r{i}")
        assert wait_for(lambda: sum(len(d.answers) for d in devices) == n, timeout=30)
        wait_for(lambda: False, timeout=0.3)  # any duplicate would have arrived by now
        for k, d in enumerate(devices):
            assert sorted(d.ids()) == sorted(f"r{i}" for i in range(k, n, 3))  # each once, right device
        assert sum(b1.calls) + sum(b2.calls) == n
        assert b1.calls  # both routers took part
        assert b2.calls
        assert r1.stats()["answered"] + r2.stats()["answered"] == n
    finally:
        for d in devices:
            d.client.close()


def test_router_survives_a_broker_outage(
    broker: MosquittoBroker, make_router: Callable[..., tuple[Router, MqttPubSub]]
) -> None:
    _, client = make_router()
    broker.stop()
    assert wait_for(lambda: not client.is_connected)
    broker.start()  # same port
    assert client.wait_connected(15)
    dev = Device(broker, "dev-1")
    try:
        # the shared subscription was renewed: requests are served again
        assert wait_for(lambda: (dev.send(f"x{len(dev.ids())}") or True) and len(dev.answers) > 0, timeout=15)
    finally:
        dev.client.close()


def test_offload_payload_shape_matches_the_contract() -> None:
    doc = json.loads(offload("a", image=b"\xff\xd8img", deadline_ms=100))
    assert doc["origin"]["thing"] == "dev-1"
    assert base64.b64decode(doc["image"]) == b"\xff\xd8img"
    assert Latency().to_dict()["total"] == 0.0


# ------------------------------------------------------------------ connections, deadlines, load


def test_several_connections_batch_into_one_backend_and_answer_on_their_own(
    fake_backend: FakeBackend,
) -> None:
    buses = [MemoryBus(), MemoryBus(), MemoryBus()]
    fake_backend.gate.clear()  # hold the first batch so the rest queue up together
    r = Router(buses, fake_backend, RouterConfig(group="", max_batch_size=8)).start()
    try:
        send(buses[0], "dev-1", offload("first"))
        assert wait_for(lambda: fake_backend.entered == 1)
        for i, bus in enumerate(buses):
            send(bus, "dev-1", offload(f"on-{i}"))
        fake_backend.gate.set()
        assert wait_for(lambda: sum(len(results(b)) for b in buses) == 4)
        assert [sorted(x.id or "" for x in results(b)) for b in buses] == [
            ["first", "on-0"],
            ["on-1"],
            ["on-2"],
        ]
        assert fake_backend.calls == [1, 3]  # what came on three connections, one batch
    finally:
        r.stop()


def test_what_cannot_be_served_in_time_is_answered_at_once(bus: MemoryBus, fake_backend: FakeBackend) -> None:
    clock = Clock()
    r = Router(bus, fake_backend, RouterConfig(group="", trust_sent_at=False, max_batch_size=1), clock=clock)
    r._service_s = 0.2  # as measured: one batch takes 200 ms
    fake_backend.gate.clear()
    r.start()
    try:
        send(bus, "dev-1", offload("busy", left_ms=None))
        assert wait_for(lambda: fake_backend.entered == 1)
        send(bus, "dev-1", offload("queued", left_ms=None))  # one batch ahead of the next ones
        send(bus, "dev-1", offload("tight", left_ms=300))  # 200 ms ahead + 200 ms own > 300 ms
        send(bus, "dev-1", offload("roomy", left_ms=1000))
        (tight,) = [x for x in results(bus) if x.id == "tight"]  # answered before any compute ends
        assert tight.error is not None
        assert tight.error.code is ErrorCode.DEADLINE_EXCEEDED
        assert "cannot be served in time" in tight.error.message
        fake_backend.gate.set()
        assert wait_for(lambda: len(results(bus)) == 4)
        assert {x.id: x.status for x in results(bus)} == {
            "busy": "ok",
            "queued": "ok",
            "tight": "error",
            "roomy": "ok",
        }
    finally:
        r.stop()


def test_a_request_whose_service_would_end_after_its_deadline_is_not_computed(
    bus: MemoryBus, fake_backend: FakeBackend
) -> None:
    clock = Clock()
    r = Router(bus, fake_backend, RouterConfig(group="", trust_sent_at=False), clock=clock)
    fake_backend.gate.clear()
    r.start()
    try:
        send(bus, "dev-1", offload("first", left_ms=None))
        assert wait_for(lambda: fake_backend.entered == 1)
        send(bus, "dev-1", offload("second", left_ms=500))
        r._service_s = 0.2
        clock.t += 0.4  # 100 ms left when a worker takes it: less than a batch takes
        fake_backend.gate.set()
        assert wait_for(lambda: len(results(bus)) == 2)
        by_id = {x.id: x for x in results(bus)}
        assert by_id["second"].error is not None
        assert by_id["second"].error.code is ErrorCode.DEADLINE_EXCEEDED
        assert fake_backend.calls == [1]
    finally:
        r.stop()


def test_load_is_the_backends_busy_share_and_the_backlog(bus: MemoryBus, fake_backend: FakeBackend) -> None:
    clock = Clock()
    r = Router(bus, fake_backend, RouterConfig(group="", workers=2), clock=clock)
    r.start()
    try:
        assert r.load() == {"busy_share": 0.0, "backlog": 0.0}
        clock.t += 10
        with r._lock:
            r._busy_s += 5  # 5 s of compute in 10 s of two workers
        assert r.load() == {"busy_share": 0.25, "backlog": 0.0}
        clock.t += 1
        assert r.load()["busy_share"] == 0.0  # since the last reading
    finally:
        r.stop()


def test_one_slow_batch_does_not_refuse_every_later_request(
    bus: MemoryBus, fake_backend: FakeBackend
) -> None:
    clock = Clock()
    r = Router(bus, fake_backend, RouterConfig(group="", trust_sent_at=False), clock=clock)
    fake_backend.gate.clear()
    r.start()
    try:
        send(bus, "dev-1", offload("slow", left_ms=None))
        assert wait_for(lambda: fake_backend.entered == 1)
        clock.t += 5.0  # a pause inside the first batch: the estimate starts far above any deadline
        fake_backend.gate.set()
        assert wait_for(lambda: len(results(bus)) == 1 and r._serving == 0)
        assert r._service_s == 5.0
        send(bus, "dev-1", offload("probe", left_ms=1000))  # idle: served, and so measured again
        assert wait_for(lambda: len(results(bus)) == 2 and r._serving == 0)
        assert {x.id: x.status for x in results(bus)} == {"slow": "ok", "probe": "ok"}
        assert fake_backend.calls == [1, 1]
        assert r._service_s < 5.0  # measured again, the estimate comes down
    finally:
        r.stop()
