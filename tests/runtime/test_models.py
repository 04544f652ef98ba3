"""Several models in one runtime: chosen by `model`, loaded off the hot path within a budget, updated
one at a time. Real ONNX Runtime on tiny stores (a classifier under several names, a detector)."""

from __future__ import annotations

import argparse
import base64
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgeinfer.messages import ErrorCode, Request, Result, result_topic
from edgeinfer.model.manifest import Manifest
from edgeinfer.runtime.answer import Job
from edgeinfer.runtime.component import Component
from edgeinfer.runtime.config import ModelEntry, RuntimeConfig, default_recipe_configuration
from edgeinfer.runtime.engine import BackgroundLoad, Engine, loading_settings
from edgeinfer.runtime.inbound import ReplyTarget
from edgeinfer.runtime.models import (
    LOAD_WAIT_S,
    ModelRepository,
    ModelSlot,
    ModelSource,
    RepositoryHooks,
    read_sources,
)
from edgeinfer.runtime.server import InferenceServer
from edgeinfer.runtime.updates import store_pointer
from edgeinfer.transport import MemoryBus
from tests.helpers.clock import FakeClock
from tests.helpers.images import solid_jpeg
from tests.helpers.tiny_store import write_tiny_store
from tests.helpers.wait import eventually

THING = "m1"
INFER = f"edgeinfer/{THING}/infer"
RESULT = f"edgeinfer/{THING}/result"
CFG = {"maxBatchSize": 4, "executionProviders": ["cpu"], "lanes": 1, "subscribeIot": False}


def named_store(folder: Path, name: str, version: str = "0.0.1") -> Path:
    """The tiny classifier's store under another manifest name (and version)."""
    write_tiny_store(folder)
    manifest = Manifest.load(folder)
    manifest.name, manifest.version = name, version
    manifest.save(folder)
    return folder


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("stores")
    return {name: named_store(root / name, name) for name in ("alpha", "beta", "gamma", "delta")}


@pytest.fixture(scope="module")
def detector(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.helpers.tiny_detector import build_tiny_detector_store

    return build_tiny_detector_store(tmp_path_factory.mktemp("detector"))


def component(tmp_path: Path, models: list[dict[str, Any]], **more: Any) -> tuple[Component, MemoryBus]:
    config = default_recipe_configuration()
    config.update({**CFG, "models": models, **more})
    bus = MemoryBus(config=config)
    work = tmp_path / "work" / "com.edgeinfer.InferenceRuntime"
    work.mkdir(parents=True, exist_ok=True)
    args = argparse.Namespace(model_dir="", work_dir=str(work), thing=THING, option=[])
    return Component(bus, args), bus


def send(bus: MemoryBus, rid: str, rgb: tuple[int, int, int] = (3, 3, 240), **fields: Any) -> None:
    image = base64.b64encode(solid_jpeg(rgb)).decode()
    bus.publish(INFER, json.dumps({"id": rid, "image": image, **fields}).encode())


def answer(bus: MemoryBus, rid: str, timeout: float = 30) -> Result:
    def find() -> Result | None:
        return next(
            (r for r in (Result.parse(m.payload) for m in bus.messages_on(RESULT)) if r.id == rid), None
        )

    eventually(lambda: find() is not None, timeout, f"the answer to {rid}")
    found = find()
    assert found is not None
    return found


def ask(bus: MemoryBus, rid: str, rgb: tuple[int, int, int] = (3, 3, 240), **fields: Any) -> Result:
    send(bus, rid, rgb, **fields)
    return answer(bus, rid)


@pytest.fixture
def running() -> Iterator[list[Component]]:
    started: list[Component] = []
    yield started
    for comp in started:
        comp.stop()


def start(comp: Component, running: list[Component]) -> Component:
    comp.start()
    running.append(comp)
    return comp


def alone(store: Path, tmp_path: Path, rid: str, rgb: tuple[int, int, int], **fields: Any) -> Result:
    """What the store answers when it is the runtime's one model (`modelDir`)."""
    config = default_recipe_configuration()
    config.update({**CFG, "modelDir": str(store)})
    bus = MemoryBus(config=config)
    args = argparse.Namespace(model_dir="", work_dir=str(tmp_path / "alone"), thing=THING, option=[])
    comp = Component(bus, args)
    comp.start()
    try:
        return ask(bus, rid, rgb, **fields)
    finally:
        comp.stop()


def same_answer(a: Result, b: Result) -> None:
    assert a.status == b.status == "ok"
    assert a.model == b.model
    assert [(p.index, p.label, round(p.score, 5)) for p in a.predictions] == [
        (p.index, p.label, round(p.score, 5)) for p in b.predictions
    ]
    assert [d.to_dict() for d in a.detections or []] == [d.to_dict() for d in b.detections or []]


# ------------------------------------------------------------------------------------------ choosing


@pytest.mark.devtool  # the tiny detector is built by the model build pipeline
def test_two_models_chosen_by_model_each_answer_equal_to_that_store_alone(
    stores: dict[str, Path], detector: Path, tmp_path: Path, running: list[Component]
) -> None:
    det_name = Manifest.load(detector).name
    comp, bus = component(tmp_path, [{"dir": str(stores["alpha"])}, {"dir": str(detector), "preload": True}])
    start(comp, running)
    assert comp.server.models.names() == ["alpha", det_name]
    white = (250, 250, 250)
    default = ask(bus, "default", white)
    named = ask(bus, "named", white, model="alpha")
    boxes = ask(bus, "boxes", white, model=det_name)
    assert default.model is not None
    assert default.model.name == "alpha"
    same_answer(default, named)
    assert boxes.model is not None
    assert boxes.model.name == det_name
    assert boxes.detections  # a white image finds the tiny detector's boxes
    same_answer(default, alone(stores["alpha"], tmp_path, "a", white))
    same_answer(boxes, alone(detector, tmp_path, "d", white))
    # each model its own batcher and engine threads
    alpha, det = comp.server.models.slots
    assert alpha.batcher is not det.batcher
    assert alpha.engine is not None
    assert det.engine is not None
    assert {t.name for t in det.threads} == {f"edgeinfer-engine-{det_name}-1"}


def test_an_unknown_model_is_refused_naming_every_model_served(
    stores: dict[str, Path], tmp_path: Path, running: list[Component]
) -> None:
    comp, bus = component(tmp_path, [{"dir": str(stores["alpha"])}, {"dir": str(stores["beta"])}])
    start(comp, running)
    res = ask(bus, "x", model="nope")
    assert res.error is not None
    assert res.error.code == ErrorCode.BAD_REQUEST
    assert res.error.message == "unknown model 'nope': this runtime serves 'alpha', 'beta'"
    assert comp.server.models.slots[1].engine is None  # refused, nothing loaded for it


def test_the_one_store_path_refuses_as_before() -> None:
    from edgeinfer.runtime.inbound import model_refusal

    assert model_refusal("x", ["tiny"]) == "unknown model 'x': this runtime serves 'tiny'"


# ---------------------------------------------------------------------------------------- budget


def test_budget_two_of_three_a_request_to_the_third_evicts_the_least_recently_used(
    stores: dict[str, Path], tmp_path: Path, running: list[Component]
) -> None:
    models = [{"dir": str(stores[n])} for n in ("alpha", "beta", "gamma", "delta")]
    comp, bus = component(tmp_path, models, maxLoadedModels=3)
    start(comp, running)
    repo = comp.server.models
    _alpha, beta, _gamma, _delta = repo.slots
    assert [s.engine is not None for s in repo.slots] == [True, False, False, False]
    assert ask(bus, "b1", model="beta").status == "ok"
    assert ask(bus, "c1", model="gamma").status == "ok"
    assert ask(bus, "b2", model="beta").status == "ok"  # beta is used after gamma
    assert ask(bus, "d1", model="delta").status == "ok"
    # the default is never evicted; gamma was the least recently used of the others
    assert [s.engine is not None for s in repo.slots] == [True, True, False, True]
    assert ask(bus, "a1").status == "ok"
    assert ask(bus, "c2", model="gamma").status == "ok"  # loaded again: beta goes now
    assert [s.engine is not None for s in repo.slots] == [True, False, True, True]
    eventually(lambda: not any(t.is_alive() for t in beta.threads), what="the evicted model's threads end")


def test_budget_two_with_three_configured_keeps_the_pinned_one(
    stores: dict[str, Path], tmp_path: Path, running: list[Component]
) -> None:
    models = [{"dir": str(stores["alpha"])}, {"dir": str(stores["beta"])}, {"dir": str(stores["gamma"])}]
    comp, bus = component(tmp_path, models, maxLoadedModels=2)
    start(comp, running)
    repo = comp.server.models
    assert ask(bus, "b", model="beta").status == "ok"
    assert ask(bus, "g", model="gamma").status == "ok"  # the third evicts beta, not the default
    # beta's answer is published before its batch is done and its lease released: until then it is
    # busy, and the loader unloads it once it drains
    eventually(lambda: [s.name for s in repo.loaded()] == ["alpha", "gamma"], what="beta evicted")
    pinned: list[dict[str, Any]] = [
        {"dir": str(stores["alpha"])},
        {"dir": str(stores["beta"]), "pinned": True},
    ]
    comp2, bus2 = component(tmp_path / "2", [*pinned, {"dir": str(stores["gamma"])}], maxLoadedModels=2)
    start(comp2, running)
    eventually(
        lambda: comp2.server.models.slots[1].engine is not None, what="the pinned model loaded at start"
    )
    res = ask(bus2, "g", model="gamma")  # nothing may go for it: served over the budget, not refused
    assert res.status == "ok"
    eventually(lambda: comp2.server.models.slots[2].engine is None, what="back within the budget once idle")
    assert [s.name for s in comp2.server.models.loaded()] == ["alpha", "beta"]


# ---------------------------------------------------------------------------------------- loading


class GatedBuild:
    """A repository's `build` that waits for `release` and notes the thread it ran on."""

    def __init__(self, engines: dict[str, Engine]) -> None:
        self.engines = engines
        self.release = threading.Event()
        self.threads: list[str] = []

    def __call__(self, slot: ModelSlot) -> Engine:
        self.threads.append(threading.current_thread().name)
        assert self.release.wait(30)
        return self.engines[slot.name]


@pytest.fixture
def two_engines(stores: dict[str, Path], tmp_path: Path) -> dict[str, Engine]:
    cfg = RuntimeConfig(max_batch_size=4, lanes=1, execution_providers=["CPUExecutionProvider"])
    out = {}
    for name in ("alpha", "beta"):
        engine = Engine.create(Manifest.load(stores[name]), cfg, str(tmp_path / "work"))
        engine.warm_up(runs=1)
        out[name] = engine
    return out


@pytest.fixture
def gated(
    two_engines: dict[str, Engine], stores: dict[str, Path]
) -> Iterator[tuple[MemoryBus, InferenceServer, GatedBuild]]:
    build = GatedBuild(two_engines)
    slots = [
        ModelSlot(ModelSource("alpha", str(stores["alpha"])), two_engines["alpha"]),
        ModelSlot(ModelSource("beta", str(stores["beta"]), version="0.0.1")),
    ]
    repo = ModelRepository(slots, build=build)
    cfg = RuntimeConfig(max_batch_size=4, lanes=1, execution_providers=["CPUExecutionProvider"])
    bus = MemoryBus()
    server = InferenceServer(bus, two_engines["alpha"], cfg, THING, models=repo)
    server.start()
    try:
        yield bus, server, build
    finally:
        build.release.set()
        server.stop()


def test_a_request_during_a_load_waits_within_its_deadline_off_the_transport_thread(
    gated: tuple[MemoryBus, InferenceServer, GatedBuild],
) -> None:
    bus, server, build = gated
    t0 = time.monotonic()
    send(bus, "waits", model="beta", deadline_ms=30_000)
    send(bus, "also", model="beta")  # no deadline, and no load timed yet: waits too
    assert time.monotonic() - t0 < 1  # the transport's thread did not wait for the load
    assert ask(bus, "other").status == "ok"  # the default model serves meanwhile
    eventually(lambda: build.threads == ["edgeinfer-load-beta"], what="the load on the loader thread")
    assert not [m for m in bus.messages_on(RESULT) if Result.parse(m.payload).id in ("waits", "also")]
    build.release.set()
    for rid in ("waits", "also"):
        res = answer(bus, rid)
        assert res.status == "ok"
        assert res.model is not None
        assert res.model.name == "beta"
    eventually(lambda: server.inflight.count == 0, what="every accepted request counted out")


def test_a_request_whose_deadline_a_load_cannot_meet_is_answered_at_once(
    gated: tuple[MemoryBus, InferenceServer, GatedBuild],
) -> None:
    bus, server, build = gated
    beta = server.models.slots[1]
    beta.load_s = 10.0  # its last load took this long
    send(bus, "short", model="beta", deadline_ms=500)
    send(bus, "none", model="beta")  # no deadline: waits at most LOAD_WAIT_S, less than the load
    assert LOAD_WAIT_S < 10.0
    for rid in ("short", "none"):
        res = answer(bus, rid, timeout=1)
        assert res.error is not None
        assert res.error.code == ErrorCode.OVERLOADED
        assert res.error.message.startswith("model beta is loading (about ")
        assert res.model is not None
        assert res.model.name == "beta"
    send(bus, "later", model="beta", deadline_ms=30_000)  # waits for the load under way
    build.release.set()
    assert answer(bus, "later").status == "ok"


def test_a_request_waiting_past_its_deadline_is_answered_deadline_exceeded(
    gated: tuple[MemoryBus, InferenceServer, GatedBuild],
) -> None:
    bus, server, _build = gated
    t0 = time.monotonic()
    send(bus, "brief", model="beta", deadline_ms=200)
    res = answer(bus, "brief", timeout=5)
    assert 0.15 < time.monotonic() - t0 < 3
    assert res.error is not None
    assert res.error.code == ErrorCode.DEADLINE_EXCEEDED
    assert res.error.message == "deadline passed while model beta was loading"
    eventually(lambda: server.inflight.count == 0, what="counted out")


def test_a_store_that_does_not_load_answers_its_waiting_requests_and_then_at_once(
    stores: dict[str, Path], two_engines: dict[str, Engine]
) -> None:
    def broken(slot: ModelSlot) -> Engine:
        raise RuntimeError("no such file")

    slots = [
        ModelSlot(ModelSource("alpha", str(stores["alpha"])), two_engines["alpha"]),
        ModelSlot(ModelSource("beta", "/nowhere")),
    ]
    cfg = RuntimeConfig(max_batch_size=4, lanes=1)
    bus = MemoryBus()
    server = InferenceServer(
        bus, two_engines["alpha"], cfg, THING, models=ModelRepository(slots, build=broken)
    )
    server.start()
    try:
        send(bus, "first", model="beta", deadline_ms=10_000)
        first = answer(bus, "first")
        assert first.error is not None
        assert first.error.code == ErrorCode.INTERNAL
        assert first.error.message == "model beta did not load: no such file"
        second = ask(bus, "second", model="beta")
        assert second.error is not None
        assert second.error.message == first.error.message
        assert ask(bus, "default").status == "ok"
    finally:
        server.stop()


def test_requests_that_waited_are_answered_when_starting_the_loaded_model_fails(
    gated: tuple[MemoryBus, InferenceServer, GatedBuild], monkeypatch: pytest.MonkeyPatch
) -> None:
    bus, server, build = gated

    def broken_warm_up(*_args: object) -> None:
        raise RuntimeError("warm-up failed")

    monkeypatch.setattr("edgeinfer.runtime.server.warm_up_decoder", broken_warm_up)
    send(bus, "w1", model="beta", deadline_ms=30_000)
    send(bus, "w2", model="beta")
    eventually(lambda: len(server.models.slots[1].waiting) == 2, what="both wait for beta's load")
    build.release.set()
    for rid in ("w1", "w2"):
        res = answer(bus, rid)
        assert res.error is not None
        assert res.error.code == ErrorCode.INTERNAL
    eventually(lambda: server.inflight.count == 0, what="every accepted request counted out")


class _FailingUnload(RepositoryHooks):
    def on_unloaded(self, slot: ModelSlot, engine: Engine) -> None:
        raise RuntimeError("unload failed")


def test_a_load_whose_room_cannot_be_made_ends_and_is_not_loading_forever(
    stores: dict[str, Path], two_engines: dict[str, Engine]
) -> None:
    slots = [
        ModelSlot(ModelSource("alpha", str(stores["alpha"])), two_engines["alpha"]),
        ModelSlot(ModelSource("beta", str(stores["beta"])), two_engines["beta"]),
        ModelSlot(ModelSource("gamma", str(stores["gamma"]))),
    ]
    repo = ModelRepository(slots, build=lambda slot: two_engines["beta"], max_loaded=2)
    repo.start(_FailingUnload())
    try:
        gamma = slots[2]
        repo.load(gamma)
        eventually(lambda: gamma.load_error is not None, what="the failed load recorded")
        assert gamma.loading_since is None
        assert gamma.engine is None
        assert "unload failed" in gamma.load_error[1]  # type: ignore[index]
    finally:
        repo.stop()


def test_a_request_admitted_while_the_repository_stops_is_refused_not_left_waiting(
    stores: dict[str, Path], two_engines: dict[str, Engine]
) -> None:
    slots = [
        ModelSlot(ModelSource("alpha", str(stores["alpha"])), two_engines["alpha"]),
        ModelSlot(ModelSource("beta", str(stores["beta"]))),
    ]
    repo = ModelRepository(slots, build=lambda slot: two_engines["beta"])
    repo.start(RepositoryHooks())
    assert repo.stop() == []
    job = Job(Request("late"), ReplyTarget(result_topic(THING)), time.monotonic())
    for slot in slots:
        taken = repo.acquire(slot, job)
        assert not taken.ready
        assert taken.code == ErrorCode.INTERNAL
        assert taken.why == "the runtime is stopping"
    assert not slots[1].waiting


def test_a_store_moved_during_its_load_is_loaded_again_from_the_new_folder(
    stores: dict[str, Path], two_engines: dict[str, Engine]
) -> None:
    release = threading.Event()
    built: list[str] = []

    def build(slot: ModelSlot) -> Engine:
        built.append(slot.source.folder)
        assert release.wait(30)
        return two_engines["beta"]

    beta = ModelSlot(ModelSource("beta", "/v1"))
    repo = ModelRepository(
        [ModelSlot(ModelSource("alpha", str(stores["alpha"])), two_engines["alpha"]), beta], build=build
    )
    repo.start(RepositoryHooks())
    try:
        repo.load(beta)
        eventually(lambda: built == ["/v1"], what="the load from the old folder under way")
        assert not repo.lease_loaded(beta, "/v2")  # loading: not swapped, its store moves
        release.set()
        eventually(lambda: beta.engine is not None, what="beta loaded")
        assert built == ["/v1", "/v2"]
        assert beta.source.folder == "/v2"
        assert repo.lease_loaded(beta)  # loaded now: a swap may lease it
        repo.release(beta)
    finally:
        release.set()
        repo.stop()


# ---------------------------------------------------------------------------------------- updates


def test_a_new_version_of_one_model_component_swaps_that_model_only(
    stores: dict[str, Path], tmp_path: Path, running: list[Component]
) -> None:
    for component_name, name in (("com.edgeinfer.ModelStore", "alpha"), ("com.example.Beta", "beta")):
        pointer = store_pointer(str(tmp_path / "work" / "com.edgeinfer.InferenceRuntime"), component_name)
        pointer.parent.mkdir(parents=True, exist_ok=True)
        pointer.write_text(f"{stores[name]}\n")
    models: list[dict[str, Any]] = [
        {"component": "com.edgeinfer.ModelStore"},
        {"component": "com.example.Beta", "preload": True},
    ]
    comp, bus = component(tmp_path, models)
    start(comp, running)
    alpha, beta = comp.server.models.slots
    eventually(lambda: beta.engine is not None, what="beta preloaded")
    assert [w.pointer.parent.name for w in comp.model_watchers] == [
        "com.edgeinfer.ModelStore",
        "com.example.Beta",
    ]
    before_alpha, before_beta = alpha.engine, beta.engine
    assert ask(bus, "b1", model="beta").model.version == "0.0.1"  # type: ignore[union-attr]
    v2 = named_store(tmp_path / "beta-v2", "beta", "0.0.2")
    comp.model_watchers[1].pointer.write_text(f"{v2}\n")
    assert comp.model_watchers[1].check()
    assert beta.engine is not before_beta
    assert alpha.engine is before_alpha  # the other model's engine untouched
    assert ask(bus, "b2", model="beta").model.version == "0.0.2"  # type: ignore[union-attr]
    assert ask(bus, "a", model="alpha").model.version == "0.0.1"  # type: ignore[union-attr]


def test_a_model_component_deployed_after_the_start_is_served_once_it_is_there(
    stores: dict[str, Path], tmp_path: Path, running: list[Component]
) -> None:
    comp, bus = component(tmp_path, [{"dir": str(stores["alpha"])}, {"component": "com.example.Late"}])
    start(comp, running)
    refused = ask(bus, "early", model="beta")
    assert refused.error is not None
    assert refused.error.message == "unknown model 'beta': this runtime serves 'alpha'"
    (watcher,) = comp.model_watchers
    watcher.pointer.parent.mkdir(parents=True)
    watcher.pointer.write_text(f"{stores['beta']}\n")
    assert watcher.check()
    assert comp.server.models.names() == ["alpha", "beta"]
    assert ask(bus, "late", model="beta").status == "ok"
    v2 = named_store(tmp_path / "beta-v2", "beta", "0.0.2")
    watcher.pointer.write_text(f"{v2}\n")
    assert watcher.check()  # from now on its new versions, as any model component's
    assert ask(bus, "v2", model="beta").model.version == "0.0.2"  # type: ignore[union-attr]


def test_a_configuration_update_serves_the_models_added_and_takes_pinned_live(
    stores: dict[str, Path], tmp_path: Path, running: list[Component]
) -> None:
    models: list[dict[str, Any]] = [{"dir": str(stores["alpha"])}, {"dir": str(stores["beta"])}]
    comp, bus = component(tmp_path, models)
    start(comp, running)
    before = comp.server.models.default.engine
    more = [{**models[0]}, {**models[1], "pinned": True}, {"dir": str(stores["gamma"]), "preload": True}]
    assert bus.propose_configuration(dict(bus.config, models=more)) is None
    eventually(lambda: comp.server.models.names() == ["alpha", "beta", "gamma"], what="gamma served")
    beta, gamma = comp.server.models.slots[1:]
    assert beta.source.pinned
    eventually(lambda: gamma.engine is not None, what="gamma preloaded")
    assert ask(bus, "g", model="gamma").status == "ok"
    assert comp.server.models.default.engine is before  # no engine key changed: the default untouched


# ------------------------------------------------------------------------------------ configuration


def test_models_read_from_configuration_with_what_cannot_be_served(
    stores: dict[str, Path], tmp_path: Path
) -> None:
    entries = [
        ModelEntry(dir=str(stores["alpha"])),
        ModelEntry(component="com.example.Missing"),
        ModelEntry(dir=str(stores["alpha"]), pinned=True),
        ModelEntry(dir=str(stores["beta"]), preload=True),
    ]
    read = read_sources(entries, str(tmp_path / "work" / "com.edgeinfer.InferenceRuntime"))
    assert isinstance(read[0], ModelSource)
    assert read[0].name == "alpha"
    assert isinstance(read[1], str)
    assert read[1].startswith("model component com.example.Missing: no store at ")
    assert read[2] == f"model store {stores['alpha']}: the name 'alpha' is an earlier store's"
    assert isinstance(read[3], ModelSource)
    assert read[3].preload
    assert read[3].version == "0.0.1"


def test_a_default_model_that_cannot_be_read_stops_the_start(tmp_path: Path) -> None:
    from edgeinfer.config import ConfigError

    comp, _bus = component(tmp_path, [{"component": "com.example.Missing"}])
    with pytest.raises(ConfigError, match=r"models\[0\]: model component com.example.Missing: no store"):
        comp.start()


@pytest.mark.parametrize("background", [BackgroundLoad(), BackgroundLoad(pace=0.5, nice=3), None])
def test_a_load_a_request_asks_for_builds_under_the_repositorys_background_settings(
    stores: dict[str, Path], two_engines: dict[str, Engine], background: BackgroundLoad | None
) -> None:
    seen: list[tuple[BackgroundLoad | None, str]] = []

    def build(slot: ModelSlot) -> Engine:
        seen.append((loading_settings(), threading.current_thread().name))
        return two_engines["beta"]

    slots = [
        ModelSlot(ModelSource("alpha", str(stores["alpha"])), two_engines["alpha"]),
        ModelSlot(ModelSource("beta", str(stores["beta"]))),
    ]
    cfg = RuntimeConfig(max_batch_size=4, lanes=1)
    bus = MemoryBus()
    repo = ModelRepository(slots, build=build, background=background)
    server = InferenceServer(bus, two_engines["alpha"], cfg, THING, models=repo)
    server.start()
    try:
        assert ask(bus, "beta", model="beta", deadline_ms=30_000).status == "ok"
    finally:
        server.stop()
    assert seen == [(background, "edgeinfer-load-beta")]
    assert loading_settings() is None  # only the load's own thread


def test_a_preload_builds_as_at_start(stores: dict[str, Path], two_engines: dict[str, Engine]) -> None:
    seen: list[BackgroundLoad | None] = []

    def build(slot: ModelSlot) -> Engine:
        seen.append(loading_settings())
        return two_engines["beta"]

    slots = [
        ModelSlot(ModelSource("alpha", str(stores["alpha"])), two_engines["alpha"]),
        ModelSlot(ModelSource("beta", str(stores["beta"]), preload=True)),
    ]
    repo = ModelRepository(slots, build=build, background=BackgroundLoad())
    repo.start(RepositoryHooks())
    try:
        eventually(lambda: slots[1].engine is not None, 30, "beta preloaded")
    finally:
        repo.stop()
    assert seen == [None]


def test_a_sources_frame_marks_its_model_used_and_asks_an_unloaded_one_to_load(
    stores: dict[str, Path], two_engines: dict[str, Engine]
) -> None:
    """A model only a camera keeps busy is not the least recently used one, and one evicted is loaded
    again by the camera's frames (before, a frame only leased a model already loaded)."""
    clock = FakeClock()
    slots = [
        ModelSlot(ModelSource("alpha", str(stores["alpha"])), two_engines["alpha"]),
        ModelSlot(ModelSource("beta", str(stores["beta"]))),
    ]
    repo = ModelRepository(slots, build=lambda slot: two_engines["beta"], clock=clock)
    repo.start(RepositoryHooks())
    try:
        alpha, beta = slots
        clock.advance(5)
        assert repo.lease_for_frame(alpha)
        assert alpha.last_used == clock()
        repo.release(alpha)
        assert not repo.lease_for_frame(beta)  # not loaded: the frame is dropped, its load asked for
        eventually(lambda: beta.engine is not None, what="beta loaded for the camera")
        assert repo.lease_for_frame(beta)
        repo.release(beta)
    finally:
        repo.stop()
