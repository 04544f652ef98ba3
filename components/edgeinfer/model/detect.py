"""The detector graph: letterbox and normalisation in front, box decode and un-letterbox behind.

Every published detector takes uint8 RGB NHWC `[N, H, W, 3]` of any size and does, as ONNX ops:
scale the image to fit `size` × `size` keeping its aspect (linear Resize on uint8), pad the rest with
grey `pad_value` (centred, as Darknet does), NCHW, normalise, the network, then turn its output into

* `boxes [N, A, 4]`: x_min, y_min, x_max, y_max in the *input image's* pixels (the letterbox undone,
  clipped to the image), and
* `scores [N, A, C]`: per class, objectness × class probability where the network has objectness.

Score thresholding, non-maximum suppression and the top `max_detections` are the runtime's post step
(`edgeinfer.postprocess.detections`), per request. The network's output is read in one of
the two layouts YOLO exports write: `objectness` `[N, A, 5 + C]` (YOLOv3/v5/v7, and the Darknet
converter's) or `anchor_free` `[N, 4 + C, A]` (YOLOv8 and later), boxes as cx, cy, w, h in the
network input's pixels.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgeinfer.model.graph import (
    _PRE,
    INPUT_NAME,
    GraphBuilder,
    ModelInputError,
    _image_input,
    _onnx,
    bgr_nodes,
    normalise_nodes,
    splice_input,
)
from edgeinfer.model.manifest import LAYOUTS, Preprocessing

BOXES = "boxes"
SCORES = "scores"
_POST = "post/"
_GEOMETRY = {"scale": _PRE + "lb_scale", "offset": _PRE + "lb_offset", "limit": _PRE + "lb_limit"}


def output_layout(model: Any, layout: str | None = None) -> tuple[str, int]:
    """(layout, classes) of a detector's single `[N, X, Y]` output; one-line ModelInputError otherwise.

    Without `layout`: the dimension that holds the boxes' fields is the short one (85 or 84 against
    thousands of anchors)."""
    outputs = model.graph.output
    if len(outputs) != 1:
        raise ModelInputError(
            f"detector has {len(outputs)} outputs; expected one [N, 4+C, A] (anchor-free)"
            " or [N, A, 5+C] (with objectness)"
        )
    dims: list[int | None] = [
        d.dim_value if d.HasField("dim_value") else None for d in outputs[0].type.tensor_type.shape.dim
    ]
    shown = [d if d is not None else "?" for d in dims]
    unknown = ModelInputError(
        f"unknown detector output layout {shown}: expected [N, 4+C, A] (anchor-free)"
        " or [N, A, 5+C] (with objectness); give --layout if the shape is dynamic"
    )
    if len(dims) != 3:
        raise unknown
    _, d1, d2 = dims
    if layout is None:
        if d1 is not None and (d2 is None or d1 < d2):
            layout = "anchor_free"
        elif d2 is not None and (d1 is None or d2 < d1):
            layout = "objectness"
        else:
            raise unknown
    if layout not in LAYOUTS:
        raise ModelInputError(f"--layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
    fields = d1 if layout == "anchor_free" else d2
    classes = (fields or 0) - (4 if layout == "anchor_free" else 5)
    if classes < 1:
        raise unknown
    return layout, classes


def letterbox_nodes(pre: Preprocessing, *, normalise: bool) -> tuple[GraphBuilder, str]:
    """Nodes from INPUT_NAME (uint8 NHWC, any H × W) to the letterboxed NCHW tensor (float normalised,
    or the uint8 pixels for the DequantizeLinear trick); the geometry lands in `_GEOMETRY`'s names."""
    onnx = _onnx()
    fl, i64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
    b = GraphBuilder(_PRE)
    const, node = b.const, b.node
    side = pre.size
    shape = node("Shape", [INPUT_NAME], "shape")
    n = node(
        "Slice", [shape, const("i0", np.array([0], np.int64)), const("i1", np.array([1], np.int64))], "n"
    )
    hw = node("Slice", [shape, b.name("i1"), const("i3", np.array([3], np.int64))], "hw")
    hw_f = node("Cast", [hw], "hw_f", to=fl)
    ratio = node("Div", [const("side", np.array([side, side], np.float32)), hw_f], "ratio")
    scale = node("ReduceMin", [ratio], "scale", keepdims=1)  # [1]
    new_f = node(
        "Floor",
        [
            node(
                "Add",
                [node("Mul", [hw_f, scale], "new_raw"), const("half", np.array([0.5], np.float32))],
                "new_h",
            )
        ],
        "new_f",
    )
    new = node(
        "Min",
        [
            node(
                "Max",
                [node("Cast", [new_f], "new_i", to=i64), const("one", np.array([1], np.int64))],
                "new_lo",
            ),
            const("side_i", np.array([side, side], np.int64)),
        ],
        "new",
    )
    sizes = node("Concat", [n, new, const("c3", np.array([3], np.int64))], "sizes", axis=0)
    resized = node(
        "Resize",
        [INPUT_NAME, "", "", sizes],
        "resize",
        mode="linear",
        coordinate_transformation_mode="half_pixel",
    )
    room = node("Sub", [b.name("side_i"), new], "room")
    before = node("Div", [room, const("two", np.array([2], np.int64))], "before")  # [top, left]
    after = node("Sub", [room, before], "after")
    zero2 = const("zero2", np.array([0], np.int64))
    pads = node("Concat", [zero2, before, zero2, zero2, after, zero2], "pads", axis=0)
    fill = const("fill", np.array(pre.pad_value, np.uint8))
    padded = node("Pad", [resized, pads, fill], "padded", mode="constant")
    if pre.channel_order.upper() == "BGR":
        padded = bgr_nodes(b, padded)
    # geometry for the tail, in (x, y) order: canvas = source · scale + offset
    node("Identity", [scale], "lb_scale", output=_GEOMETRY["scale"])
    yx_off = node("Cast", [before], "off_yx", to=fl)
    rev = const("rev", np.array([1, 0], np.int64))
    node("Gather", [yx_off, rev], "lb_offset", output=_GEOMETRY["offset"], axis=0)
    node("Gather", [hw_f, rev], "lb_limit", output=_GEOMETRY["limit"], axis=0)
    nchw = node("Transpose", [padded], "nchw", perm=[0, 3, 1, 2])
    return b, normalise_nodes(b, nchw, pre) if normalise else nchw


def tail_nodes(raw: str, layout: str, classes: int) -> GraphBuilder:
    """Nodes from the network's output `raw` to BOXES and SCORES (see the module docstring)."""
    b = GraphBuilder(_POST)
    const, node = b.const, b.node
    rows = node("Transpose", [raw], "rows", perm=[0, 2, 1]) if layout == "anchor_free" else raw
    axis = const("axis", np.array([2], np.int64))

    def cut(start: int, end: int, name: str) -> str:
        return node(
            "Slice",
            [
                rows,
                const(f"{name}_s", np.array([start], np.int64)),
                const(f"{name}_e", np.array([end], np.int64)),
                axis,
            ],
            name,
        )

    centre, size = cut(0, 2, "cxcy"), cut(2, 4, "wh")
    if layout == "objectness":
        node("Mul", [cut(4, 5, "obj"), cut(5, 5 + classes, "cls")], "scores_raw", output=SCORES)
    else:
        node("Identity", [cut(4, 4 + classes, "cls")], "scores_raw", output=SCORES)
    half = node("Mul", [size, const("half", np.array(0.5, np.float32))], "half_wh")
    lo = node("Sub", [centre, half], "xy_min")
    hi = node("Add", [centre, half], "xy_max")
    limit = _GEOMETRY["limit"]
    zero = const("zero", np.array(0.0, np.float32))

    def back(t: str, name: str) -> str:
        source = node(
            "Div", [node("Sub", [t, _GEOMETRY["offset"]], name + "_shift"), _GEOMETRY["scale"]], name + "_src"
        )
        return node("Min", [node("Max", [source, zero], name + "_lo"), limit], name + "_clip")

    node("Concat", [back(lo, "min"), back(hi, "max")], "boxes", output=BOXES, axis=2)
    return b


def compose_detector(
    core: Any, pre: Preprocessing, layout: str, classes: int, *, uint8_input: bool = False
) -> Any:
    """Letterbox + normalisation in front of `core` (float NCHW network `[N, 3, S, S] → raw`, possibly
    QDQ-quantized), the decode tail behind it; outputs BOXES and SCORES."""
    onnx = _onnx()
    model = onnx.ModelProto()
    model.CopyFrom(core)
    graph = model.graph
    raw = graph.output[0].name
    front, pre_out = letterbox_nodes(pre, normalise=not uint8_input)
    splice_input(model, front, pre_out, pre, uint8_input=uint8_input)
    tail = tail_nodes(raw, layout, classes)
    graph.node.extend(tail.nodes)
    graph.initializer.extend(tail.initializers)
    del graph.output[:]
    vi = onnx.helper.make_tensor_value_info
    graph.output.extend(
        [
            vi(BOXES, onnx.TensorProto.FLOAT, ["N", "A", 4]),
            vi(SCORES, onnx.TensorProto.FLOAT, ["N", "A", classes]),
        ]
    )
    for value in list(graph.value_info):
        if value.name in (BOXES, SCORES):
            graph.value_info.remove(value)
    return model


def preprocessing_model(pre: Preprocessing, opset: int = 17) -> Any:
    """A model that only letterboxes and normalises: uint8 NHWC → float32 NCHW (calibration data)."""
    onnx = _onnx()
    b, out = letterbox_nodes(pre, normalise=True)
    b.nodes.append(onnx.helper.make_node("Identity", [out], ["input"]))
    output = onnx.helper.make_tensor_value_info("input", onnx.TensorProto.FLOAT, ["N", 3, pre.size, pre.size])
    graph = onnx.helper.make_graph(b.nodes, "letterbox", [_image_input()], [output], b.initializers)
    used = {name for node in graph.node for name in node.input}
    for init in [i for i in graph.initializer if i.name not in used]:
        graph.initializer.remove(init)
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])


def tail_node_names(model: Any) -> list[str]:
    """Nodes of a float network that feed no Conv/Gemm/MatMul: its decode tail, kept in float when the
    rest is quantized (boxes in pixels and probabilities share no useful int8 range)."""
    producers = {o: n for n in model.graph.node for o in n.output}
    feeding: set[str] = set()
    stack = [n for n in model.graph.node if n.op_type in ("Conv", "Gemm", "MatMul", "ConvTranspose")]
    while stack:
        n = stack.pop()
        if n.name in feeding:
            continue
        feeding.add(n.name)
        stack.extend(producers[i] for i in n.input if i in producers)
    tail = {n.name for n in model.graph.node if n.name not in feeding}
    consumers: dict[str, list[str]] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n.name)
    outputs = {o.name for o in model.graph.output}
    # The heads too: one conv writes box offsets, objectness and class logits into one tensor, whose
    # one int8 scale would be far too coarse for the logits near 0 where the sigmoid is steepest.
    heads = {
        n.name
        for n in model.graph.node
        if n.op_type == "Conv"
        and all(o in outputs or (consumers.get(o) and all(c in tail for c in consumers[o])) for o in n.output)
    }
    return [n.name for n in model.graph.node if n.name in tail or n.name in heads]
