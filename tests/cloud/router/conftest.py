"""Fixtures for the router tests: a real mosquitto, a tiny real ONNX model store, JPEGs, a fake backend."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.sim.broker import MosquittoBroker
from tests.helpers.router import FakeBackend


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[MosquittoBroker]:
    """A broker of this test's own (it may be stopped and started again on the same port)."""
    b = MosquittoBroker(work_dir=tmp_path / "mqtt").start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def tiny_store(tmp_path: Path) -> Path:
    """A real model store whose graph is tiny: uint8 NHWC → mean colour → 4-class softmax."""
    import onnx
    from onnx import TensorProto, helper

    from edgeinfer.model.manifest import Manifest, Preprocessing, TensorSpec, Variant, sha256_file

    store = tmp_path / "store"
    store.mkdir()
    weights = np.array([[1, 0, 0, -1], [0, 1, 0, -1], [0, 0, 1, -1]], dtype=np.float32) / 64.0
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["image"], ["f"], to=TensorProto.FLOAT),
            helper.make_node("ReduceMean", ["f"], ["m"], axes=[1, 2], keepdims=0),
            helper.make_node("MatMul", ["m", "w"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["probabilities"], axis=-1),
        ],
        "tiny",
        [helper.make_tensor_value_info("image", TensorProto.UINT8, ["N", "H", "W", 3])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor("w", TensorProto.FLOAT, [3, 4], weights.flatten().tolist())],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, store / "tiny.onnx")
    (store / "labels.json").write_text(json.dumps(["red", "green", "blue", "dark"]))
    path = store / "tiny.onnx"
    Manifest(
        name="tiny",
        version="1.0.0",
        inputs=[TensorSpec("image", "uint8", ["N", "H", "W", 3])],
        outputs=[TensorSpec("probabilities", "float32", ["N", 4])],
        preprocessing=Preprocessing.for_size(16),
        labels_file="labels.json",
        variants=[
            Variant(
                file="tiny.onnx",
                precision="fp32",
                providers=["CPUExecutionProvider"],
                sha256=sha256_file(path),
                bytes=path.stat().st_size,
                name="fp32",
            )
        ],
    ).save(store)
    return store


@pytest.fixture
def fake_backend() -> FakeBackend:
    return FakeBackend()
