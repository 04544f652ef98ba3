"""The whole bundle on the simulated core, straight from `edgeinfer build`: the four real recipes of
recipes/, the artifacts build laid out, the installer's Install step linking this environment (the
`existingVenv` key), then one request answered over IoT Core. A tiny model with the model store's
file names stands in for `edgeinfer model build` output, so this runs in seconds."""

from __future__ import annotations

import base64
import json
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from edgeinfer.bundle.build import build_bundle
from edgeinfer.messages import Result
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
from edgeinfer_bench.runtime import wait_ready
from tests.helpers import PROJECT

pytestmark = pytest.mark.e2e

ROOT = PROJECT
THING = "bundle-e2e"
LABELS = ["red", "green", "blue"]


def tiny_classifier() -> bytes:
    """uint8 NHWC → mean colour → logits over red/green/blue."""
    from onnx import TensorProto, helper

    w = np.eye(3, dtype=np.float32) * 2.0 - 1.0
    nodes = [
        helper.make_node("Cast", ["input"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("ReduceMean", ["f"], ["m"], axes=[1, 2], keepdims=0),
        helper.make_node("MatMul", ["m", "W"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("input", TensorProto.UINT8, ["N", "H", "W", 3])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor("W", TensorProto.FLOAT, w.shape, w.flatten().tolist())],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def write_store(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    data = tiny_classifier()
    variants = []
    for file, precision, providers, name in (
        (model_build.INT8_TRT_FILE, "int8", [TENSORRT], "int8-tensorrt"),
        (model_build.INT8_CPU_FILE, "int8", [CPU], "int8-cpu"),
        (model_build.FP32_FILE, "fp32", [CUDA, CPU], "fp32"),
    ):
        (folder / file).write_bytes(data)
        variants.append(Variant(file, precision, providers, sha256_file(folder / file), len(data), name))
    (folder / model_build.LABELS_FILE).write_text(json.dumps(LABELS))
    Manifest(
        name="tiny",
        version="0.1.0",
        inputs=[TensorSpec("input", "uint8", ["N", "H", "W", 3])],
        outputs=[TensorSpec("logits", "float32", ["N", 3])],
        preprocessing=Preprocessing(preferred_input=[32, 32], size=28),
        labels_file=model_build.LABELS_FILE,
        variants=variants,
    ).save(folder)


def test_bundle_runs_on_the_simulated_core(simulator: SimulatorFactory, tmp_path: Path) -> None:
    artifacts = tmp_path / "artifacts"
    write_store(artifacts / "com.edgeinfer.ModelStore" / "0.1.0")
    bundle = build_bundle(ROOT, artifacts_dir=artifacts, out_dir=tmp_path / "greengrass-build")
    assert len(bundle.components) == 4
    sim = simulator(
        bundle.recipes_dir,  # the recipes as built: digests set, exactly what would ship
        artifacts,
        thing=THING,
        components=["com.edgeinfer.InferenceRuntime", "com.edgeinfer.Telemetry"],
        config_merge={"com.edgeinfer.RuntimeInstaller": {"existingVenv": sys.prefix}},
    )
    wait_ready(sim, timeout=180)
    assert sim.state("com.edgeinfer.RuntimeInstaller") == "FINISHED"
    sim.wait_for_state("com.edgeinfer.Telemetry", "RUNNING", timeout=60)
    platform = json.loads(
        (sim.root / "work" / "com.edgeinfer.RuntimeInstaller" / "platform.json").read_text()
    )
    assert "CPUExecutionProvider" in platform["providers"]["loaded"]

    cloud = sim.cloud_client()
    inbox = cloud.subscribe(f"edgeinfer/{THING}/result")
    time.sleep(0.3)
    image = np.zeros((48, 64, 3), dtype=np.uint8)
    image[:] = (0, 0, 255)  # red, in OpenCV's BGR
    ok, jpeg = cv2.imencode(".jpg", image)
    assert ok
    request = {"id": "red-1", "image": base64.b64encode(bytes(jpeg)).decode()}
    cloud.publish(f"edgeinfer/{THING}/infer", json.dumps(request).encode(), qos=1)
    (message,) = inbox.wait_for(1, timeout=60)
    result = Result.parse(message.payload)
    assert result.status == "ok", result.error
    assert result.predictions[0].label == "red"
    assert result.provider == "CPUExecutionProvider"
