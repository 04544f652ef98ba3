"""Fixtures for the model pipeline tests: tiny ONNX classifiers built with onnx.helper (fast)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest


def make_tiny_classifier(
    size: int = 8, classes: int = 5, seed: int = 0, input_shape: list[Any] | None = None
) -> Any:
    """float [N, 3, size, size] -> Conv+ReLU6 -> depthwise Conv+ReLU6 -> pool -> Gemm -> [N, classes]."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)

    def init(name: str, array: np.ndarray) -> onnx.TensorProto:
        return numpy_helper.from_array(array.astype(np.float32), name)

    inits = [
        init("w1", rng.normal(0, 0.5, (8, 3, 3, 3))),
        init("b1", rng.normal(0, 0.1, (8,))),
        init("w2", rng.normal(0, 0.5, (8, 1, 3, 3))),
        init("b2", rng.normal(0, 0.1, (8,))),
        init("wf", rng.normal(0, 0.5, (classes, 8))),
        init("bf", rng.normal(0, 0.1, (classes,))),
        init("zero", np.array(0.0)),
        init("six", np.array(6.0)),
    ]
    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c1", "zero", "six"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="dw", pads=[1, 1, 1, 1], group=8),
        helper.make_node("Clip", ["c2", "zero", "six"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["out"], name="fc", transB=1),
    ]
    shape: list[Any] = input_shape if input_shape is not None else ["N", 3, size, size]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", classes])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture
def tiny_classifier() -> Callable[..., Any]:
    """The factory: tiny_classifier(size=8, classes=5, seed=0, input_shape=None) -> onnx.ModelProto."""
    return make_tiny_classifier


@pytest.fixture
def tiny_onnx(tmp_path: Path) -> Path:
    import onnx

    path = tmp_path / "tiny.onnx"
    onnx.save(make_tiny_classifier(), str(path))
    return path
