"""Fixtures shared by the end-to-end tests on the simulated core."""

from __future__ import annotations

import argparse
import contextlib
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from edgeinfer.runtime.component import Component
from edgeinfer.runtime.config import default_recipe_configuration
from edgeinfer.sim import MosquittoBroker, Simulator
from edgeinfer.sim.testing import RUNTIME, prepare_device, recipes_dir, wait_ready
from edgeinfer.transport.ipc import GreengrassIpcBus
from tests.helpers import PROJECT

ROOT = PROJECT
TELEMETRY = "com.edgeinfer.Telemetry"


@pytest.fixture(scope="session")
def write_tiny_store() -> Callable[[Path], Path]:
    """Writes the runtime unit tests' tiny classifier as a model store into a folder: the whole
    device path in seconds, where a test does not need the real model's predictions."""
    pytest.importorskip("onnx")
    from tests.helpers.tiny_store import write_tiny_store as write

    return lambda folder: Path(write(folder))


@contextlib.contextmanager
def running_device(
    root: Path,
    store: Path,
    broker: MosquittoBroker,
    thing: str,
    config_merge: Mapping[str, Any],
    *,
    telemetry: bool = False,
    nucleus: str = "classic",
    timeout: float = 180,
) -> Iterator[Simulator]:
    """A simulated core under `root` with the runtime on `store` deployed (and the telemetry component
    with `telemetry`), both reported RUNNING; stopped after."""
    recipes, artifacts = prepare_device(root / "device", store)
    if telemetry:
        shutil.copy(recipes_dir() / f"{TELEMETRY}.yaml", recipes)
    sim = Simulator(
        recipes,
        artifacts,
        thing=thing,
        work_dir=root / "core",
        broker=broker.address,
        restart_delay=0.1,
        nucleus=nucleus,
        config_merge=config_merge,
    )
    sim.start()
    try:
        wait_ready(sim, timeout=timeout)
        if telemetry:
            sim.wait_for_state(TELEMETRY, "RUNNING", timeout=60)
        yield sim
    finally:
        sim.stop()


def recipe(name: str, lifecycle: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """A component recipe of version 1.0.0 with `lifecycle` and `config` as its DefaultConfiguration."""
    return {
        "RecipeFormatVersion": "2020-01-25",
        "ComponentName": name,
        "ComponentVersion": "1.0.0",
        "ComponentConfiguration": {"DefaultConfiguration": config},
        "Manifests": [{"Platform": {"os": "linux", "runtime": "*"}, "Lifecycle": lifecycle}],
    }


def model_component(name: str, folder: Path) -> dict[str, Any]:
    """A model component as the ModelStore is one: its install step writes its folder to
    `artifacts-path` (the folder from its configuration, so that a deployment can move it)."""
    pointer = "'{work:path}/artifacts-path'"
    write = f"printf '%s\\n' '{{configuration:/folder}}' > {pointer}.tmp"
    return recipe(name, {"install": f"{write} && mv -f {pointer}.tmp {pointer}"}, {"folder": str(folder)})


def runtime_config(thing: str, **keys: Any) -> dict[str, Any]:
    """The runtime's recipe configuration for a runtime this test runs in its own process
    (`runtime_in_process`): on the CPU, batches of 4, local pub/sub only, `keys` over that."""
    access = {
        "aws.greengrass.ipc.pubsub": {
            "p": {"operations": ["*"], "resources": [f"edgeinfer/{thing}/*", "edgeinfer/local/*"]}
        }
    }
    config = default_recipe_configuration()
    config.update(
        {
            "executionProviders": ["CPUExecutionProvider"],
            "maxBatchSize": 4,
            "subscribeIot": False,
            "accessControl": access,
            **keys,
        }
    )
    return config


@contextlib.contextmanager
def runtime_in_process(sim: Simulator, thing: str, model_dir: str = "") -> Iterator[Component]:
    """The runtime component deployed on `sim` (its recipe's install only), run in this process over
    the real IPC client with the component's own socket and token; stopped after."""
    env = sim.ipc_env(RUNTIME)
    bus = GreengrassIpcBus.connect(env["AWS_GG_NUCLEUS_DOMAIN_SOCKET_FILEPATH_FOR_COMPONENT"], env["SVCUID"])
    args = argparse.Namespace(
        model_dir=model_dir, work_dir=str(sim.root / "work" / RUNTIME), thing=thing, option=[]
    )
    component = Component(bus, args)
    component.start()
    try:
        yield component
    finally:
        component.stop()
        bus.close()
