"""Tiny synthetic YOLO-style detectors in the two export layouts, built with onnx.helper (fast).

Each takes float `[N, 3, S, S]` and answers twelve anchors (more anchors than fields, as in any real
export); the first four have boxes at fixed places of the network input (`TINY_BOXES`, cx, cy, w, h
in input pixels), the rest score nothing. The class of anchor k is k % classes,
scored by how bright the image is on average, so a white image finds all four and a black one none.
A 1×1 conv over the pooled image carries the scores, so the quantizer has a layer to quantize.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

TINY_SIZE = 32
TINY_CLASSES = 2
TINY_ANCHORS = 12
# (cx, cy, w, h) in the 32-pixel network input: four boxes that do not overlap
TINY_BOXES = np.array([[8, 8, 8, 8], [24, 8, 8, 8], [8, 24, 8, 8], [24, 24, 8, 8]], np.float32)


def make_tiny_detector(layout: str = "objectness", classes: int = TINY_CLASSES) -> Any:
    """`objectness` → `[N, 4, 5 + C]`; `anchor_free` → `[N, 4 + C, 4]` (anchors last)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    anchors = TINY_ANCHORS
    fields = (5 if layout == "objectness" else 4) + classes
    # per anchor: the box (constant), objectness (constant 0.95), one class scored by brightness
    weight = np.zeros((anchors * fields, 3, 1, 1), np.float32)
    bias = np.zeros(anchors * fields, np.float32)
    for k in range(len(TINY_BOXES)):
        base = k * fields
        bias[base : base + 4] = TINY_BOXES[k]
        first = 4
        if layout == "objectness":
            bias[base + 4] = 0.95
            first = 5
        weight[base + first + k % classes] = 0.3  # sum of three channels in 0-1: a white image scores 0.9
    inits = [
        numpy_helper.from_array(weight, "w"),
        numpy_helper.from_array(bias, "b"),
        numpy_helper.from_array(np.array([0, anchors, fields], np.int64), "shape"),
    ]
    nodes = [
        helper.make_node("GlobalAveragePool", ["input"], ["pooled"], name="pool"),
        helper.make_node("Conv", ["pooled", "w", "b"], ["head"], name="head"),
        helper.make_node("Reshape", ["head", "shape"], ["rows"], name="rows"),
    ]
    out_shape: list[Any] = ["N", anchors, fields]
    if layout == "anchor_free":
        nodes.append(helper.make_node("Transpose", ["rows"], ["output"], name="to_fields", perm=[0, 2, 1]))
        out_shape = ["N", fields, anchors]
    else:
        nodes.append(helper.make_node("Identity", ["rows"], ["output"], name="out"))
    graph = helper.make_graph(
        nodes,
        "tiny-detector",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, TINY_SIZE, TINY_SIZE])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, out_shape)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def expected_boxes(width: int, height: int) -> np.ndarray:
    """TINY_BOXES as x_min, y_min, x_max, y_max in a width × height source image (letterbox undone)."""
    scale = min(TINY_SIZE / width, TINY_SIZE / height)
    new_w, new_h = int(width * scale + 0.5), int(height * scale + 0.5)
    left, top = (TINY_SIZE - new_w) // 2, (TINY_SIZE - new_h) // 2
    cx, cy, w, h = TINY_BOXES.T
    xyxy = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
    xyxy = (xyxy - np.array([left, top, left, top])) / scale
    return np.clip(xyxy, 0, [width, height, width, height])


def build_tiny_detector_store(folder: Path, layout: str = "objectness") -> Path:
    """The tiny detector through the whole model build (seconds): a real detector store."""
    import onnx

    from edgeinfer.model.build import BuildOptions, build

    folder.mkdir(parents=True, exist_ok=True)
    source = folder / f"tiny-{layout}.onnx"
    onnx.save(make_tiny_detector(layout), str(source))
    labels = folder / "labels.txt"
    labels.write_text("square\nround\n")
    options = BuildOptions(
        onnx=source,
        task="detection",
        labels=labels,
        out=folder / "store",
        calibration_per_photo=2,
        validation_per_photo=2,
        min_calibration=4,
    )
    manifest = build(options, quiet=True)
    assert manifest.root is not None
    return manifest.root
