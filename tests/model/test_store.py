"""The real default model store (EfficientNet-Lite0, built once per checkout by the model_store fixture)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeinfer.model import infer, samples
from edgeinfer.model.manifest import CPU, CUDA, TENSORRT, Manifest

pytestmark = pytest.mark.slow

CAT_CLASSES = range(281, 286)


def test_gate_passed_and_files_match(model_store: Path) -> None:
    manifest = Manifest.load(model_store)
    manifest.verify()  # sizes and sha256 of every variant
    assert manifest.name == "efficientnet-lite0"
    assert manifest.validation["passed"] is True
    figures = manifest.validation["variants"]["int8-cpu"]["final"]
    thresholds = manifest.validation["thresholds"]
    assert figures["top1"] >= thresholds["min_top1"]
    assert figures["top1_confident"] >= thresholds["min_top1_confident"]
    assert manifest.calibration_size > 0
    assert manifest.validation_size > 0
    assert len(manifest.labels()) == 1000
    assert manifest.variant_for(CPU).name == "int8-cpu"
    assert manifest.variant_for(TENSORRT).name == "int8-tensorrt"
    assert manifest.variant_for(CUDA).name == "fp32"
    assert manifest.preprocessing.interpolation == "linear"
    assert {"onnx", "onnxruntime", "torch"} <= set(manifest.tools)


@pytest.mark.parametrize("variant", ["fp32", "int8-cpu", "int8-tensorrt"])
def test_cat_is_a_cat(model_store: Path, variant: str) -> None:
    manifest = Manifest.load(model_store)
    sess, chosen, provider = infer.open_session(manifest, CPU, variant=variant)
    assert chosen.name == variant
    assert provider == CPU
    image = infer.prepare(infer.decode(samples.cat_image()), manifest)
    logits = sess.run(None, {sess.get_inputs()[0].name: image})[0]
    (index, label, _p), *_ = infer.top_k(logits[0], manifest.labels())
    assert index in CAT_CLASSES, f"{variant}: {label} [{index}]"
