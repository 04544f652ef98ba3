"""The placement seam: a base class whose hooks are no-ops, called by the server directly."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable

from edgeinfer.messages import Request, Result, result_topic
from edgeinfer.runtime.config import RuntimeConfig
from edgeinfer.runtime.engine import Engine
from edgeinfer.runtime.placement import (
    EDGE,
    Decision,
    EdgeOnly,
    HybridPlacement,
    PlacementContext,
    PlacementPolicy,
    Reply,
)
from edgeinfer.runtime.server import InferenceServer
from edgeinfer.transport import MemoryBus
from tests.helpers.images import solid_jpeg
from tests.helpers.wait import eventually

THING = "dev1"

CTX = PlacementContext(
    thing=THING,
    target="local",
    queue_depth=0,
    outstanding=0,
    max_queue_size=8,
    max_batch_size=4,
    engine_ms_per_batch=0.0,
    mean_batch_size=0.0,
    deadline_left_ms=None,
    provider="CPUExecutionProvider",
)


def test_the_base_policy_serves_on_the_edge_and_its_hooks_do_nothing() -> None:
    base = PlacementPolicy()
    req = Request("r")
    res = Result("r", "ok", "")
    assert base.decide(req, CTX) is EDGE
    assert EdgeOnly().decide(req, CTX) is EDGE
    base.on_batch_start(2)
    base.on_batch_end(2, 1.0)
    base.on_result("r", res)
    base.on_late_arrival(None, -1.0)
    assert base.cascade(req, res, lambda r: None) is False
    assert issubclass(EdgeOnly, PlacementPolicy)
    assert issubclass(HybridPlacement, PlacementPolicy)


class Recorder(PlacementPolicy):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def decide(self, request: Request, ctx: PlacementContext) -> Decision:
        self.calls.append("decide")
        return EDGE

    def on_batch_start(self, batch_size: int) -> None:
        self.calls.append("start")

    def on_batch_end(self, batch_size: int, compute_ms: float) -> None:
        self.calls.append("end")

    def on_result(self, request_id: str | None, result: Result) -> None:
        self.calls.append(f"result {request_id} {result.status}")


class Raising(PlacementPolicy):
    """Every hook raises: serving goes on, each counting as its default."""

    def decide(self, request: Request, ctx: PlacementContext) -> Decision:
        raise RuntimeError("decide")

    def on_batch_start(self, batch_size: int) -> None:
        raise RuntimeError("start")

    def on_batch_end(self, batch_size: int, compute_ms: float) -> None:
        raise RuntimeError("end")

    def on_result(self, request_id: str | None, result: Result) -> None:
        raise RuntimeError("result")

    def on_late_arrival(self, age_ms: float | None, left_ms: float) -> None:
        raise RuntimeError("late")

    def cascade(self, request: Request, result: Result, reply: Reply) -> bool:
        raise RuntimeError("cascade")


class Cloud:
    def offload(self, request: Request, ctx: PlacementContext, reply: Reply) -> None:
        raise AssertionError("a raising policy's decision counts as edge")


def _serve(
    make_engine: Callable[..., Engine], policy: PlacementPolicy, *, offloader: Cloud | None = None
) -> list[Result]:
    cfg = RuntimeConfig(max_batch_size=2)
    bus = MemoryBus()
    server = InferenceServer(bus, make_engine(cfg), cfg, THING, placement=policy, offloader=offloader)
    server.start()
    try:
        img = base64.b64encode(solid_jpeg((250, 1, 1))).decode()
        bus.publish(f"edgeinfer/{THING}/infer", json.dumps({"id": "a", "image": img}).encode())
        bus.publish(
            f"edgeinfer/{THING}/infer",
            json.dumps({"id": "late", "image": img, "deadline_at": "2000-01-01T00:00:00Z"}).encode(),
        )
        eventually(lambda: len(bus.messages_on(result_topic(THING))) == 2)
        return [Result.parse(m.payload) for m in bus.messages_on(result_topic(THING))]
    finally:
        server.stop()


def test_the_server_calls_a_policys_hooks(make_engine: Callable[..., Engine]) -> None:
    policy = Recorder()
    results = {r.id: r.status for r in _serve(make_engine, policy)}
    assert results == {"a": "ok", "late": "error"}
    assert policy.calls.count("decide") == 1  # the late one is answered before any decision
    assert policy.calls.index("start") < policy.calls.index("end") < policy.calls.index("result a ok")
    assert "result late error" in policy.calls


def test_a_policy_that_raises_never_breaks_serving(make_engine: Callable[..., Engine]) -> None:
    results = {r.id: r.status for r in _serve(make_engine, Raising(), offloader=Cloud())}
    assert results == {"a": "ok", "late": "error"}
