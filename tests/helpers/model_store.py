"""A fake model store (tiny files, a real manifest) so the bundle builds without `edgeinfer model build`.

Shared by the bundle and the publish/deploy tests."""

from __future__ import annotations

import json
from pathlib import Path

from edgeinfer.model import build as model_build
from edgeinfer.model.manifest import CPU, TENSORRT, Manifest, Preprocessing, TensorSpec, Variant, sha256_file


def write_model_store(folder: Path, salt: str = "") -> Manifest:
    """A model store in `folder` with stand-in model files (`salt` changes their content) and a real
    manifest that lists them, so the bundle's manifest check passes."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / model_build.LABELS_FILE).write_text(json.dumps(["cat", "dog"]))
    variants = []
    for file, precision, providers, name in (
        (model_build.FP32_FILE, "fp32", [CPU], "fp32"),
        (model_build.INT8_CPU_FILE, "int8", [CPU], "int8-cpu"),
        (model_build.INT8_TRT_FILE, "int8", [TENSORRT], "int8-tensorrt"),
    ):
        path = folder / file
        path.write_bytes(f"not really onnx: {file}{salt}".encode())
        variants.append(Variant(file, precision, providers, sha256_file(path), path.stat().st_size, name))
    manifest = Manifest(
        name="test-model",
        version="0.1.0",
        inputs=[TensorSpec("image", "uint8", ["N", "H", "W", 3])],
        outputs=[TensorSpec("logits", "float32", ["N", 2])],
        preprocessing=Preprocessing(),
        labels_file=model_build.LABELS_FILE,
        variants=variants,
    )
    manifest.save(folder)
    return manifest
