"""The detector graph: layouts, letterbox in the graph, boxes back in the source image's pixels."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from edgeinfer import postprocess
from edgeinfer.model import detect
from edgeinfer.model.graph import ModelInputError
from edgeinfer.model.manifest import Preprocessing
from tests.helpers.tiny_detector import (
    TINY_ANCHORS,
    TINY_CLASSES,
    TINY_SIZE,
    expected_boxes,
    make_tiny_detector,
)

PRE = Preprocessing(
    size=TINY_SIZE,
    crop_fraction=1.0,
    mean=[0.0] * 3,
    std=[255.0] * 3,
    resize="letterbox",
    preferred_input=[TINY_SIZE, TINY_SIZE],
)


def _session(model: Any) -> Any:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("layout", ["objectness", "anchor_free"])
def test_layout_is_read_from_the_output_shape(layout: str) -> None:
    assert detect.output_layout(make_tiny_detector(layout)) == (layout, TINY_CLASSES)


def test_an_unknown_layout_is_one_line_naming_the_shape_and_both_layouts() -> None:
    model = make_tiny_detector()
    dims = model.graph.output[0].type.tensor_type.shape.dim
    del dims[2]  # [N, 12]
    with pytest.raises(ModelInputError) as err:
        detect.output_layout(model)
    message = str(err.value)
    assert "\n" not in message
    assert "['?', 12]" in message
    assert "[N, 4+C, A]" in message
    assert "[N, A, 5+C]" in message


def test_a_square_dynamic_output_needs_the_layout_named() -> None:
    model = make_tiny_detector()
    for d in model.graph.output[0].type.tensor_type.shape.dim[1:]:
        d.dim_param = "A"
    with pytest.raises(ModelInputError, match="--layout"):
        detect.output_layout(model)
    model.graph.output[0].type.tensor_type.shape.dim[2].dim_value = 5 + TINY_CLASSES
    assert detect.output_layout(model, "objectness") == ("objectness", TINY_CLASSES)


@pytest.mark.parametrize("layout", ["objectness", "anchor_free"])
@pytest.mark.parametrize(("height", "width"), [(32, 32), (48, 96), (120, 40)])
def test_boxes_come_back_in_the_source_images_pixels(layout: str, height: int, width: int) -> None:
    layout_read, classes = detect.output_layout(make_tiny_detector(layout))
    model = detect.compose_detector(make_tiny_detector(layout), PRE, layout_read, classes)
    onnx.checker.check_model(model)
    image = np.full((1, height, width, 3), 255, np.uint8)
    boxes, scores = _session(model).run(None, {"images": image})
    assert boxes.shape == (1, TINY_ANCHORS, 4)
    assert scores.shape == (1, TINY_ANCHORS, classes)
    assert np.allclose(boxes[0, :4], expected_boxes(width, height), atol=1e-3)
    # a white image scores 0.9 (× 0.95 objectness); the letterbox's grey bands pull the mean down
    assert (scores[0, :4].max(axis=1) > 0.5).all()
    assert (scores[0, 4:] == 0).all()


def test_the_in_graph_letterbox_pads_grey_and_centres() -> None:
    model = detect.preprocessing_model(PRE)
    image = np.zeros((1, 16, 64, 3), np.uint8)  # 4:1, scaled to 32x8, 12 rows of grey above and below
    out = _session(model).run(None, {"images": image})[0]
    assert out.shape == (1, 3, 32, 32)
    assert np.allclose(out[0, :, :12], 127 / 255)
    assert np.allclose(out[0, :, 12:20], 0.0)
    assert np.allclose(out[0, :, 20:], 127 / 255)


def test_nothing_is_found_in_a_black_image() -> None:
    model = detect.compose_detector(make_tiny_detector(), PRE, "objectness", TINY_CLASSES)
    boxes, scores = _session(model).run(None, {"images": np.zeros((2, 40, 50, 3), np.uint8)})
    assert (
        postprocess.detections(
            boxes[0], scores[0], score_threshold=0.25, iou_threshold=0.45, max_detections=9
        )
        == []
    )


def test_the_tail_and_the_heads_stay_in_float() -> None:
    model = make_tiny_detector()
    assert set(detect.tail_node_names(model)) == {"head", "rows", "out"}
