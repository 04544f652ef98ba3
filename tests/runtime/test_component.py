"""The component process logic on a MemoryBus: start, validation with reasons, live updates, both nuclei."""

from __future__ import annotations

import argparse
import base64
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from edgeinfer.config import ConfigError
from edgeinfer.messages import Result
from edgeinfer.runtime.component import Component, main, process_age_ms
from edgeinfer.runtime.config import RuntimeConfig, default_recipe_configuration
from edgeinfer.runtime.engine import Engine
from edgeinfer.runtime.placement import HybridPlacement
from edgeinfer.transport import MemoryBus
from tests.helpers import PROJECT
from tests.helpers.config import lite_typed
from tests.helpers.images import solid_jpeg
from tests.helpers.tiny_store import write_tiny_store
from tests.helpers.wait import eventually

THING = "c1"
COMPONENT = "com.edgeinfer.InferenceRuntime"


def make(
    tiny_store: Path,
    tmp_path: Path,
    *,
    lite: bool = False,
    options: list[str] | None = None,
    **overrides: object,
) -> tuple[Component, MemoryBus]:
    """`lite`: the configuration typed and the validation subscription answered as nucleus lite does."""
    config = default_recipe_configuration()
    config.update({"maxBatchSize": 4, "executionProviders": ["cpu"], **overrides})
    if lite:
        config = lite_typed(config)
    bus = MemoryBus(config=config, validation=not lite)
    args = argparse.Namespace(
        model_dir=str(tiny_store), work_dir=str(tmp_path), thing=THING, option=options or []
    )
    return Component(bus, args), bus


def ask(bus: MemoryBus, rid: str) -> Result:
    bus.publish(
        f"edgeinfer/{THING}/infer",
        json.dumps({"id": rid, "image": base64.b64encode(solid_jpeg((3, 3, 240))).decode()}).encode(),
    )
    topic = f"edgeinfer/{THING}/result"
    eventually(lambda: any(Result.parse(m.payload).id == rid for m in bus.messages_on(topic)))
    return next(r for r in (Result.parse(m.payload) for m in bus.messages_on(topic)) if r.id == rid)


def test_start_reports_running_after_warm_up(tiny_store: Path, tmp_path: Path) -> None:
    comp, bus = make(tiny_store, tmp_path)
    comp.start()
    try:
        assert bus.states == ["RUNNING"]
        assert comp.server.engine.warmup_ms  # warmed before RUNNING
        assert ask(bus, "a").predictions[0].label == "blue"
    finally:
        comp.stop()
    assert process_age_ms() > 0


def test_invalid_updates_are_refused_with_reasons(tiny_store: Path, tmp_path: Path) -> None:
    comp, bus = make(tiny_store, tmp_path)
    comp.start()
    try:
        bad = dict(bus.config, maxBatchSize=0, source={"kind": "webcam"})
        reason = bus.propose_configuration(bad)
        assert reason is not None
        assert "maxBatchSize" in reason
        assert "source.kind" in reason
        reason = bus.propose_configuration(dict(bus.config, placement={"enabled": "yes"}))
        assert reason is not None
        assert "placement.enabled" in reason
        reason = bus.propose_configuration(dict(bus.config, modelDir=str(tmp_path / "nothing")))
        assert reason is not None
        assert "manifest.json" in reason
        assert bus.config["maxBatchSize"] == 4  # nothing applied
    finally:
        comp.stop()


def test_live_updates_apply_without_restart(tiny_store: Path, tmp_path: Path) -> None:
    comp, bus = make(tiny_store, tmp_path)
    comp.start()
    try:
        server, engine = comp.server, comp.server.engine
        assert bus.propose_configuration(dict(bus.config, maxQueueDelayUs=0, maxQueueSize=10)) is None
        eventually(lambda: server.batcher.max_queue_size == 10)
        assert server.engine is engine  # batching keys: no new engine
        assert bus.propose_configuration(dict(bus.config, maxBatchSize=2)) is None
        eventually(lambda: server.engine is not engine)
        assert server.engine.max_batch_size == 2
        assert sorted(server.engine.warmup_ms) == [1, 2]
        assert comp.server is server  # same server, same subscriptions
        assert ask(bus, "after").status == "ok"
        assert bus.states == ["RUNNING"]
    finally:
        comp.stop()


def test_bad_configuration_at_start_is_refused(tiny_store: Path, tmp_path: Path) -> None:
    comp, bus = make(tiny_store, tmp_path, maxBatchSize="many")
    with pytest.raises(ConfigError, match="maxBatchSize: must be an integer, got 'many'"):
        comp.start()
    assert bus.states == []


def test_lite_typed_configuration_reads_as_the_classic_one(tiny_store: Path, tmp_path: Path) -> None:
    classic, _ = make(tiny_store, tmp_path)
    lite, _ = make(tiny_store, tmp_path, lite=True)
    assert lite.read_config() == classic.read_config()


def test_without_live_validation_updates_still_apply(
    tiny_store: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    comp, bus = make(tiny_store, tmp_path, lite=True)
    comp.start()
    try:
        assert bus.states == ["RUNNING"]
        off = [
            r.getMessage() for r in caplog.records if "live configuration validation is off" in r.getMessage()
        ]
        assert len(off) == 1
        assert off[0].startswith("com.edgeinfer.InferenceRuntime: ")
        server = comp.server
        # Nothing validates: a bad value reaches the component, which keeps what runs and says why.
        assert bus.propose_configuration(dict(bus.config, maxBatchSize="0")) is None
        eventually(lambda: any("configuration update ignored" in r.getMessage() for r in caplog.records))
        assert server.engine.max_batch_size == 4
        assert bus.propose_configuration(dict(bus.config, maxBatchSize="4", maxQueueSize="10")) is None
        eventually(lambda: server.batcher.max_queue_size == 10)
        assert ask(bus, "lite").status == "ok"
    finally:
        comp.stop()


def test_a_burst_of_update_events_is_one_re_read(tiny_store: Path, tmp_path: Path) -> None:
    comp, bus = make(tiny_store, tmp_path, lite=True)
    comp.start()
    reads: list[object] = []
    read = comp.read_config

    def counting(doc: dict[str, Any] | None = None) -> RuntimeConfig:
        reads.append(doc)
        return read(doc)

    comp.read_config = counting  # type: ignore[method-assign]
    try:
        with comp._lock:  # an update being applied: the burst's events wait behind it
            change = {"maxQueueSize": "12", "topK": "3", "defaultDeadlineMs": "50", "decodeThreads": "1"}
            assert bus.propose_configuration(dict(bus.config, **change)) is None  # one event per key
        eventually(lambda: comp.cfg.max_queue_size == 12, what="the update")
        assert (comp.cfg.top_k, comp.cfg.default_deadline_ms, comp.cfg.decode_threads) == (3, 50.0, 1)
        for thread in threading.enumerate():
            if thread.name == "edgeinfer-config":
                thread.join(10)
        assert len(reads) == 1
    finally:
        comp.stop()


def test_command_line_options_override_the_nucleus(tiny_store: Path, tmp_path: Path) -> None:
    comp, _ = make(tiny_store, tmp_path, options=["maxQueueSize=12", "tensorrt.trtFp16Enable=false"])
    cfg = comp.read_config()
    assert (cfg.max_queue_size, cfg.tensorrt.trt_fp16_enable, cfg.max_batch_size) == (12, False, 4)


def test_main_outside_greengrass_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-o", "maxBatchSize"]) == 2
    assert capsys.readouterr().err.strip() == (
        "edgeinfer.runtime: error: -o expects KEY=VALUE, got 'maxBatchSize'"
    )


def test_requests_during_start_up_are_served(tiny_store: Path, tmp_path: Path) -> None:
    comp, bus = make(tiny_store, tmp_path)
    build = comp.build_engine
    payload = json.dumps({"id": "early", "image": base64.b64encode(solid_jpeg((3, 240, 3))).decode()})

    def slow_build(cfg: RuntimeConfig) -> Engine:
        bus.publish(f"edgeinfer/{THING}/infer", payload.encode())  # arrives while the engine is built
        bus.publish(
            f"edgeinfer/{THING}/infer", payload.encode().replace(b"early", b"early-iot"), target="iot"
        )
        return build(cfg)

    comp.build_engine = slow_build  # type: ignore[method-assign]
    comp.start()
    try:
        topic = f"edgeinfer/{THING}/result"
        eventually(lambda: len(bus.messages_on(topic)) == 2)
        got = {Result.parse(m.payload).id: m.target for m in bus.messages_on(topic)}
        assert got == {"early": "local", "early-iot": "iot"}
        assert ask(bus, "later").status == "ok"
        time.sleep(0.05)
        ids = [Result.parse(m.payload).id for m in bus.messages_on(topic)]
        # each once: no duplicate subscription
        assert sorted(map(str, ids)) == ["early", "early-iot", "later"]
    finally:
        comp.stop()


def test_placement_change_rewires_the_seam(tiny_store: Path, tmp_path: Path) -> None:
    from edgeinfer.runtime.placement import EdgeOnly

    comp, bus = make(tiny_store, tmp_path)
    comp.start()
    try:
        assert isinstance(comp.server.placement, EdgeOnly)
        assert bus.propose_configuration(dict(bus.config, placement={"enabled": True})) is None
        eventually(lambda: comp.server.offloader is not None)
        assert not isinstance(comp.server.placement, EdgeOnly)
        assert bus.propose_configuration(dict(bus.config, placement={"enabled": False})) is None
        eventually(lambda: comp.server.offloader is None)
        assert isinstance(comp.server.placement, EdgeOnly)
        assert ask(bus, "still").status == "ok"
    finally:
        comp.stop()


def test_engine_swap_rewires_the_placement_policy(tiny_store: Path, tmp_path: Path) -> None:
    comp, bus = make(tiny_store, tmp_path, placement={"enabled": True})
    comp.start()
    try:
        offloader, engine = comp.server.offloader, comp.server.engine
        assert offloader is not None
        assert bus.propose_configuration(dict(bus.config, maxBatchSize=2)) is None
        # The old offloader is stopped (EdgeOnly for a moment), then a new one is wired.
        eventually(lambda: comp.server.offloader not in (None, offloader))
        assert comp.server.engine is not engine
        # A new policy built for the new engine (batch size 2, not the old engine's 4).
        rewired = comp.server.offloader
        assert isinstance(rewired, HybridPlacement)
        assert rewired.policy.max_batch_size == 2
        assert ask(bus, "after-swap").status == "ok"
    finally:
        comp.stop()


def test_a_live_ipc_cap_reaches_the_running_placement_policy(tiny_store: Path, tmp_path: Path) -> None:
    comp, bus = make(tiny_store, tmp_path, placement={"enabled": True})
    comp.start()
    try:
        hybrid = comp.server.offloader
        assert isinstance(hybrid, HybridPlacement)
        cap = 16 * 1024 * 1024
        assert hybrid.max_ipc_bytes != cap
        assert bus.propose_configuration(dict(bus.config, maxIpcMessageBytes=cap)) is None
        eventually(lambda: hybrid.max_ipc_bytes == cap)
        assert comp.server.offloader is hybrid  # the policy's learning is kept
    finally:
        comp.stop()


def at_each_swap(comp: Component, read: Callable[[], object]) -> list[object]:
    """What `read()` returns at the moment each new engine is put in place."""
    seen: list[object] = []
    swap = comp.server.swap_engine

    def recording(engine: Any) -> None:
        seen.append(read())
        swap(engine)

    comp.server.swap_engine = recording  # type: ignore[method-assign]
    return seen


def test_a_new_store_folder_is_recorded_before_its_engine_is_swapped_in(
    tiny_store: Path, tmp_path: Path
) -> None:
    comp, _ = make(tiny_store, tmp_path)
    comp.start()
    try:
        v2 = str(write_tiny_store(tmp_path / "store-v2"))
        seen = at_each_swap(comp, lambda: comp.args.model_dir)
        comp._store_changed(v2)
        assert seen == [v2]  # whoever sees the new engine finds its folder
    finally:
        comp.stop()


def test_a_new_configuration_is_recorded_before_its_engine_is_swapped_in(
    tiny_store: Path, tmp_path: Path
) -> None:
    comp, bus = make(tiny_store, tmp_path)
    comp.start()
    try:
        seen = at_each_swap(comp, lambda: comp.cfg.max_batch_size)
        assert bus.propose_configuration(dict(bus.config, maxBatchSize=2)) is None
        eventually(lambda: bool(seen), what="the new engine")
        assert seen == [2]
    finally:
        comp.stop()


@pytest.mark.e2e
def test_on_nucleus_lite_the_real_process_serves_and_follows_updates(
    simulator: Any, tiny_store: Path, tmp_path: Path
) -> None:
    """`python -m edgeinfer.runtime` on the simulated nucleus lite: its configuration over IPC with
    lite's string scalars, no validation subscription (one log line), a live update applied."""
    recipe = yaml.safe_load((PROJECT / "recipes" / f"{COMPONENT}.yaml").read_text("utf-8"))
    recipe.pop("ComponentDependencies", None)
    defaults = recipe["ComponentConfiguration"]["DefaultConfiguration"]
    defaults.update({"executionProviders": ["cpu"], "maxBatchSize": 4, "lanes": 1, "subscribeIot": False})
    run = f"{sys.executable} -m edgeinfer.runtime --model-dir {tiny_store} --work-dir {{work:path}}"
    recipe["Manifests"] = [{"Platform": {"os": "linux", "runtime": "*"}, "Lifecycle": {"run": run}}]
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / f"{COMPONENT}.yaml").write_text(yaml.safe_dump(recipe))
    sim = simulator(recipes, thing=THING, nucleus="lite")
    sim.wait_for_report(COMPONENT, "RUNNING", timeout=120)
    assert sim.logs(COMPONENT).count("live configuration validation is off") == 1
    local = sim.local_client()
    results = local.subscribe(f"edgeinfer/{THING}/result")
    image = base64.b64encode(solid_jpeg((3, 3, 240))).decode()
    local.publish(f"edgeinfer/{THING}/infer", {"id": "lite", "image": image})
    assert Result.parse(results.wait_for(1, timeout=30)[0].payload).predictions[0].label == "blue"
    sim.update_configuration(COMPONENT, merge={"maxQueueSize": 12})
    eventually(lambda: "configuration changed: max_queue_size" in sim.logs(COMPONENT), what="the update")
    assert sim.state(COMPONENT) == "RUNNING"


def test_capture_stops_after_the_server_so_what_it_answers_while_stopping_is_captured(
    tiny_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    comp, _bus = make(tiny_store, tmp_path)
    comp.start()
    order: list[str] = []
    server_stop = comp.server.stop

    def stop_server() -> None:
        order.append("server")
        server_stop()

    class Capture:
        def stop(self) -> None:
            order.append("capture")

    monkeypatch.setattr(comp.server, "stop", stop_server)
    comp.capture = Capture()  # type: ignore[assignment]
    comp.stop()
    assert order == ["server", "capture"]
