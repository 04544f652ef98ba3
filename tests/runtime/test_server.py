"""The request pipeline on a MemoryBus with the real ONNX Runtime on a tiny model."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgeinfer.messages import ErrorCode, Request, Result, result_topic
from edgeinfer.runtime.config import RuntimeConfig
from edgeinfer.runtime.engine import Engine
from edgeinfer.runtime.placement import Decision, PlacementContext, PlacementPolicy
from edgeinfer.runtime.server import InferenceServer
from edgeinfer.transport import MemoryBus, Message, MqttProperties, Target
from tests.helpers.clock import FakeClock
from tests.helpers.images import solid_jpeg, solid_png
from tests.helpers.wait import eventually
from tests.runtime.conftest import GuardedBus

THING = "dev1"
INFER = f"edgeinfer/{THING}/infer"
RESULT = result_topic(THING)


class Harness:
    def __init__(self, engine: Engine, cfg: RuntimeConfig) -> None:
        self.bus = GuardedBus()
        self.server = InferenceServer(self.bus, engine, cfg, THING)
        self.server.start()

    def send(self, doc: dict[str, Any] | bytes, target: Target = "local") -> None:
        payload = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        self.bus.publish(INFER, payload, target=target)

    def results(self, topic: str = "edgeinfer/#", target: Target | None = None) -> list[Result]:
        return [
            Result.parse(m.payload)
            for m in self.bus.messages_on(topic, target)
            if m.topic != INFER and not m.topic.startswith("edgeinfer/local/")
        ]

    def wait_results(self, n: int, **kw: Any) -> list[Result]:
        eventually(lambda: len(self.results(**kw)) >= n)
        return self.results(**kw)


@pytest.fixture
def harness(make_engine: Callable[..., Engine]) -> Iterator[Harness]:
    cfg = RuntimeConfig(max_batch_size=4, max_queue_size=16, max_payload_bytes=64 * 1024)
    h = Harness(make_engine(cfg), cfg)
    yield h
    h.server.stop()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_ok_result_on_the_bus_it_came_from(harness: Harness) -> None:
    harness.send({"id": "r1", "image": b64(solid_jpeg((250, 5, 5))), "top_k": 2})
    harness.send({"id": "g1", "image": b64(solid_png((5, 250, 5)))}, target="iot")
    (red,) = harness.wait_results(1, target="local")
    (green,) = harness.wait_results(1, target="iot")
    assert red.id == "r1"
    assert red.status == "ok"
    assert [p.index for p in red.predictions] == [0, 1][: len(red.predictions)]
    assert len(red.predictions) == 2
    assert red.predictions[0].label == "red"
    assert red.provider == "CPUExecutionProvider"
    assert red.model is not None
    assert red.model.variant == "int8-cpu"
    assert red.batch_size >= 1
    assert red.latency_ms.total >= red.latency_ms.inference >= 0
    assert green.id == "g1"
    assert green.predictions[0].index == 1


def test_reply_to_allowed_topic_and_dlr_format(harness: Harness) -> None:
    topic = f"{RESULT}/mine"
    harness.send({"id": "a", "image": b64(solid_jpeg((5, 5, 250))), "reply_to": topic})
    harness.send({"id": "d", "image": b64(solid_jpeg((5, 5, 250))), "result_format": "dlr"})
    eventually(lambda: len(harness.bus.messages_on(topic)) == 1 and len(harness.bus.messages_on(RESULT)) == 1)
    assert Result.parse(harness.bus.messages_on(topic)[0].payload).predictions[0].label == "blue"
    dlr = json.loads(harness.bus.messages_on(RESULT)[0].payload)
    assert dlr["id"] == "d"
    assert dlr["inference-results"][0]["Label"] == "blue"
    assert isinstance(dlr["inference-results"][0]["Score"], str)


def _bad_requests(tmp: Path) -> list[tuple[bytes, str | None, ErrorCode]]:
    good = solid_jpeg((200, 30, 30), (640, 480))
    big = np.zeros((20000, 20000), dtype=np.uint8)  # never decoded: only the header is read
    header_bomb = bytearray(solid_jpeg((1, 2, 3), (16, 16)))
    sof = header_bomb.find(b"\xff\xc0")
    header_bomb[sof + 5 : sof + 9] = (20000).to_bytes(2, "big") * 2
    del big
    one = solid_png((9, 9, 9), (1, 1))

    def req(rid: str, **kw: Any) -> bytes:
        return json.dumps({"id": rid, **kw}).encode()

    return [
        (b"{not json", None, ErrorCode.BAD_REQUEST),
        (b"[1,2]", None, ErrorCode.BAD_REQUEST),
        (json.dumps({"image": b64(good)}).encode(), None, ErrorCode.BAD_REQUEST),
        (req("b64", image="@@@not-base64@@@"), "b64", ErrorCode.BAD_IMAGE),
        (req("empty", image=""), "empty", ErrorCode.BAD_IMAGE),
        (req("trunc", image=b64(good[: len(good) // 2])), "trunc", ErrorCode.BAD_IMAGE),
        (req("corrupt", image=b64(b"\xff\xd8\xff\xe0" + b"\x00" * 300)), "corrupt", ErrorCode.BAD_IMAGE),
        (req("text", image=b64(b"hello, world")), "text", ErrorCode.BAD_IMAGE),
        (req("tiny", image=b64(one)), "tiny", ErrorCode.BAD_IMAGE),
        (req("bomb", image=b64(bytes(header_bomb))), "bomb", ErrorCode.BAD_IMAGE),
        (req("huge", image=b64(b"\xff\xd8" + b"x" * 70000)), "huge", ErrorCode.TOO_LARGE),
        (req("model", image=b64(good), model="resnet9000"), "model", ErrorCode.BAD_REQUEST),
        (req("reply", image=b64(good), reply_to="someone/else"), "reply", ErrorCode.BAD_REQUEST),
        (req("k", image=b64(good), top_k=0), "k", ErrorCode.BAD_REQUEST),
        (req("path", image_path=str(tmp / "x.jpg")), "path", ErrorCode.BAD_REQUEST),
    ]


def test_every_bad_request_gets_exactly_one_error_and_serving_goes_on(
    harness: Harness, tmp_path: Path
) -> None:
    cases = _bad_requests(tmp_path)
    for payload, _, _ in cases:
        harness.send(payload)
    harness.send({"id": "after", "image": b64(solid_jpeg((5, 250, 5)))})
    results = harness.wait_results(len(cases) + 1, topic=RESULT)
    time.sleep(0.2)  # nothing more arrives
    results = harness.results(topic=RESULT)
    assert len(results) == len(cases) + 1
    errors = [r for r in results if r.status == "error"]
    got = sorted(((r.id or "", r.error.code) for r in errors if r.error), key=str)
    want = sorted(((rid or "", code) for _, rid, code in cases), key=str)
    assert got == want
    ok = [r for r in results if r.status == "ok"]
    assert [r.id for r in ok] == ["after"]
    assert ok[0].predictions[0].label == "green"
    for r in errors:
        assert r.error is not None
        assert r.error.message


def test_reply_to_refused_by_the_nucleus_answers_bad_request_on_default_topic(
    make_engine: Callable[..., Engine],
) -> None:
    cfg = RuntimeConfig(max_batch_size=2, reply_to_topics=["forbidden/#", "edgeinfer/{thing}/result/#"])
    h = Harness(make_engine(cfg), cfg)
    try:
        h.send({"id": "f", "image": b64(solid_jpeg((1, 200, 1))), "reply_to": "forbidden/x"})
        (res,) = h.wait_results(1, topic=RESULT)
        assert res.id == "f"
        assert res.error is not None
        assert res.error.code == ErrorCode.BAD_REQUEST
    finally:
        h.server.stop()


def test_image_path_inside_allowed_folder(make_engine: Callable[..., Engine], tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(solid_png((240, 3, 3)))
    cfg = RuntimeConfig(max_batch_size=2, image_folders=[str(tmp_path)])
    h = Harness(make_engine(cfg), cfg)
    try:
        h.send({"id": "p", "image_path": str(tmp_path / "a.png")})
        h.send({"id": "missing", "image_path": str(tmp_path / "nope.png")})
        h.send({"id": "escape", "image_path": str(tmp_path / ".." / "etc.png")})
        h.send({"id": "iot", "image_path": str(tmp_path / "a.png")}, target="iot")
        res = {r.id: r for r in h.wait_results(4)}
        assert res["p"].status == "ok"
        assert res["p"].predictions[0].label == "red"
        assert res["missing"].error
        assert res["missing"].error.code == ErrorCode.BAD_IMAGE
        assert res["escape"].error
        assert res["escape"].error.code == ErrorCode.BAD_REQUEST
        assert res["iot"].error
        assert res["iot"].error.code == ErrorCode.BAD_REQUEST
    finally:
        h.server.stop()


class Gate:
    """An engine wrapper that blocks `run` until released: makes a burst pile up deterministically."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.release = threading.Event()
        self.entered = threading.Event()
        self.sizes: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def run(self, batch: np.ndarray, *, lane: bool = False) -> np.ndarray:
        self.entered.set()
        self.release.wait(30)
        self.sizes.append(batch.shape[0])
        return self.engine.run(batch, lane=lane)


@contextlib.contextmanager
def serving(
    engine: Any, cfg: RuntimeConfig, clock: Callable[[], float] = time.monotonic
) -> Iterator[tuple[MemoryBus, InferenceServer]]:
    """A started server on a MemoryBus around a wrapped engine; a gate is opened and the server
    stopped on the way out, whatever the test asserted."""
    bus = MemoryBus()
    server = InferenceServer(bus, engine, cfg, THING, clock=clock)
    server.start()
    try:
        yield bus, server
    finally:
        if isinstance(engine, Gate):
            engine.release.set()
        server.stop()


def test_burst_beyond_the_queue_every_request_answered(make_engine: Callable[..., Engine]) -> None:
    cfg = RuntimeConfig(max_batch_size=4, max_queue_size=8, decode_threads=2, run_inline_when_idle=False)
    cfg.lanes = 1  # one engine: the queue's bound is what is tested
    gate = Gate(make_engine(cfg))
    with serving(gate, cfg) as (bus, server):
        img = b64(solid_jpeg((250, 1, 1)))
        bus.publish(INFER, json.dumps({"id": "first", "image": img}).encode())
        assert gate.entered.wait(30)  # the engine is busy with "first"
        n = 40
        for i in range(n):
            bus.publish(INFER, json.dumps({"id": f"b{i}", "image": img}).encode())
        eventually(lambda: server.batcher.incoming == 0)
        gate.release.set()
        eventually(lambda: len(bus.messages_on(RESULT)) >= n + 1)
        time.sleep(0.1)
        results = [Result.parse(m.payload) for m in bus.messages_on(RESULT)]
        assert sorted(r.id or "" for r in results) == sorted(["first"] + [f"b{i}" for i in range(n)])
        ok = [r for r in results if r.status == "ok"]
        over = [r for r in results if r.error and r.error.code == ErrorCode.OVERLOADED]
        assert len(ok) + len(over) == n + 1
        assert len(ok) == 1 + cfg.max_queue_size  # the running one plus a full queue
        assert max(r.batch_size for r in ok) == cfg.max_batch_size  # the backlog ran batched
        assert gate.sizes[0] == 1  # the first request did not wait for company


class ThreadRecorder:
    """An engine wrapper that notes which thread ran each batch, and whether on a lane."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.threads: list[int] = []
        self.lanes_seen: list[bool] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def run(self, batch: np.ndarray, *, lane: bool = False) -> np.ndarray:
        self.threads.append(threading.get_ident())
        self.lanes_seen.append(lane)
        return self.engine.run(batch, lane=lane)


def test_idle_request_runs_to_completion_on_the_arriving_thread(
    make_engine: Callable[..., Engine],
) -> None:
    cfg = RuntimeConfig(max_batch_size=2)
    cfg.lanes = 2
    engine = ThreadRecorder(make_engine(cfg))
    with serving(engine, cfg) as (bus, _server):
        bus.publish(INFER, json.dumps({"id": "a", "image": b64(solid_jpeg((250, 1, 1)))}).encode())
        # MemoryBus delivers on the publishing thread: the answer is out when publish returns.
        [res] = [Result.parse(m.payload) for m in bus.messages_on(RESULT)]
        assert res.status == "ok"
        assert res.batch_size == 1
        assert engine.threads == [threading.get_ident()]
        assert engine.lanes_seen == [False]  # alone: on every thread, not a lane


class BoundRecorder(ThreadRecorder):
    """A GPU-like engine: its runs belong on the engine threads, which warm themselves up first."""

    thread_bound = True

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.warmed: list[int] = []

    def warm_thread(self) -> None:
        if threading.get_ident() not in self.warmed:
            self.warmed.append(threading.get_ident())


def test_a_gpu_engine_runs_on_engine_threads_warmed_before_start_returns(
    make_engine: Callable[..., Engine],
) -> None:
    cfg = RuntimeConfig(max_batch_size=2)
    cfg.lanes = 2
    engine = BoundRecorder(make_engine(cfg))
    with serving(engine, cfg) as (bus, server):
        engine_threads = {t.ident for t in server._threads[1:]}
        assert len(engine_threads) == 2
        assert set(engine.warmed) == engine_threads  # warmed before start() returned
        bus.publish(INFER, json.dumps({"id": "a", "image": b64(solid_jpeg((250, 1, 1)))}).encode())
        eventually(lambda: len(bus.messages_on(RESULT)) == 1)
        [res] = [Result.parse(m.payload) for m in bus.messages_on(RESULT)]
        assert res.status == "ok"
        # Idle, yet not run on the arriving thread: on a warmed engine thread.
        assert engine.threads[0] != threading.get_ident()
        assert engine.threads[0] in engine_threads


class FailingWarmUp(BoundRecorder):
    calls = 0

    def warm_thread(self) -> None:
        self.calls += 1
        raise RuntimeError("CUDA failure 700: an illegal memory access was encountered")


def test_a_failed_warm_up_is_logged_once_per_thread_and_serving_goes_on(
    make_engine: Callable[..., Engine],
) -> None:
    cfg = RuntimeConfig(max_batch_size=2)
    cfg.lanes = 1
    engine = FailingWarmUp(make_engine(cfg))
    with serving(engine, cfg) as (bus, _server):
        bus.publish(INFER, json.dumps({"id": "a", "image": b64(solid_jpeg((250, 1, 1)))}).encode())
        eventually(lambda: len(bus.messages_on(RESULT)) == 1)
        time.sleep(0.3)  # a few turns of the engine loop
        assert Result.parse(bus.messages_on(RESULT)[0].payload).status == "ok"
        assert engine.calls == 1  # tried once on the one engine thread, not at every turn


def test_message_on_the_heels_of_the_last_is_pipelined(make_engine: Callable[..., Engine]) -> None:
    cfg = RuntimeConfig(max_batch_size=2)
    engine = ThreadRecorder(make_engine(cfg))
    # A clock that stands still: the second message follows the first with no gap, as one queued
    # in the socket behind it does.
    with serving(engine, cfg, clock=lambda: 100.0) as (bus, _server):
        img = b64(solid_jpeg((250, 1, 1)))
        bus.publish(INFER, json.dumps({"id": "a", "image": img}).encode())
        bus.publish(INFER, json.dumps({"id": "b", "image": img}).encode())
        eventually(lambda: len(bus.messages_on(RESULT)) >= 2)
        assert {Result.parse(m.payload).status for m in bus.messages_on(RESULT)} == {"ok"}
        assert engine.threads[0] == threading.get_ident()
        assert engine.threads[1] != threading.get_ident()  # a decode worker or the engine thread


def test_under_load_an_idle_moment_gets_a_lane_not_the_transport_thread(
    make_engine: Callable[..., Engine],
) -> None:
    cfg = RuntimeConfig(max_batch_size=2)
    cfg.lanes = 2
    engine = ThreadRecorder(make_engine(cfg))
    with serving(engine, cfg) as (bus, server):
        server.batcher.contention = 1.0  # as after a burst: the recent arrivals all found work in flight
        bus.publish(INFER, json.dumps({"id": "a", "image": b64(solid_jpeg((250, 1, 1)))}).encode())
        eventually(lambda: len(bus.messages_on(RESULT)) >= 1)
        [res] = [Result.parse(m.payload) for m in bus.messages_on(RESULT)]
        assert res.status == "ok"
        assert threading.get_ident() not in engine.threads  # not run inline …
        assert engine.lanes_seen == [True]  # … and on a lane, not every core


def test_inline_off_keeps_the_transport_thread_free(make_engine: Callable[..., Engine]) -> None:
    cfg = RuntimeConfig(max_batch_size=2, run_inline_when_idle=False)
    engine = ThreadRecorder(make_engine(cfg))
    with serving(engine, cfg) as (bus, _server):
        bus.publish(INFER, json.dumps({"id": "a", "image": b64(solid_jpeg((250, 1, 1)))}).encode())
        eventually(lambda: len(bus.messages_on(RESULT)) >= 1)
        assert engine.threads
        assert threading.get_ident() not in engine.threads


class LaneGate(Gate):
    """A Gate whose first two lane runs wait for each other (they only meet if they run side by
    side); notes whether each batch ran on a lane (one thread) or alone."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.lanes_seen: list[bool] = []
        self.meet = threading.Barrier(2)

    def run(self, batch: np.ndarray, *, lane: bool = False) -> np.ndarray:
        self.lanes_seen.append(lane)
        if lane and sum(self.lanes_seen) <= 2:
            self.meet.wait(30)  # BrokenBarrierError (the test fails) unless a second lane comes
        return super().run(batch, lane=lane)


def test_lanes_run_batches_side_by_side_and_an_idle_request_alone(
    make_engine: Callable[..., Engine],
) -> None:
    cfg = RuntimeConfig(max_batch_size=2, max_queue_size=16, decode_threads=2, run_inline_when_idle=False)
    cfg.lanes = 2
    gate = LaneGate(make_engine(cfg))
    assert gate.lanes == 2
    with serving(gate, cfg) as (bus, server):
        img = b64(solid_jpeg((250, 1, 1)))
        bus.publish(INFER, json.dumps({"id": "a", "image": img}).encode())
        assert gate.entered.wait(30)  # "a" found the runtime idle: it runs alone, and is held
        for i in range(6):
            bus.publish(INFER, json.dumps({"id": f"b{i}", "image": img}).encode())
        eventually(lambda: server.batcher.incoming == 0)
        gate.release.set()
        eventually(lambda: len(bus.messages_on(RESULT)) >= 7)
        results = [Result.parse(m.payload) for m in bus.messages_on(RESULT)]
        assert {r.status for r in results} == {"ok"}
        assert gate.lanes_seen[0] is False  # alone: every thread
        assert gate.lanes_seen[1:3] == [True, True]  # the backlog: two lanes that met at the barrier


def test_deadline_passed_in_queue_is_not_computed(make_engine: Callable[..., Engine]) -> None:
    cfg = RuntimeConfig(max_batch_size=2, max_queue_size=8, run_inline_when_idle=False)
    cfg.lanes = 1  # one engine, busy: the second request waits in the queue
    gate = Gate(make_engine(cfg))
    with serving(gate, cfg) as (bus, server):
        img = b64(solid_jpeg((250, 1, 1)))
        bus.publish(INFER, json.dumps({"id": "first", "image": img}).encode())
        assert gate.entered.wait(30)
        bus.publish(INFER, json.dumps({"id": "late", "image": img, "deadline_ms": 1}).encode())
        eventually(lambda: server.batcher.incoming == 0)
        time.sleep(0.01)  # its 1 ms deadline is over while the engine is still busy
        gate.release.set()
        eventually(lambda: len(bus.messages_on(RESULT)) >= 2)
        res = {r.id: r for r in (Result.parse(m.payload) for m in bus.messages_on(RESULT))}
        assert res["first"].status == "ok"
        assert res["late"].error
        assert res["late"].error.code == ErrorCode.DEADLINE_EXCEEDED
        assert sum(gate.sizes) == 1


def test_placement_seam_reject_and_cloud(make_engine: Callable[..., Engine]) -> None:
    cfg = RuntimeConfig(max_batch_size=2)
    bus = MemoryBus()
    server = InferenceServer(bus, make_engine(cfg), cfg, THING)
    seen: list[PlacementContext] = []

    class Policy(PlacementPolicy):
        def decide(self, request: Request, ctx: PlacementContext) -> Decision:
            seen.append(ctx)
            if request.id.startswith("no"):
                return Decision("reject", ErrorCode.OVERLOADED, "edge too busy and cloud off")
            return Decision("cloud") if request.offload == "always" else Decision()

    class Cloud:
        def offload(self, request: Request, ctx: PlacementContext, reply: Callable[[Result], None]) -> None:
            res = Result(request.id, "ok", "", placement="cloud", provider="cloud")
            reply(res)
            reply(res)  # a second answer is ignored

    server.set_placement(Policy(), Cloud())
    server.start()
    try:
        img = b64(solid_jpeg((250, 1, 1)))
        for rid, off in (("no1", "auto"), ("c1", "always"), ("e1", "auto")):
            bus.publish(INFER, json.dumps({"id": rid, "image": img, "offload": off}).encode())
        eventually(lambda: len(bus.messages_on(RESULT)) >= 3)
        time.sleep(0.1)
        res = {r.id: r for r in (Result.parse(m.payload) for m in bus.messages_on(RESULT))}
        assert len(bus.messages_on(RESULT)) == 3
        assert res["no1"].error
        assert res["no1"].error.code == ErrorCode.OVERLOADED
        assert res["c1"].placement == "cloud"
        assert res["e1"].placement == "edge"
        assert seen[0].thing == THING
        assert seen[0].max_batch_size == 2
    finally:
        server.stop()


def test_timings_published_in_batches(make_engine: Callable[..., Engine]) -> None:
    from edgeinfer.messages import TIMINGS_TOPIC, TimingBatch

    cfg = RuntimeConfig(max_batch_size=4)
    cfg.timings.flush_interval_ms = 20
    bus = MemoryBus()
    server = InferenceServer(bus, make_engine(cfg), cfg, THING)
    server.start()
    try:
        for i in range(5):
            bus.publish(INFER, json.dumps({"id": f"t{i}", "image": b64(solid_jpeg((9, 9, 200)))}).encode())
        bus.publish(INFER, b"garbage")
        eventually(
            lambda: (
                sum(len(TimingBatch.parse(m.payload).records) for m in bus.messages_on(TIMINGS_TOPIC)) >= 6
            )
        )
        batches = [TimingBatch.parse(m.payload) for m in bus.messages_on(TIMINGS_TOPIC)]
        recs = [r for b in batches for r in b.records]
        assert {r.id for r in recs if r.status == "ok"} == {f"t{i}" for i in range(5)}
        assert [r.code for r in recs if r.status == "error"] == [ErrorCode.BAD_REQUEST]
        assert sum(sum(b.executions) for b in batches) == 5
        assert all(m.target == "local" for m in bus.messages_on(TIMINGS_TOPIC))
    finally:
        server.stop()


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=10,
)
_fields = st.fixed_dictionaries(
    {},
    optional={
        "id": st.one_of(st.text(max_size=300), st.integers(), st.none(), st.booleans()),
        "image": st.one_of(st.text(max_size=50), st.binary(max_size=200).map(b64), _json_values),
        "image_path": st.one_of(st.text(max_size=30), _json_values),
        "reply_to": st.one_of(st.text(max_size=30), _json_values),
        "deadline_ms": _json_values,
        "top_k": _json_values,
        "offload": _json_values,
        "model": _json_values,
        "result_format": _json_values,
    },
)
_payloads = st.one_of(
    st.binary(max_size=300),
    _json_values.map(lambda v: json.dumps(v).encode()),
    _fields.map(lambda d: json.dumps(d).encode()),
)


@pytest.fixture(scope="module")
def garbage_server(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InferenceServer]:
    from edgeinfer.model.manifest import Manifest

    cfg = RuntimeConfig(max_batch_size=2, max_queue_size=64)
    engine = Engine.create(Manifest.load(tiny_store), cfg, str(tmp_path_factory.mktemp("w")))
    server = InferenceServer(MemoryBus(), engine, cfg, THING)
    server.start()
    yield server
    server.stop()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payloads=st.lists(_payloads, min_size=1, max_size=5))
def test_property_garbage_always_gets_exactly_one_answer(
    garbage_server: InferenceServer, payloads: list[bytes]
) -> None:
    bus = garbage_server.bus
    assert isinstance(bus, MemoryBus)
    bus.published.clear()
    for p in payloads:
        garbage_server.handle_message(Message(INFER, p, "local"))
    eventually(lambda: len(_answers(bus)) >= len(payloads), timeout=20)
    eventually(lambda: garbage_server.batcher.outstanding == 0 and garbage_server.batcher.depth == 0)
    time.sleep(0.002)
    answers = _answers(bus)
    assert len(answers) == len(payloads)
    for res in answers:
        assert res.status in ("ok", "error")
        if res.status == "error":
            assert res.error is not None
            assert res.error.code in set(ErrorCode)


def _answers(bus: MemoryBus) -> list[Result]:
    out = []
    for m in list(bus.published):
        if m.topic == INFER or m.topic.startswith("edgeinfer/local/"):
            continue
        doc = json.loads(m.payload)
        if "inference-results" in doc:
            doc = {"id": doc["id"], "status": "ok", "timestamp": doc["timestamp"]}
        out.append(Result.from_dict(doc))
    return out


def test_large_jpeg_decoded_reduced(harness: Harness) -> None:
    img = np.zeros((960, 1280, 3), dtype=np.uint8)
    img[:, :, 1] = 220
    ok, buf = cv2.imencode(".jpg", img)
    assert ok
    harness.send({"id": "big", "image": b64(bytes(buf))})
    (res,) = harness.wait_results(1)
    assert res.status == "ok"
    assert res.predictions[0].label == "green"


def test_self_test_warms_the_path_and_publishes_nothing(make_engine: Callable[..., Engine]) -> None:
    cfg = RuntimeConfig(max_batch_size=2)
    bus = MemoryBus()
    server = InferenceServer(bus, make_engine(cfg), cfg, THING)
    server.start()
    try:
        assert server.self_test(n=3)
        assert server.batcher.outstanding == 0
        server.timings.flush()
        assert bus.published == []
    finally:
        server.stop()


def test_apply_config_resubscribes_and_resizes_the_decode_pool(make_engine: Callable[..., Engine]) -> None:
    cfg = RuntimeConfig(max_batch_size=2)
    cfg.lanes = 2  # however many cores this process may use
    h = Harness(make_engine(cfg), cfg)
    try:
        new = RuntimeConfig(max_batch_size=2, subscribe_iot=False, decode_threads=1, max_queue_delay_us=0)
        new.lanes = 2
        new.lane_max_batch_size = 1
        h.server.apply_config(new)
        assert h.server.batcher.max_queue_delay_us == 0
        assert h.server.batcher.lane_batch_size == 1  # cpu.laneMaxBatchSize, live
        h.send({"id": "iot", "image": b64(solid_jpeg((250, 1, 1)))}, target="iot")
        h.send({"id": "local", "image": b64(solid_jpeg((250, 1, 1)))})
        (res,) = h.wait_results(1)
        time.sleep(0.1)
        assert res.id == "local"
        assert len(h.results()) == 1  # nobody listens on IoT Core any more
    finally:
        h.server.stop()


def test_configured_top_k_is_the_default(make_engine: Callable[..., Engine]) -> None:
    cfg = RuntimeConfig(max_batch_size=2, top_k=2)
    h = Harness(make_engine(cfg), cfg)
    try:
        h.send({"id": "default", "image": b64(solid_jpeg((250, 1, 1)))})
        h.send({"id": "asked", "image": b64(solid_jpeg((250, 1, 1))), "top_k": 4})
        got = {r.id: r for r in h.wait_results(2)}
        assert len(got["default"].predictions) == 2
        assert len(got["asked"].predictions) == 4
    finally:
        h.server.stop()


def test_decode_workers_run_at_the_configured_niceness(make_engine: Callable[..., Engine]) -> None:
    import os

    cfg = RuntimeConfig(max_batch_size=2, decode_threads=1)
    cfg.decode_nice = 7
    server = InferenceServer(MemoryBus(), make_engine(cfg), cfg, THING)
    try:
        seen = server._decode_pool.submit(
            lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        ).result(10)
        assert seen == os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) + 7
        cfg2 = RuntimeConfig(max_batch_size=2, decode_threads=1)  # a live update back to 0
        server.apply_config(cfg2)
        again = server._decode_pool.submit(
            lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        ).result(10)
        assert again == os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    finally:
        server.stop()


def test_offload_keeps_one_lane_and_edge_only_gets_them_back(make_engine: Callable[..., Engine]) -> None:
    from edgeinfer.runtime.placement import EdgeOnly

    cfg = RuntimeConfig(max_batch_size=2)
    cfg.lanes = 2
    engine = make_engine(cfg)
    server = InferenceServer(MemoryBus(), engine, cfg, THING)

    class Cloud:
        def offload(self, request: Request, ctx: PlacementContext, reply: Callable[[Result], None]) -> None:
            raise AssertionError("not called here")

    assert server.batcher.lanes == 2
    server.set_placement(EdgeOnly(), Cloud())
    assert server.batcher.lanes == 1  # the policy's service model sees one batch at a time
    server.set_placement(EdgeOnly(), None)
    assert server.batcher.lanes == 2


class FailingTopK(ThreadRecorder):
    """An engine whose first top-k raises: a failure after inference."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.failed = False

    def top_k(self, probs: np.ndarray, k: int) -> Any:
        if not self.failed:
            self.failed = True
            raise RuntimeError("top-k exploded")
        return self.engine.top_k(probs, k)


@pytest.mark.parametrize("inline", [True, False])
def test_failure_after_inference_answers_the_batch_and_frees_its_lane(
    make_engine: Callable[..., Engine], inline: bool
) -> None:
    cfg = RuntimeConfig(max_batch_size=2, run_inline_when_idle=inline)
    cfg.lanes = 1
    engine = FailingTopK(make_engine(cfg))
    with serving(engine, cfg) as (bus, server):
        img = b64(solid_jpeg((250, 1, 1)))
        bus.publish(INFER, json.dumps({"id": "boom", "image": img}).encode())
        eventually(lambda: len(bus.messages_on(RESULT)) >= 1)
        bus.publish(INFER, json.dumps({"id": "next", "image": img}).encode())
        eventually(lambda: len(bus.messages_on(RESULT)) >= 2)
        res = {r.id: r for r in (Result.parse(m.payload) for m in bus.messages_on(RESULT))}
        assert res["boom"].error is not None
        assert res["boom"].error.code == ErrorCode.INTERNAL
        assert res["next"].status == "ok"  # the lane came back
        eventually(lambda: server.batcher.idle)  # nothing held: admitted, queued or running


# ------------------------------------------------------------------ deadlines from the sender, MQTT 5


def test_a_request_past_its_deadline_on_arrival_is_answered_deadline_exceeded_not_computed(
    harness: Harness,
) -> None:
    from edgeinfer.messages import iso_utc

    now = time.time()
    img = b64(solid_jpeg((250, 5, 5)))
    # Sent 5 s ago with 100 ms to live: it waited upstream past its budget.
    harness.send({"id": "old", "image": img, "deadline_ms": 100, "sent_at": iso_utc(now - 5)})
    harness.send({"id": "due", "image": img, "deadline_at": iso_utc(now - 1)})
    # Sent just now with a generous budget: served.
    harness.send({"id": "new", "image": img, "deadline_ms": 60_000, "sent_at": iso_utc(now)})
    results = {r.id: r for r in harness.wait_results(3)}
    for rid in ("old", "due"):
        assert results[rid].status == "error"
        error = results[rid].error
        assert error is not None
        assert error.code is ErrorCode.DEADLINE_EXCEEDED
        assert results[rid].batch_size == 0  # never reached the engine
    assert results["new"].status == "ok"
    assert harness.server.stats.expired_on_arrival == 2


def test_the_default_deadline_counts_from_sent_at_too(make_engine: Callable[..., Engine]) -> None:
    from edgeinfer.messages import iso_utc

    cfg = RuntimeConfig(max_batch_size=4, max_queue_size=16, default_deadline_ms=100)
    h = Harness(make_engine(cfg), cfg)
    try:
        now = time.time()
        img = b64(solid_jpeg((250, 5, 5)))
        # No deadline_ms of its own: the configured 100 ms count from its sending, 5 s ago.
        h.send({"id": "old", "image": img, "sent_at": iso_utc(now - 5)})
        h.send({"id": "new", "image": img, "deadline_ms": 60_000, "sent_at": iso_utc(now)})
        results = {r.id: r for r in h.wait_results(2)}
        error = results["old"].error
        assert error is not None
        assert error.code is ErrorCode.DEADLINE_EXCEEDED
        assert results["old"].batch_size == 0
        assert results["new"].status == "ok"
    finally:
        h.server.stop()


def test_mqtt5_message_expiry_counts_as_the_deadline(harness: Harness) -> None:
    img = b64(solid_jpeg((250, 5, 5)))
    expired = MqttProperties(message_expiry_s=0)
    harness.bus.publish(
        INFER, json.dumps({"id": "x", "image": img}).encode(), target="iot", properties=expired
    )
    (result,) = harness.wait_results(1, target="iot")
    assert result.error is not None
    assert result.error.code is ErrorCode.DEADLINE_EXCEEDED


def test_mqtt5_raw_jpeg_request_is_answered_on_its_response_topic_with_its_correlation_data(
    harness: Harness,
) -> None:
    reply = f"{RESULT}/client-7"
    props = MqttProperties(
        content_type="image/jpeg",
        correlation_data=b"\x00\x01corr",
        response_topic=reply,
        user_properties=(("top_k", "1"), ("deadline_ms", "30000")),
    )
    harness.bus.publish(INFER, solid_jpeg((5, 250, 5)), target="iot", properties=props)
    eventually(lambda: len(harness.bus.messages_on(reply)) == 1)
    (msg,) = harness.bus.messages_on(reply)
    result = Result.parse(msg.payload)
    assert result.status == "ok"
    assert result.id == b"\x00\x01corr".hex()  # no `id` property: the correlation data stands in
    assert len(result.predictions) == 1
    assert result.predictions[0].label == "green"
    assert msg.properties is not None
    assert msg.properties.correlation_data == b"\x00\x01corr"
    assert msg.properties.content_type == "application/json"
    # A response topic the component may not publish to: BAD_REQUEST on the default topic, still
    # with the correlation data, so the client can match it.
    bad = dataclasses.replace(props, response_topic="elsewhere/x", user_properties=(("id", "r2"),))
    harness.bus.publish(INFER, solid_jpeg((5, 250, 5)), target="iot", properties=bad)
    eventually(lambda: len(harness.bus.messages_on(RESULT, "iot")) == 1)
    (msg,) = harness.bus.messages_on(RESULT, "iot")
    err = Result.parse(msg.payload)
    assert err.id == "r2"
    assert err.error is not None
    assert err.error.code is ErrorCode.BAD_REQUEST
    assert msg.properties is not None
    assert msg.properties.correlation_data == b"\x00\x01corr"


def test_a_json_request_with_a_response_topic_is_answered_there(harness: Harness) -> None:
    reply = f"{RESULT}/json-client"
    props = MqttProperties(correlation_data=b"c1", response_topic=reply)
    body = json.dumps({"id": "j1", "image": b64(solid_jpeg((5, 5, 250)))}).encode()
    harness.bus.publish(INFER, body, target="iot", properties=props)
    eventually(lambda: len(harness.bus.messages_on(reply)) == 1)
    msg = harness.bus.messages_on(reply)[0]
    assert Result.parse(msg.payload).id == "j1"
    assert msg.properties is not None
    assert msg.properties.correlation_data == b"c1"


def test_a_result_over_iot_cores_limit_is_answered_too_large(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edgeinfer.messages import IOT_CORE_MAX_BYTES, Prediction

    engine = harness.server.engine
    many = [Prediction(i, "x" * 300, 0.001) for i in range(600)]  # ~200 KB of JSON
    monkeypatch.setattr(engine, "top_k", lambda probs, k: many)
    harness.server.answers.max_ipc_bytes = 16 * 1024 * 1024  # maxIpcMessageBytes: a classic-only deployment
    harness.send({"id": "big", "image": b64(solid_jpeg((250, 5, 5)))}, target="iot")
    harness.send({"id": "local-big", "image": b64(solid_jpeg((250, 5, 5)))})
    eventually(lambda: len(harness.bus.messages_on(RESULT)) == 2)
    by_target = {m.target: m for m in harness.bus.messages_on(RESULT)}
    iot = Result.parse(by_target["iot"].payload)
    assert len(by_target["iot"].payload) < IOT_CORE_MAX_BYTES
    assert iot.id == "big"
    assert iot.error is not None
    assert iot.error.code is ErrorCode.TOO_LARGE
    assert len(by_target["local"].payload) > IOT_CORE_MAX_BYTES  # local pub/sub takes 16 MiB


def test_shed_requests_cost_no_base64_decode_and_a_bad_one_taken_on_is_bad_image(
    make_engine: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    from edgeinfer import codec
    from edgeinfer.messages import iso_utc

    decoded: list[int] = []
    real = codec.b64decode

    def counting(data: Any, validate: bool = False) -> bytes:
        decoded.append(len(data))
        return real(data, validate=validate)

    monkeypatch.setattr(codec, "b64decode", counting)
    cfg = RuntimeConfig(max_batch_size=4, max_queue_size=2, decode_threads=1, run_inline_when_idle=False)
    cfg.lanes = 1
    gate = Gate(make_engine(cfg))
    with serving(gate, cfg) as (bus, server):
        img = b64(solid_jpeg((250, 1, 1), (640, 480)))
        stale = iso_utc(time.time() - 5)
        # Past its deadline on arrival, and its image is not even base64: the deadline answers it.
        doc = {"id": "stale", "image": "!!", "deadline_ms": 50, "sent_at": stale}
        bus.publish(INFER, json.dumps(doc).encode())
        bus.publish(INFER, json.dumps({"id": "run", "image": img}).encode())
        assert gate.entered.wait(30)  # "run" holds the engine
        for i in range(cfg.max_queue_size):
            bus.publish(INFER, json.dumps({"id": f"q{i}", "image": img}).encode())
        eventually(lambda: server.batcher.incoming == 0)
        before = len(decoded)
        for i in range(5):
            bus.publish(INFER, json.dumps({"id": f"over{i}", "image": img}).encode())
        assert len(decoded) == before  # the full queue answered them on their header alone
        gate.release.set()
        eventually(lambda: server.batcher.idle)
        bus.publish(INFER, json.dumps({"id": "bad", "image": "!!"}).encode())
        eventually(lambda: len({r.id for r in _answers(bus)}) == 1 + 1 + cfg.max_queue_size + 5 + 1)
        results = {r.id: r for r in _answers(bus)}
        assert len(_answers(bus)) == len(results)  # each answered once
        codes = {rid: r.error.code if r.error else "ok" for rid, r in results.items()}
        assert codes["stale"] is ErrorCode.DEADLINE_EXCEEDED
        assert codes["bad"] is ErrorCode.BAD_IMAGE
        assert {codes[f"over{i}"] for i in range(5)} == {ErrorCode.OVERLOADED}
        assert {codes["run"], *(codes[f"q{i}"] for i in range(cfg.max_queue_size))} == {"ok"}


class LagRecorder(PlacementPolicy):
    """A placement policy that keeps everything on the edge and notes the lag it is shown."""

    def __init__(self) -> None:
        self.ages: list[float | None] = []
        self.late: list[tuple[float | None, float]] = []

    def decide(self, request: Request, ctx: PlacementContext) -> Decision:
        self.ages.append(ctx.age_ms)
        return Decision()

    def on_late_arrival(self, age_ms: float | None, left_ms: float) -> None:
        self.late.append((age_ms, left_ms))


def test_placement_sees_the_lag_of_every_request_that_says_when_it_was_sent(harness: Harness) -> None:
    from edgeinfer.messages import iso_utc

    recorder = LagRecorder()
    harness.server.set_placement(recorder)
    img = b64(solid_jpeg((250, 5, 5)))
    now = time.time()
    harness.send({"id": "old", "image": img, "deadline_ms": 100, "sent_at": iso_utc(now - 5)})
    harness.send({"id": "due", "image": img, "deadline_at": iso_utc(now - 1)})
    harness.send({"id": "new", "image": img, "deadline_ms": 60_000, "sent_at": iso_utc(now - 0.5)})
    harness.send({"id": "plain", "image": img})
    results = {r.id: r for r in harness.wait_results(4)}
    statuses = {rid: r.status for rid, r in results.items()}
    assert statuses == {"old": "error", "due": "error", "new": "ok", "plain": "ok"}
    (old_age, old_left), (due_age, due_left) = recorder.late  # the two answered on arrival
    assert old_age is not None
    assert old_age >= 5000
    assert old_left <= -4900
    assert due_age is None  # it did not say when it was sent
    assert due_left <= -1000
    new_age, plain_age = recorder.ages  # the two decided on
    assert new_age is not None
    assert new_age >= 500
    assert plain_age is None


def test_admission_refuses_what_the_batches_ahead_cannot_leave_time_for(
    make_engine: Callable[..., Engine],
) -> None:
    cfg = RuntimeConfig(max_batch_size=4, max_queue_size=16, decode_threads=1, run_inline_when_idle=False)
    cfg.lanes = 1
    gate = Gate(make_engine(cfg))
    with serving(gate, cfg) as (bus, server):
        img = b64(solid_jpeg((250, 1, 1)))
        bus.publish(INFER, json.dumps({"id": "run", "image": img}).encode())
        assert gate.entered.wait(30)  # "run" holds the engine; eight more queue behind it
        for i in range(8):
            bus.publish(INFER, json.dumps({"id": f"q{i}", "image": img}).encode())
        eventually(lambda: server.batcher.incoming == 0)
        server._engine_ms = 50.0  # as if batches took 50 ms: two full ones ahead take 100 ms
        bus.publish(INFER, json.dumps({"id": "tight", "image": img, "deadline_ms": 80}).encode())
        bus.publish(INFER, json.dumps({"id": "roomy", "image": img, "deadline_ms": 30_000}).encode())
        server.cfg.admit_by_deadline = False  # off: admitted, to expire in the queue
        bus.publish(INFER, json.dumps({"id": "off", "image": img, "deadline_ms": 80}).encode())
        (tight,) = [r for r in _answers(bus) if r.id == "tight"]  # answered at once
        assert tight.error is not None
        assert tight.error.code is ErrorCode.DEADLINE_EXCEEDED
        assert "the batches ahead take at least 100 ms" in tight.error.message
        assert server.batcher.outstanding == 8 + 2
        gate.release.set()
        eventually(lambda: len(_answers(bus)) == 1 + 8 + 3)
        codes = {r.id: r.error.code if r.error else "ok" for r in _answers(bus)}
        assert codes["roomy"] == "ok"
        assert len(_answers(bus)) == len(codes)  # each answered once


# ------------------------------------------------------------------- never `ok` after its deadline


class SlowEngine(Gate):
    """An engine whose runs take `item_s` an image on a fake clock (and, while `held`, wait for the
    gate first): how long a batch takes is the test's to say, without sleeping."""

    def __init__(self, engine: Engine, clock: FakeClock, item_s: float, *, held: bool = False) -> None:
        super().__init__(engine)
        self.clock = clock
        self.item_s = item_s
        if not held:
            self.release.set()

    def run(self, batch: np.ndarray, *, lane: bool = False) -> np.ndarray:
        out = super().run(batch, lane=lane)
        self.clock.advance(self.item_s * batch.shape[0])
        return out


def _by_id(bus: MemoryBus) -> dict[str, Result]:
    answers = _answers(bus)
    by_id = {r.id or "": r for r in answers}
    assert len(by_id) == len(answers)  # none answered twice
    return by_id


def test_a_batch_that_would_end_late_drops_its_doomed_requests_before_running(
    make_engine: Callable[..., Engine],
) -> None:
    cfg = RuntimeConfig(max_batch_size=4, max_queue_size=16, decode_threads=1, run_inline_when_idle=False)
    cfg.lanes = 1
    clock = FakeClock()
    engine = SlowEngine(make_engine(cfg), clock, 0.050, held=True)  # 50 ms an image
    with serving(engine, cfg, clock) as (bus, server):
        img = b64(solid_jpeg((250, 1, 1)))
        bus.publish(INFER, json.dumps({"id": "hold", "image": img}).encode())
        assert engine.entered.wait(30)  # its run (50 ms) teaches the batcher 50 ms an image
        for rid, ms in (("tight", 120), ("roomy", 60_000), ("none", None)):
            doc = {"id": rid, "image": img, **({} if ms is None else {"deadline_ms": ms})}
            bus.publish(INFER, json.dumps(doc).encode())
        eventually(lambda: server.batcher.depth == 3)
        engine.release.set()
        # 50 ms in, "tight" has 70 ms left: a batch of the three would take 150 ms, one of the two
        # others 100 ms — it is answered at once, and they run without it.
        eventually(lambda: len(_answers(bus)) == 4)
        res = _by_id(bus)
        assert engine.sizes == [1, 2]
        assert res["tight"].error is not None
        assert res["tight"].error.code is ErrorCode.DEADLINE_EXCEEDED
        assert res["tight"].error.message == "70 ms left, and a batch of 3 takes about 150 ms"
        assert res["tight"].batch_size == 0  # never computed
        assert [res[r].status for r in ("hold", "roomy", "none")] == ["ok"] * 3
        assert res["roomy"].batch_size == 2
        eventually(lambda: server.batcher.idle)


def test_a_result_ready_after_its_deadline_is_deadline_exceeded_never_ok(
    make_engine: Callable[..., Engine],
) -> None:
    cfg = RuntimeConfig(max_batch_size=4, max_queue_size=16)
    cfg.lanes = 1
    clock = FakeClock()
    engine = SlowEngine(make_engine(cfg), clock, 0.050)
    with serving(engine, cfg, clock) as (bus, server):
        img = b64(solid_jpeg((250, 1, 1)))
        # The first run is nothing to judge by yet: it is computed, and ready 20 ms late.
        for n, (rid, ms) in enumerate((("late", 30), ("plain", None), ("roomy", 60_000)), start=1):
            doc = {"id": rid, "image": img, **({} if ms is None else {"deadline_ms": ms})}
            bus.publish(INFER, json.dumps(doc).encode())
            eventually(lambda n=n: len(_answers(bus)) == n)  # type: ignore[misc]
        res = _by_id(bus)
        assert engine.sizes == [1, 1, 1]
        late = res["late"]
        assert late.status == "error"
        assert late.error is not None
        assert late.error.code is ErrorCode.DEADLINE_EXCEEDED
        assert late.error.message == "the result was ready 20 ms after the deadline"
        assert late.batch_size == 1  # computed, and its timings say where the time went
        assert late.latency_ms.inference == pytest.approx(50.0)
        assert late.latency_ms.total == pytest.approx(50.0)
        assert late.predictions == []
        assert res["plain"].status == "ok"  # no deadline: as slow as it likes
        assert res["roomy"].status == "ok"
        assert server.stats.ok == 2
        assert server.stats.errors == {"DEADLINE_EXCEEDED": 1}


def test_an_offload_given_up_keeps_its_deadline_and_a_late_cloud_answer_is_not_ok(
    make_engine: Callable[..., Engine],
) -> None:
    cfg = RuntimeConfig(max_batch_size=2)
    cfg.lanes = 1
    clock = FakeClock()
    engine = SlowEngine(make_engine(cfg), clock, 0.001)

    class Policy(PlacementPolicy):
        def decide(self, request: Request, ctx: PlacementContext) -> Decision:
            return Decision("cloud")

    class Cloud:
        """Takes 200 ms: "lost" is given up and served locally, "slow" answered by the cloud, late."""

        def offload(self, request: Request, ctx: PlacementContext, reply: Callable[[Result], None]) -> None:
            clock.advance(0.200)
            if request.id == "lost":
                assert ctx.local is not None
                ctx.local()
            else:
                reply(Result(request.id, "ok", "", placement="cloud", provider="cloud"))

    with serving(engine, cfg, clock) as (bus, server):
        server.set_placement(Policy(), Cloud())
        img = b64(solid_jpeg((250, 1, 1)))
        for rid in ("lost", "slow"):
            bus.publish(INFER, json.dumps({"id": rid, "image": img, "deadline_ms": 100}).encode())
        eventually(lambda: len(_answers(bus)) == 2)
        res = _by_id(bus)
        assert engine.sizes == []  # neither computed here
        for rid in ("lost", "slow"):
            error = res[rid].error
            assert error is not None
            assert error.code is ErrorCode.DEADLINE_EXCEEDED
        assert res["lost"].error is not None
        assert res["lost"].error.message == "the deadline had passed 100 ms before the offload was given up"
        assert res["slow"].placement == "cloud"
        eventually(lambda: server.inflight.count == 0)


# ------------------------------------------------------------------------------ a model's failed start


def test_a_model_whose_start_after_its_load_fails_is_not_left_loaded_and_is_loaded_again_later(
    make_engine: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    from edgeinfer.runtime.models import ModelRepository, ModelSlot, ModelSource

    cfg = RuntimeConfig(max_batch_size=4, lanes=1, execution_providers=["CPUExecutionProvider"])
    builds: list[str] = []

    def build(slot: ModelSlot) -> Engine:
        builds.append(slot.name)
        return make_engine(cfg)

    slots = [ModelSlot(ModelSource("a", ""), make_engine(cfg)), ModelSlot(ModelSource("b", ""))]
    repo = ModelRepository(slots, build=build)
    bus = MemoryBus()
    server = InferenceServer(bus, slots[0].engine, cfg, THING, models=repo)  # type: ignore[arg-type]
    server.start()
    broken = [True]
    from edgeinfer.runtime.decode import warm_up_decoder as warm_up

    def warm_up_once_broken(*args: Any) -> None:
        if broken[0]:
            raise RuntimeError("no codec")
        warm_up(*args)

    monkeypatch.setattr("edgeinfer.runtime.server.warm_up_decoder", warm_up_once_broken)

    def ask(rid: str) -> Result:
        bus.publish(
            INFER, json.dumps({"id": rid, "image": b64(solid_jpeg((5, 5, 250))), "model": "b"}).encode()
        )

        def found() -> list[Result]:
            return [r for r in (Result.parse(m.payload) for m in bus.messages_on(RESULT)) if r.id == rid]

        eventually(lambda: bool(found()), 30, f"the answer to {rid}")
        return found()[0]

    try:
        why = "model b did not load: its start failed: no codec"
        first = ask("first")  # waited for the load, whose start failed
        assert first.error is not None
        assert (first.error.code, first.error.message) == (ErrorCode.INTERNAL, why)
        assert slots[1].engine is None  # not left "loaded" with no engine thread to run its batches
        again = ask("again")  # answered at once, the same way, without another load
        assert again.error is not None
        assert (again.error.code, again.error.message) == (ErrorCode.INTERNAL, why)
        assert builds == ["b"]
        broken[0] = False
        monkeypatch.setattr("edgeinfer.runtime.models.RETRY_S", 0.0)  # its retry time has passed
        retried = ask("retried")
        assert retried.status == "ok", retried.error
        assert builds == ["b", "b"]
        assert any(t.is_alive() for t in slots[1].threads)
        eventually(lambda: server.inflight.count == 0, what="every request counted out")
    finally:
        server.stop()


def test_a_request_admitted_before_its_models_start_fails_and_queued_after_is_answered_with_the_reason(
    make_engine: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import os

    from edgeinfer.runtime.models import ModelRepository, ModelSlot, ModelSource

    cfg = RuntimeConfig(
        max_batch_size=4,
        lanes=1,
        decode_threads=1,  # one decode worker, held below: "late" is decoded after the failed start
        run_inline_when_idle=False,
        image_folders=[str(tmp_path)],
        execution_providers=["CPUExecutionProvider"],
    )
    slots = [ModelSlot(ModelSource("a", ""), make_engine(cfg)), ModelSlot(ModelSource("b", ""))]
    repo = ModelRepository(slots, build=lambda slot: make_engine(cfg))
    bus = MemoryBus()
    server = InferenceServer(bus, slots[0].engine, cfg, THING, models=repo)  # type: ignore[arg-type]
    server.start()
    starting, fail = threading.Event(), threading.Event()

    def warm_up_held_then_broken(*_args: Any) -> None:
        starting.set()
        fail.wait(30)
        raise RuntimeError("no codec")

    monkeypatch.setattr("edgeinfer.runtime.server.warm_up_decoder", warm_up_held_then_broken)
    held = tmp_path / "held.jpg"
    os.mkfifo(held)  # its reader (the one decode worker) waits until it is written

    def send(rid: str, **fields: Any) -> None:
        bus.publish(INFER, json.dumps({"id": rid, **fields}).encode(), target="local")

    def write_held(data: bytes) -> None:
        """Once the decode worker reads `held` (until then there is no reader: ENXIO)."""
        fd: list[int] = []

        def opened() -> bool:
            with contextlib.suppress(OSError):
                fd.append(os.open(held, os.O_WRONLY | os.O_NONBLOCK))
            return bool(fd)

        eventually(opened, 30, "the decode worker reading the held image")
        try:
            os.write(fd[0], data)
        finally:
            os.close(fd[0])

    def answer(rid: str) -> Result:
        def found() -> list[Result]:
            return [r for r in (Result.parse(m.payload) for m in bus.messages_on(RESULT)) if r.id == rid]

        eventually(lambda: bool(found()), 30, f"the answer to {rid}")
        (res,) = found()
        return res

    try:
        image = b64(solid_jpeg((5, 5, 250)))
        send("first", image=image, model="b")  # its load: built, then held in its start
        assert starting.wait(30)
        send("blocker", image_path=str(held))  # the default model's: holds the decode worker
        send("late", image=image, model="b")  # b is loaded now: admitted to its batcher
        eventually(lambda: slots[1].batcher.outstanding == 1, what="late admitted to b's batcher")
        fail.set()
        why = "model b did not load: its start failed: no codec"
        first = answer("first")
        assert first.error is not None
        assert (first.error.code, first.error.message) == (ErrorCode.INTERNAL, why)
        write_held(base64.b64decode(image))
        assert answer("blocker").status == "ok"
        late = answer("late")
        assert late.error is not None
        assert (late.error.code, late.error.message) == (ErrorCode.INTERNAL, why)
        eventually(lambda: slots[1].batcher.idle, what="nothing left counted on b's batcher")
        eventually(lambda: server.inflight.count == 0, what="every request counted out")
    finally:
        server.stop()
