"""A user's model update on the simulated classic nucleus: the runtime's `Component` in this process
on the real awsiotsdk IPC client, a ModelStore whose install step writes its artifact folder to
`artifacts-path` as the real one does (the folder taken from its configuration, so a deployment can
point it at another store), and `Simulator.update_component` running the nucleus's defer protocol.

- a deployment that arrives while a slow request is in flight waits until the request is answered
  ok, then proceeds: deferred, when the request runs on an engine thread; on the default
  configuration, where a request that finds the runtime idle runs on the IPC client's thread
  (`runInlineWhenIdle`), the PreComponentUpdateEvent itself waits behind it;
- a new store version is swapped in without restarting the runtime, and later requests report it
  (on lite too, which serves no component-update events: the runtime polls the pointer), on the
  default configuration and with every request queued to the engine threads.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from edgeinfer.messages import TIMINGS_TOPIC, Result, TimingBatch, TimingRecord
from edgeinfer.runtime.component import Component
from edgeinfer.sim import Simulator
from edgeinfer.sim.testing import RUNTIME, STORE
from edgeinfer.telemetry.window import WindowAggregator
from tests.e2e.conftest import model_component, recipe, runtime_config, runtime_in_process
from tests.helpers.clock import FakeClock
from tests.helpers.images import solid_jpeg
from tests.helpers.wait import eventually

pytestmark = pytest.mark.e2e

THING = "model-update-e2e"
INFER = f"edgeinfer/{THING}/infer"
RESULT = f"edgeinfer/{THING}/result"


def tiny(folder: Path, write_tiny_store: Callable[[Path], Path], version: str) -> Path:
    write_tiny_store(folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["version"] = version
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def window_versions(batches: list[TimingBatch], ids: set[str]) -> list[str]:
    """The model versions a telemetry window names, folded (by the Telemetry component's own
    aggregator) from the records of these requests alone."""
    clock = FakeClock()
    agg = WindowAggregator(THING, window_s=10, clock=clock)
    for batch in batches:
        records: list[TimingRecord] = [r for r in batch.records if r.id in ids]
        agg.add(TimingBatch(batch.thing, records))
    clock.advance(10)
    (window,) = agg.poll()
    return [m.version for m in window.models]


class Device:
    def __init__(self, sim: Simulator, component: Component, v1: Path) -> None:
        self.sim, self.component, self.v1 = sim, component, v1
        self.results = sim.local_client().subscribe(RESULT)
        self.client = sim.local_client()

    def send(self, rid: str) -> None:
        image = base64.b64encode(solid_jpeg((3, 3, 240))).decode()
        self.client.publish(INFER, json.dumps({"id": rid, "image": image}))

    def answers(self, rid: str) -> list[Result]:
        return [r for r in (Result.parse(m.payload) for m in self.results.messages) if r.id == rid]

    def ask(self, rid: str) -> Result:
        self.send(rid)
        eventually(lambda: bool(self.answers(rid)), 30, f"the answer to {rid}")
        return self.answers(rid)[0]


@pytest.fixture
def nucleus() -> str:
    return "classic"  # a test may parametrize it


@pytest.fixture
def queued() -> bool:
    """True: `runInlineWhenIdle` off, every request runs on an engine thread. False: the recipe's
    default configuration (a request that finds the runtime idle runs on its arrival thread). A test
    may parametrize it."""
    return False


@pytest.fixture
def device(
    simulator: Callable[..., Simulator],
    tmp_path: Path,
    write_tiny_store: Callable[[Path], Path],
    nucleus: str,
    queued: bool,
) -> Iterator[Device]:
    v1 = tiny(tmp_path / "store-v1", write_tiny_store, "0.0.1")
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    store = model_component(STORE, v1)
    config = runtime_config(THING)
    if queued:
        config["runInlineWhenIdle"] = False
    runtime = recipe(RUNTIME, {"install": "true"}, config)  # the process is this test's
    for doc in (store, runtime):
        (recipes / f"{doc['ComponentName']}.yaml").write_text(yaml.safe_dump(doc))
    sim = simulator(recipes, thing=THING, nucleus=nucleus)
    sim.wait_for_state(STORE, "FINISHED")
    with runtime_in_process(sim, THING, model_dir=str(v1)) as component:
        assert component.store_watcher is not None  # started on the folder the pointer names
        # the classic nucleus serves component updates, lite does not
        assert (component.updates is not None) == (nucleus == "classic")
        yield Device(sim, component, v1)


@pytest.mark.parametrize("queued", [True, False], ids=["queued", "default"])
def test_an_update_waits_for_a_slow_request_in_flight(
    device: Device, monkeypatch: pytest.MonkeyPatch, queued: bool
) -> None:
    """Queued (`runInlineWhenIdle` off), the slow request runs on an engine thread and the runtime
    defers the update. Inline (the default), it runs on the IPC client's event-loop thread, which
    delivers no PreComponentUpdateEvent until the request is answered: nothing defers, and the
    update still waits for the answer (the nucleus's policy timeout, 60 s, is far off)."""
    engine = device.component.server.engine
    run = engine.run
    release = threading.Event()
    ran_on: list[str] = []

    def slow_run(*args: Any, **kwargs: Any) -> Any:  # the request stays in flight until released
        ran_on.append(threading.current_thread().name)
        release.wait(60)
        return run(*args, **kwargs)

    monkeypatch.setattr(engine, "run", slow_run)
    device.send("slow")
    eventually(lambda: device.component.server.inflight.count == 1, 10, "the slow request in flight")
    outcome: list[Any] = []
    update = threading.Thread(
        target=lambda: outcome.append(device.sim.update_component(STORE, merge={"folder": str(device.v1)}))
    )
    update.start()
    try:
        if queued:  # the nucleus asks again and is deferred again
            eventually(lambda: device.sim.logs(RUNTIME).count("deferred update") >= 2, 30, "two deferrals")
        # Inline, the nucleus's event lies unread behind the request. Either way nothing is updated:
        # room for a wrong update to show.
        time.sleep(1.5)
        assert update.is_alive()
        assert device.sim.history(STORE).count("FINISHED") == 1
        assert device.answers("slow") == []
    finally:
        release.set()
        update.join(60)
    # The update goes on once the request is counted out, which is before its answer is published and
    # delivered: wait for the answer itself.
    eventually(lambda: device.answers("slow") != [], 30, "the slow request answered")
    assert [a.status for a in device.answers("slow")] == ["ok"]
    assert ran_on[0].startswith("edgeinfer-engine-") == queued  # inline: the IPC client's thread
    (deferrals,) = outcome
    if queued:
        assert len(deferrals) >= 2
        assert {(d.component, d.message) for d in deferrals} == {(RUNTIME, "1 requests in flight")}
        assert all(d.recheck_after_ms > 0 for d in deferrals)
    else:
        assert deferrals == []
        assert "deferred update" not in device.sim.logs(RUNTIME)
    eventually(  # the update proceeded: the store installed again
        lambda: device.sim.history(STORE).count("FINISHED") == 2, 30, "the store installed again"
    )
    assert device.ask("after").status == "ok"
    time.sleep(0.5)  # a second answer, if any, would come now
    assert len(device.answers("slow")) == 1
    # An answer need not follow the in-flight count's release: wait on the count itself.
    eventually(lambda: device.component.server.inflight.count == 0, 10, "nothing in flight")


@pytest.mark.parametrize("queued", [False, True], ids=["default", "queued"])
@pytest.mark.parametrize("nucleus", ["classic", "lite"])
def test_a_new_store_version_is_swapped_in_without_a_restart(
    device: Device, tmp_path: Path, write_tiny_store: Callable[[Path], Path], nucleus: str, queued: bool
) -> None:
    """Classic looks at the pointer on its PostComponentUpdateEvent; lite sends none, so the pointer's
    poll finds the new folder. The version arrives while the runtime is idle: on the default
    configuration the requests before and after it run inline on the IPC client's thread."""
    timings = device.sim.local_client().subscribe(TIMINGS_TOPIC)  # what the Telemetry component folds
    assert device.ask("v1").model.version == "0.0.1"  # type: ignore[union-attr]
    v2 = tiny(tmp_path / "store-v2", write_tiny_store, "0.0.2")
    server, engine = device.component.server, device.component.server.engine
    assert device.sim.update_component(STORE, merge={"folder": str(v2)}) == []  # nothing in flight
    # The swap is done when every part of it holds: the engine object changes before `model_dir`
    # follows, so waiting on the engine alone and then reading `model_dir` races the update.
    eventually(
        lambda: device.component.server.engine is not engine and device.component.args.model_dir == str(v2),
        30,
        "the new store's engine and model_dir",
    )
    versions = [device.ask(f"after-{i}").model.version for i in range(3)]  # type: ignore[union-attr]
    assert versions == ["0.0.2"] * 3
    # The telemetry window that holds the requests after the swap names the new version alone.
    after = {f"after-{i}" for i in range(3)}

    def timed(ids: set[str]) -> list[TimingBatch]:
        batches = [TimingBatch.parse(m.payload) for m in timings.messages]
        return [b for b in batches if any(r.id in ids for r in b.records)]

    eventually(lambda: {r.id for b in timed(after) for r in b.records} >= after, 30, "the timings after")
    assert window_versions(timed(after), after) == ["0.0.2"]
    assert window_versions(timed({"v1"}), {"v1"}) == ["0.0.1"]
    assert device.component.server is server  # the same server, never restarted
