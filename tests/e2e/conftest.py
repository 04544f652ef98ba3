"""Fixtures shared by the end-to-end tests on the simulated core."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from edgeinfer.sim import MosquittoBroker, Simulator
from edgeinfer.sim.testing import prepare_device, recipes_dir, wait_ready
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
