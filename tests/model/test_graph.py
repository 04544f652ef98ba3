from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from edgeinfer.model import graph
from edgeinfer.model.manifest import Preprocessing

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


def _run(model: Any, feed: dict[str, np.ndarray]) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(sess.run(None, feed)[0])


def test_preprocessing_crops_resizes_and_normalises() -> None:
    pre = Preprocessing.for_size(8)
    model = graph.preprocessing_model(pre)
    onnx.checker.check_model(model)
    # 2 images 16x12: shorter side 12 -> crop round(12 * 0.875) = 10 centred -> resize to 8
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (2, 16, 12, 3), dtype=np.uint8)
    out = _run(model, {"images": images})
    assert out.shape == (2, 3, 8, 8)
    assert out.dtype == np.float32
    assert out.min() >= -127 / 128 - 1e-6
    assert out.max() <= 128 / 128 + 1e-6
    # a constant image stays constant through crop + linear resize; normalisation is (x - 127) / 128
    flat = np.full((1, 9, 9, 3), 200, np.uint8)
    assert np.allclose(_run(model, {"images": flat}), (200 - 127) / 128)


def test_preprocessing_dynamic_sizes_and_bgr() -> None:
    pre = Preprocessing.for_size(8, channel_order="BGR")
    model = graph.preprocessing_model(pre)
    image = np.zeros((1, 20, 30, 3), np.uint8)
    image[..., 0] = 255  # red
    out = _run(model, {"images": image})
    assert out.shape == (1, 3, 8, 8)
    assert np.allclose(out[0, 2], 128 / 128)  # red ends up last in BGR
    assert np.allclose(out[0, 0], -127 / 128)


def test_compose_fp32_matches_core_on_prepared_input(tiny_classifier: Any) -> None:
    core = tiny_classifier()
    pre = Preprocessing.for_size(8)
    composed = graph.compose(core, pre)
    onnx.checker.check_model(composed)
    assert composed.graph.input[0].name == graph.INPUT_NAME
    assert composed.graph.output[0].name == graph.OUTPUT_NAME
    images = np.random.default_rng(1).integers(0, 256, (3, 9, 9, 3), dtype=np.uint8)
    prepared = _run(graph.preprocessing_model(pre), {"images": images})
    expected = _run(core, {"input": prepared})
    assert np.allclose(_run(composed, {"images": images}), expected, atol=1e-5)


def test_uint8_trick_applies_only_to_one_integer_mean() -> None:
    assert graph.uint8_trick_applies(Preprocessing())
    assert not graph.uint8_trick_applies(
        Preprocessing(mean=[123.675, 116.28, 103.53], std=[58.4, 57.1, 57.4])
    )


def test_core_input_rejects_non_images(tiny_classifier: Any) -> None:
    core = tiny_classifier(input_shape=["N", 10])
    with pytest.raises(graph.ModelInputError, match="image tensor"):
        graph.core_input(core)


def test_fold_pads_into_convs() -> None:
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((1, 1, 3, 3), np.float32), "w")
    pads = numpy_helper.from_array(np.array([0, 0, 0, 0, 0, 0, 1, 1], np.int64), "pads")
    nodes = [
        helper.make_node("Pad", ["x", "pads"], ["p"], name="pad"),
        helper.make_node("Conv", ["p", "w"], ["y"], name="conv", strides=[2, 2]),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w, pads],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(0).normal(size=(1, 1, 4, 4)).astype(np.float32)
    before = _run(model, {"x": x})
    assert graph.fold_pads_into_convs(model) == 1
    assert [n.op_type for n in model.graph.node] == ["Conv"]
    assert np.allclose(_run(model, {"x": x}), before)


def test_graph_builder_names_everything_under_its_prefix() -> None:
    b = graph.GraphBuilder("pre/")
    two = b.const("two", np.array([2], np.int64))
    assert two == b.name("two") == "pre/two"
    doubled = b.node("Mul", ["x", two], "doubled")
    out = b.node("Identity", [doubled], "copy", output="y")  # a graph output keeps its own name
    assert (doubled, out) == ("pre/doubled", "y")
    assert [(n.name, list(n.input), list(n.output)) for n in b.nodes] == [
        ("pre/doubled", ["x", "pre/two"], ["pre/doubled"]),
        ("pre/copy", ["pre/doubled"], ["y"]),
    ]
    assert [i.name for i in b.initializers] == ["pre/two"]
    model = onnx.helper.make_model(
        onnx.helper.make_graph(
            b.nodes,
            "g",
            [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.INT64, [1])],
            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.INT64, [1])],
            b.initializers,
        ),
        opset_imports=[onnx.helper.make_opsetid("", 17)],
    )
    assert _run(model, {"x": np.array([21], np.int64)}).tolist() == [42]
