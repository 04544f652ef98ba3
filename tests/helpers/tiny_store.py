"""A tiny ONNX classifier in a real model-store layout: the whole device path in seconds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from edgeinfer.model.manifest import Manifest, Preprocessing, TensorSpec, Variant, sha256_file

TINY_CLASSES = 10
TINY_LABELS = ["red", "green", "blue"] + [f"class{i}" for i in range(3, TINY_CLASSES)]


def tiny_model_bytes() -> bytes:
    """uint8 NHWC [N, H, W, 3] (dynamic N/H/W) → mean colour → linear → logits [N, 10].

    Red images score class 0, green class 1, blue class 2.
    """
    from onnx import TensorProto, helper

    w = np.full((3, TINY_CLASSES), -1.0, dtype=np.float32)
    w[0, 0] = w[1, 1] = w[2, 2] = 1.0
    b = np.zeros(TINY_CLASSES, dtype=np.float32)
    b[3:] = -300.0
    nodes = [
        helper.make_node("Cast", ["input"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("ReduceMean", ["f"], ["m"], axes=[1, 2], keepdims=0),
        helper.make_node("MatMul", ["m", "W"], ["mm"]),
        helper.make_node("Add", ["mm", "B"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("input", TensorProto.UINT8, ["N", "H", "W", 3])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", TINY_CLASSES])],
        [
            helper.make_tensor("W", TensorProto.FLOAT, w.shape, w.flatten().tolist()),
            helper.make_tensor("B", TensorProto.FLOAT, b.shape, b.tolist()),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def write_tiny_store(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    data = tiny_model_bytes()
    variants = []
    for name, precision, providers in (
        ("int8-tensorrt", "int8", ["TensorrtExecutionProvider"]),
        ("int8-cpu", "int8", ["CPUExecutionProvider"]),
        ("fp32", "fp32", ["CUDAExecutionProvider", "CPUExecutionProvider"]),
    ):
        path = folder / f"tiny-{name}.onnx"
        path.write_bytes(data)
        variants.append(
            Variant(
                file=path.name,
                precision=precision,
                providers=providers,
                sha256=sha256_file(path),
                bytes=len(data),
                name=name,
            )
        )
    (folder / "labels.json").write_text(json.dumps(TINY_LABELS))
    manifest = Manifest(
        name="tiny",
        version="0.0.1",
        inputs=[TensorSpec("input", "uint8", ["N", "H", "W", 3])],
        outputs=[TensorSpec("logits", "float32", ["N", TINY_CLASSES])],
        preprocessing=Preprocessing(preferred_input=[32, 32], size=28),
        labels_file="labels.json",
        variants=variants,
    )
    manifest.save(folder)
    return folder
