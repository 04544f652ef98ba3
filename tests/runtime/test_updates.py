"""Model updates: the defer decision (a clock passed in), the component-update subscription on both
nuclei, the ModelStore pointer watch, a store swapped in by the component on a MemoryBus, and the
server's count of accepted requests not yet answered (what the decision reads)."""

from __future__ import annotations

import argparse
import base64
import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from edgeinfer.messages import Result
from edgeinfer.runtime.component import Component
from edgeinfer.runtime.config import RuntimeConfig, default_recipe_configuration
from edgeinfer.runtime.server import InferenceServer
from edgeinfer.runtime.updates import (
    MAX_DEFER_S,
    RECHECK_MS,
    STORE,
    DeferPolicy,
    InFlight,
    StoreWatcher,
    follow_component_updates,
    store_pointer,
)
from edgeinfer.transport import MemoryBus, TransportError
from tests.helpers.clock import FakeClock
from tests.helpers.images import solid_jpeg
from tests.helpers.tiny_store import write_tiny_store
from tests.helpers.wait import eventually

THING = "u1"


def in_flight(n: int) -> InFlight:
    inflight = InFlight()
    for _ in range(n):
        inflight.enter()
    return inflight


# ------------------------------------------------------------------------------------ the decision


def test_no_request_in_flight_lets_the_deployment_proceed() -> None:
    assert DeferPolicy(InFlight(), clock=FakeClock()).decide("d1") == (0, "no requests in flight")


def test_requests_in_flight_defer_until_they_are_answered() -> None:
    inflight, clock = in_flight(2), FakeClock()
    policy = DeferPolicy(inflight, clock=clock)
    assert policy.decide("d1") == (RECHECK_MS, "2 requests in flight")
    clock.advance(1.5)
    inflight.leave()
    assert policy.decide("d1") == (RECHECK_MS, "1 requests in flight")
    inflight.leave()
    assert policy.decide("d1") == (0, "no requests in flight")


def test_deferral_is_bounded_under_a_load_that_never_drains(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    policy = DeferPolicy(in_flight(3), clock=clock)
    assert policy.decide("d1")[0] == RECHECK_MS
    clock.advance(MAX_DEFER_S - 0.2)
    assert policy.decide("d1")[0] == 200  # never past the bound
    clock.advance(0.2)
    with caplog.at_level(logging.WARNING, logger="edgeinfer.runtime"):
        recheck, message = policy.decide("d1")
    assert recheck == 0
    assert message == f"3 requests in flight after {MAX_DEFER_S:.0f} s of deferral"
    assert "letting it proceed" in caplog.text


def test_each_deployment_has_its_own_bound() -> None:
    clock = FakeClock()
    policy = DeferPolicy(in_flight(1), clock=clock)
    policy.decide("d1")
    clock.advance(MAX_DEFER_S)
    assert policy.decide("d1")[0] == 0
    policy.done("d1")  # its PostComponentUpdateEvent
    assert policy.decide("d1")[0] == RECHECK_MS  # announced again: a new wait
    assert policy.decide("d2")[0] == RECHECK_MS


# ----------------------------------------------------------------------- the subscription, per nucleus


class UpdatesBus(MemoryBus):
    """A MemoryBus that serves component updates as the classic nucleus does (or refuses them)."""

    def __init__(self, served: bool = True) -> None:
        super().__init__()
        self.served = served
        self.handlers: list[Callable[[str, str], None]] = []
        self.deferrals: list[tuple[str, str, int]] = []

    def on_component_update(self, handler: Callable[[str, str], None]) -> Any:
        if not self.served:
            raise TransportError("SubscribeToComponentUpdates: ServiceError: the nucleus does not serve it")
        self.handlers.append(handler)
        return self

    def defer_component_update(self, deployment_id: str, message: str, recheck_after_ms: int) -> None:
        self.deferrals.append((deployment_id, message, recheck_after_ms))

    def event(self, kind: str, deployment_id: str) -> None:
        for handler in self.handlers:
            handler(kind, deployment_id)


def test_each_pre_update_event_is_answered_and_post_looks_at_the_store() -> None:
    bus, inflight, posts = UpdatesBus(), in_flight(1), []
    sub = follow_component_updates(
        bus, DeferPolicy(inflight, clock=FakeClock()), lambda: posts.append(1), "c"
    )
    assert sub is bus
    bus.event("pre", "d1")
    inflight.leave()
    bus.event("pre", "d1")
    bus.event("post", "d1")
    assert bus.deferrals == [("d1", "1 requests in flight", RECHECK_MS), ("d1", "no requests in flight", 0)]
    assert posts == [1]


@pytest.mark.parametrize("bus", [UpdatesBus(served=False), MemoryBus()], ids=["lite", "no-ipc"])
def test_without_component_updates_it_runs_and_says_so_once(
    bus: MemoryBus, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="edgeinfer.runtime"):
        sub = follow_component_updates(bus, DeferPolicy(InFlight()), lambda: None, "c")
    assert sub is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1
    assert "deployments do not wait for requests in flight" in lines[0]
    assert "SubscribeToComponentUpdates" in lines[0]


# ------------------------------------------------------------------------------- the store pointer


def test_the_pointer_is_beside_the_runtime_work_folder_on_both_nuclei(tmp_path: Path) -> None:
    expected = tmp_path / "work" / STORE / "artifacts-path"
    assert store_pointer(str(tmp_path / "work" / "com.edgeinfer.InferenceRuntime")) == expected
    assert store_pointer(f"{tmp_path}/work/com.edgeinfer.InferenceRuntime/") == expected  # lite's slash


def test_the_watcher_reports_a_new_folder_once(tmp_path: Path) -> None:
    pointer = tmp_path / "artifacts-path"
    pointer.write_text(f"{tmp_path}/v1\n")
    seen: list[str] = []
    watcher = StoreWatcher(pointer, str(tmp_path / "v1"), seen.append)
    assert not watcher.check()  # the folder the runtime started on
    pointer.write_text(f"{tmp_path}/v2/\n")  # lite writes its artifact path with a trailing slash
    assert watcher.check()
    pointer.write_text(f"{tmp_path}/v2\n")
    assert not watcher.check()
    pointer.unlink()
    assert not watcher.check()
    pointer.write_text("")
    assert not watcher.check()
    assert seen == [str(tmp_path / "v2")]


# --------------------------------------------------------------------------- the component, swapped


def store(folder: Path, version: str) -> Path:
    write_tiny_store(folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["version"] = version
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def ask(bus: MemoryBus, rid: str) -> Result:
    bus.publish(
        f"edgeinfer/{THING}/infer",
        json.dumps({"id": rid, "image": base64.b64encode(solid_jpeg((3, 3, 240))).decode()}).encode(),
    )
    topic = f"edgeinfer/{THING}/result"
    eventually(lambda: any(Result.parse(m.payload).id == rid for m in bus.messages_on(topic)))
    return next(r for r in (Result.parse(m.payload) for m in bus.messages_on(topic)) if r.id == rid)


def test_a_new_store_is_swapped_in_and_a_bad_one_keeps_the_old(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    v1 = store(tmp_path / "packages" / "v1", "0.0.1")
    pointer = tmp_path / "work" / STORE / "artifacts-path"
    pointer.parent.mkdir(parents=True)
    pointer.write_text(f"{v1}\n")
    config = default_recipe_configuration()
    config.update({"maxBatchSize": 4, "executionProviders": ["cpu"]})
    bus = UpdatesBus()
    bus.config = config
    args = argparse.Namespace(
        model_dir=str(v1),
        work_dir=str(tmp_path / "work" / "com.edgeinfer.InferenceRuntime"),
        thing=THING,
        option=[],
    )
    comp = Component(bus, args)
    comp.start()
    try:
        assert comp.store_watcher is not None
        assert ask(bus, "a").model is not None
        assert ask(bus, "b").model.version == "0.0.1"  # type: ignore[union-attr]
        old = comp.server.engine
        v2 = store(tmp_path / "packages" / "v2", "0.0.2")
        pointer.write_text(f"{v2}\n")
        bus.event("post", "d1")  # looked at once, not at the next poll
        eventually(lambda: comp.server.engine is not old, 30, "the new engine")
        assert ask(bus, "c").model.version == "0.0.2"  # type: ignore[union-attr]
        broken = tmp_path / "packages" / "v3"
        broken.mkdir()
        pointer.write_text(f"{broken}\n")
        with caplog.at_level(logging.ERROR, logger="edgeinfer.runtime"):
            assert comp.store_watcher.check()
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1
        assert errors[0].startswith(f"model store at {broken} not loaded, still serving tiny 0.0.2: ")
        assert ask(bus, "d").model.version == "0.0.2"  # type: ignore[union-attr]
        assert comp.server.inflight.count == 0  # every accepted request answered
    finally:
        comp.stop()


def test_the_server_counts_each_accepted_request_until_its_answer(
    make_engine: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = RuntimeConfig(max_batch_size=4, max_queue_size=16, run_inline_when_idle=False)
    engine = make_engine(cfg)
    run, release = engine.run, threading.Event()

    def held_run(*args: Any, **kwargs: Any) -> Any:
        release.wait(30)
        return run(*args, **kwargs)

    monkeypatch.setattr(engine, "run", held_run)
    bus = MemoryBus()
    server = InferenceServer(bus, engine, cfg, THING)
    server.start()
    try:
        image = base64.b64encode(solid_jpeg((3, 3, 240))).decode()
        topic = f"edgeinfer/{THING}/infer"
        for i in range(3):
            bus.publish(topic, json.dumps({"id": f"r{i}", "image": image}).encode())
        bus.publish(topic, b"not json")  # answered BAD_REQUEST at once, never accepted
        bus.publish(topic, json.dumps({"id": "late", "image": image, "deadline_at": 1.0}).encode())
        assert server.inflight.count == 3  # the expired one was accepted and answered on arrival
        release.set()

        def answers() -> list[Result]:
            results = [Result.parse(m.payload) for m in bus.messages_on(f"edgeinfer/{THING}/result")]
            return [r for r in results if r.id and r.id.startswith("r")]

        # The count is left before the answer is published: wait on the answers, then on the count.
        eventually(lambda: len(answers()) == 3, 30, "the three accepted requests answered")
        assert sorted(r.status for r in answers()) == ["ok"] * 3
        eventually(lambda: server.inflight.count == 0, 30, "every accepted request counted out")
    finally:
        release.set()
        server.stop()
