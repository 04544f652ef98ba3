"""The whole bundle on the simulated core as each nucleus, straight from `edgeinfer build`: the four
real recipes, deployed from greengrass-build/ exactly as built (recipes with digests, the artifacts
beside them), the installer's install step linking this environment (`existingVenv`). One request
answered over local pub/sub and one over IoT Core, telemetry windows arriving, and a live
configuration change: validated and applied on classic, applied without validation on lite (which
serves no validation subscription). A tiny model with the model store's file names stands in for
`edgeinfer model build` output, so this runs in seconds."""

from __future__ import annotations

import base64
import json
import sys
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from edgeinfer import __version__
from edgeinfer.bundle.build import build_bundle
from edgeinfer.messages import Result, TelemetryWindow
from edgeinfer.model import build as model_build
from edgeinfer.model.manifest import (
    CPU,
    CUDA,
    TENSORRT,
    Manifest,
    Preprocessing,
    TensorSpec,
    Variant,
    sha256_file,
)
from edgeinfer.sim.pytest_plugin import SimulatorFactory
from edgeinfer.sim.simulator import SimError, Simulator
from edgeinfer.sim.testing import wait_ready
from tests.helpers import PROJECT
from tests.helpers.tiny_store import TINY_CLASSES, TINY_LABELS, tiny_model_bytes
from tests.helpers.wait import eventually

pytestmark = pytest.mark.e2e

RUNTIME = "com.edgeinfer.InferenceRuntime"
TELEMETRY = "com.edgeinfer.Telemetry"
INSTALLER = "com.edgeinfer.RuntimeInstaller"
STORE = "com.edgeinfer.ModelStore"


def write_store(folder: Path) -> None:
    """The tiny classifier (red, green, blue, …) under the file names the model store's recipe lists."""
    pytest.importorskip("onnx")
    folder.mkdir(parents=True, exist_ok=True)
    data = tiny_model_bytes()
    variants = []
    for file, precision, providers, name in (
        (model_build.INT8_TRT_FILE, "int8", [TENSORRT], "int8-tensorrt"),
        (model_build.INT8_CPU_FILE, "int8", [CPU], "int8-cpu"),
        (model_build.FP32_FILE, "fp32", [CUDA, CPU], "fp32"),
    ):
        (folder / file).write_bytes(data)
        variants.append(Variant(file, precision, providers, sha256_file(folder / file), len(data), name))
    (folder / model_build.LABELS_FILE).write_text(json.dumps(TINY_LABELS))
    Manifest(
        name="tiny",
        version="0.0.1",
        inputs=[TensorSpec("input", "uint8", ["N", "H", "W", 3])],
        outputs=[TensorSpec("logits", "float32", ["N", TINY_CLASSES])],
        preprocessing=Preprocessing(preferred_input=[32, 32], size=28),
        labels_file=model_build.LABELS_FILE,
        variants=variants,
    ).save(folder)


def red_request(request_id: str, **extra: Any) -> bytes:
    image = np.zeros((48, 64, 3), dtype=np.uint8)
    image[:] = (0, 0, 255)  # red, in OpenCV's BGR
    ok, jpeg = cv2.imencode(".jpg", image)
    assert ok
    return json.dumps({"id": request_id, "image": base64.b64encode(bytes(jpeg)).decode(), **extra}).encode()


def answer(inbox: Any, request_id: str, timeout: float = 60.0) -> Result:
    """The answer to `request_id`, looked for among everything the inbox received (never cleared:
    a message arriving between a read and a clear would be lost)."""

    def answers() -> list[Result]:
        return [r for r in (Result.parse(m.payload) for m in inbox.messages) if r.id == request_id]

    eventually(lambda: bool(answers()), timeout, f"the result for {request_id}")
    return answers()[0]


@pytest.fixture
def bundle_core(simulator: SimulatorFactory, sim_nucleus: str, tmp_path: Path) -> tuple[Simulator, str]:
    write_store(tmp_path / "artifacts" / STORE / __version__)
    bundle = build_bundle(
        PROJECT, artifacts_dir=tmp_path / "artifacts", out_dir=tmp_path / "greengrass-build"
    )
    assert [c.name for c in bundle.components] == [STORE, INSTALLER, RUNTIME, TELEMETRY]
    thing = f"bundle-{sim_nucleus}"
    sim = simulator(
        bundle.recipes_dir,  # the recipes as built: digests set, exactly what would ship
        bundle.recipes_dir.parent / "artifacts",  # and the artifacts greengrass-build/ holds
        thing=thing,
        components=[RUNTIME, TELEMETRY],
        config_merge={INSTALLER: {"existingVenv": sys.prefix}, TELEMETRY: {"windowSeconds": 1}},
    )
    assert sim.nucleus.name == sim_nucleus
    return sim, thing


@pytest.mark.parametrize("sim_nucleus", ["classic", "lite"])
def test_the_bundle_as_built_runs_on_each_nucleus(
    bundle_core: tuple[Simulator, str], sim_nucleus: str
) -> None:
    sim, thing = bundle_core
    wait_ready(sim, timeout=180)
    assert sim.state(INSTALLER) == "FINISHED"
    assert sim.state(STORE) == "FINISHED"  # its install step finished: lite tracks it too
    sim.wait_for_state(TELEMETRY, "RUNNING", timeout=60)
    platform = json.loads((sim.root / "work" / INSTALLER / "platform.json").read_text())
    assert "CPUExecutionProvider" in platform["providers"]["loaded"]
    pointer = (sim.root / "work" / STORE / "artifacts-path").read_text().strip()
    assert Path(pointer) == sim.root / "packages" / "artifacts" / STORE / __version__
    assert pointer.endswith("/") == (sim_nucleus == "lite")  # lite's {artifacts:path} ends in "/"
    # every component has a run unit (lite waits for each), and nothing went BROKEN
    assert sim.wait_for_deployment(60).status == "SUCCEEDED", sim.deployment().reason

    cloud = sim.cloud_client()
    windows = cloud.subscribe(f"edgeinfer/{thing}/telemetry")
    iot_results = cloud.subscribe(f"edgeinfer/{thing}/result")
    local_results = sim.local_client().subscribe(f"edgeinfer/{thing}/result")

    sim.local_client().publish(f"edgeinfer/{thing}/infer", red_request("local-1"))
    local = answer(local_results, "local-1")
    assert local.status == "ok", local.error
    assert local.predictions[0].label == "red"
    assert local.provider == "CPUExecutionProvider"

    cloud.publish(f"edgeinfer/{thing}/infer", red_request("iot-1"), qos=1)
    iot = answer(iot_results, "iot-1")
    assert iot.status == "ok", iot.error
    assert iot.predictions[0].label == "red"
    assert len(iot.predictions) == 5  # topK's default

    # Telemetry windows over IoT Core count the two requests.
    eventually(
        lambda: sum(TelemetryWindow.from_dict(json.loads(m.payload)).count for m in windows.messages) >= 2,
        30,
        "telemetry windows counting the two requests",
    )

    # A live configuration change. The classic nucleus asks the runtime first and refuses what it
    # refuses; lite serves no validation, so the update lands and the runtime keeps its old values.
    if sim_nucleus == "classic":
        with pytest.raises(SimError, match="rejected"):
            sim.update_configuration(RUNTIME, merge={"maxBatchSize": 0})
    else:
        sim.update_configuration(RUNTIME, merge={"maxBatchSize": 0})
    sim.update_configuration(RUNTIME, merge={"maxBatchSize": 4, "topK": 2})
    deadline = time.monotonic() + 20
    while True:
        request_id = f"iot-topk-{time.monotonic_ns()}"
        cloud.publish(f"edgeinfer/{thing}/infer", red_request(request_id), qos=1)
        changed = answer(iot_results, request_id)
        assert changed.status == "ok", changed.error
        if len(changed.predictions) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(changed.predictions) == 2
    assert changed.predictions[0].label == "red"
    assert sim.state(RUNTIME) == "RUNNING"
