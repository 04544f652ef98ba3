"""ONNX graph surgery for the model store: in-graph preprocessing, composition, the uint8 input trick.

Every published graph takes uint8 RGB NHWC `[N, H, W, 3]` (dynamic N, H, W) and does, as ONNX ops:
centre crop of the shorter side (`crop_fraction`) → linear Resize to `size` (on uint8, NHWC, which
ONNX Runtime runs on its fast integer path; never cubic) → NCHW → normalise → the network.

The normalisation differs by graph:

* FP32 (and the TensorRT S8S8 variant): Cast → Sub(mean) → Mul(1/std), then the network.
* INT8 U8S8: when mean is one integer and std one number for all channels, a uint8 pixel already is
  the uint8-quantized form of (x − mean) / std with scale 1/std and zero point mean. The quantizer's
  input QuantizeLinear is removed and the uint8 tensor feeds the stem's DequantizeLinear directly, so
  ONNX Runtime fuses it into the first QLinearConv: normalisation costs nothing.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from edgeinfer.errors import EdgeinferError
from edgeinfer.model.manifest import Preprocessing

log = logging.getLogger(__name__)

INPUT_NAME = "images"
OUTPUT_NAME = "logits"
_PRE = "pre/"


class ModelInputError(EdgeinferError):
    """The source model is not an image classifier we can wrap."""


def _onnx() -> Any:
    import onnx

    return onnx


def uint8_trick_applies(pre: Preprocessing) -> bool:
    """True when (x − mean) / std is exactly DequantizeLinear(x, 1/std, mean) with one uint8 zero point."""
    mean, std = pre.mean, pre.std
    return (
        len(set(mean)) == 1
        and len(set(std)) == 1
        and float(mean[0]).is_integer()
        and 0 <= mean[0] <= 255
        and std[0] > 0
    )


def core_input(model: Any) -> tuple[str, list[int | str]]:
    """Name and shape of a classifier's single float NCHW image input; ModelInputError otherwise."""
    onnx = _onnx()
    initializers = {init.name for init in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    if len(inputs) != 1:
        raise ModelInputError(f"model has {len(inputs)} inputs; expected one image input [N, 3, H, W]")
    value = inputs[0]
    ttype = value.type.tensor_type
    if ttype.elem_type != onnx.TensorProto.FLOAT:
        name = onnx.helper.tensor_dtype_to_np_dtype(ttype.elem_type) if ttype.elem_type else "unknown"
        raise ModelInputError(f"model input {value.name!r} is {name}; expected float32 [N, 3, H, W]")
    dims: list[int | str] = [
        d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in ttype.shape.dim
    ]
    if len(dims) != 4 or dims[1] != 3:
        raise ModelInputError(
            f"model input {value.name!r} has shape {dims}; expected an image tensor [N, 3, H, W]"
        )
    return value.name, dims


class GraphBuilder:
    """Nodes and initializers of a graph fragment, every name under one `prefix` (`pre/`, `post/`).

    A node's name is its output's name unless `output` names the tensor outside the prefix (a
    graph output such as `boxes`)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []

    def name(self, local: str) -> str:
        """The full name of `local` (a tensor made earlier, passed on by name)."""
        return self.prefix + local

    def const(self, local: str, value: np.ndarray) -> str:
        """An initializer holding `value`; returns its name."""
        self.initializers.append(_onnx().numpy_helper.from_array(value, self.name(local)))
        return self.name(local)

    def node(self, op: str, inputs: list[str], local: str, *, output: str | None = None, **attrs: Any) -> str:
        """One `op` node named `local` with one output: the tensor `local`, or `output` as given;
        returns the output's name."""
        tensor = output if output is not None else self.name(local)
        self.nodes.append(_onnx().helper.make_node(op, inputs, [tensor], name=self.name(local), **attrs))
        return tensor


def normalise_nodes(b: GraphBuilder, nchw: str, pre: Preprocessing) -> str:
    """float32 (x − mean) / std of the uint8 NCHW tensor `nchw`; returns its name."""
    as_float = b.node("Cast", [nchw], "float", to=_onnx().TensorProto.FLOAT)
    mean = np.array(pre.mean, np.float32).reshape(1, 3, 1, 1)
    inv_std = (1.0 / np.array(pre.std, np.float64)).astype(np.float32).reshape(1, 3, 1, 1)
    centred = b.node("Sub", [as_float, b.const("mean", mean)], "centred")
    return b.node("Mul", [centred, b.const("inv_std", inv_std)], "normalised")


def bgr_nodes(b: GraphBuilder, nhwc: str) -> str:
    """The channels of the NHWC tensor `nhwc` reversed (RGB → BGR); returns its name."""
    return b.node(
        "Slice",
        [
            nhwc,
            b.const("c_start", np.array([2], np.int64)),
            b.const("c_end", np.array([-4], np.int64)),
            b.const("c_axis", np.array([3], np.int64)),
            b.const("c_step", np.array([-1], np.int64)),
        ],
        "bgr",
    )


def preprocessing_nodes(pre: Preprocessing, *, normalise: bool) -> tuple[GraphBuilder, str]:
    """Nodes and initializers from INPUT_NAME (uint8 NHWC) to a NCHW tensor; returns its name.

    normalise=True: float32 (x − mean) / std. normalise=False: the uint8 NCHW pixels (for the
    DequantizeLinear trick)."""
    fl, i64 = _onnx().TensorProto.FLOAT, _onnx().TensorProto.INT64
    b = GraphBuilder(_PRE)
    const, node = b.const, b.node
    shape = node("Shape", [INPUT_NAME], "shape")
    hw = node(
        "Slice", [shape, const("i1", np.array([1], np.int64)), const("i3", np.array([3], np.int64))], "hw"
    )
    n = node(
        "Slice", [shape, const("i0", np.array([0], np.int64)), const("i1b", np.array([1], np.int64))], "n"
    )
    short = node("ReduceMin", [hw], "short", keepdims=1)
    short_f = node("Cast", [short], "short_f", to=fl)
    side_f = node("Mul", [short_f, const("frac", np.array([pre.crop_fraction], np.float32))], "side_f")
    side_r = node(
        "Floor", [node("Add", [side_f, const("half", np.array([0.5], np.float32))], "side_h")], "side_r"
    )
    side = node(
        "Max",
        [node("Cast", [side_r], "side_i", to=i64), const("one", np.array([1], np.int64))],
        "side",
    )
    starts = node("Div", [node("Sub", [hw, side], "margin"), const("two", np.array([2], np.int64))], "starts")
    ends = node("Add", [starts, side], "ends")
    cropped = node("Slice", [INPUT_NAME, starts, ends, const("axes12", np.array([1, 2], np.int64))], "crop")
    sizes = node(
        "Concat",
        [n, const("hw_out", np.array([pre.size, pre.size], np.int64)), const("c3", np.array([3], np.int64))],
        "sizes",
        axis=0,
    )
    resized = node(
        "Resize",
        [cropped, "", "", sizes],
        "resize",
        mode="linear",
        coordinate_transformation_mode="half_pixel",
    )
    if pre.channel_order.upper() == "BGR":
        resized = bgr_nodes(b, resized)
    nchw = node("Transpose", [resized], "nchw", perm=[0, 3, 1, 2])
    return b, normalise_nodes(b, nchw, pre) if normalise else nchw


def _image_input() -> Any:
    onnx = _onnx()
    return onnx.helper.make_tensor_value_info(INPUT_NAME, onnx.TensorProto.UINT8, ["N", "H", "W", 3])


def preprocessing_model(pre: Preprocessing, opset: int = 17) -> Any:
    """A model that only preprocesses: uint8 NHWC → float32 NCHW (calibration data, tests)."""
    onnx = _onnx()
    b, out = preprocessing_nodes(pre, normalise=True)
    b.nodes.append(onnx.helper.make_node("Identity", [out], ["input"]))
    output = onnx.helper.make_tensor_value_info("input", onnx.TensorProto.FLOAT, ["N", 3, pre.size, pre.size])
    graph = onnx.helper.make_graph(b.nodes, "preprocessing", [_image_input()], [output], b.initializers)
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])


def _rename_output(model: Any) -> None:
    """Call the (single) classifier output OUTPUT_NAME."""
    graph = model.graph
    if len(graph.output) != 1:
        return
    old = graph.output[0].name
    if old == OUTPUT_NAME:
        return
    for node in graph.node:
        for i, name in enumerate(node.output):
            if name == old:
                node.output[i] = OUTPUT_NAME
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = OUTPUT_NAME
    graph.output[0].name = OUTPUT_NAME


def compose(core: Any, pre: Preprocessing, *, uint8_input: bool = False) -> Any:
    """Prepend in-graph preprocessing to `core` (a float NCHW classifier, possibly QDQ-quantized).

    uint8_input=True (QDQ cores only): drop the QuantizeLinear on the core input and feed the uint8
    pixels to its DequantizeLinear with scale 1/std and zero point mean (see module docstring)."""
    onnx = _onnx()
    model = onnx.ModelProto()
    model.CopyFrom(core)
    b, pre_out = preprocessing_nodes(pre, normalise=not uint8_input)
    splice_input(model, b, pre_out, pre, uint8_input=uint8_input)
    _rename_output(model)
    out = model.graph.output[0]
    dims = out.type.tensor_type.shape.dim
    if dims and not dims[0].HasField("dim_value"):
        dims[0].dim_param = "N"
    return model


def splice_input(model: Any, b: GraphBuilder, pre_out: str, pre: Preprocessing, *, uint8_input: bool) -> None:
    """Put the preprocessing in `b` (INPUT_NAME → `pre_out`) in front of `model`'s float image input, in
    place; with `uint8_input`, `pre_out` holds uint8 NCHW pixels that feed the stem's DequantizeLinear."""
    graph = model.graph
    in_name, _ = core_input(model)
    if uint8_input:
        if not uint8_trick_applies(pre):
            raise ValueError("uint8 input needs one integer mean and one std for all channels")
        scale = b.const("input_scale", np.array(1.0 / pre.std[0], np.float32))
        zero = b.const("input_zero_point", np.array(int(pre.mean[0]), np.uint8))
        quants = [n for n in graph.node if n.op_type == "QuantizeLinear" and n.input[0] == in_name]
        others = [n for n in graph.node if in_name in n.input and n.op_type != "QuantizeLinear"]
        deqs = [n for q in quants for n in graph.node if q.output[0] in n.input]
        if len(quants) == 1 and not others and deqs and all(n.op_type == "DequantizeLinear" for n in deqs):
            for deq in deqs:
                deq.input[0] = pre_out
                deq.input[1] = scale
                deq.input[2] = zero
                for attr in list(deq.attribute):  # a per-axis attribute would not fit a scalar scale
                    if attr.name == "axis":
                        deq.attribute.remove(attr)
            graph.node.remove(quants[0])
        else:
            # The first layer stayed in float: one DequantizeLinear still normalises for free.
            b.node("DequantizeLinear", [pre_out, scale, zero], "dequantize", output=in_name)
    else:
        for node in graph.node:
            for i, name in enumerate(node.input):
                if name == in_name:
                    node.input[i] = pre_out
    old_nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend(b.nodes + old_nodes)
    graph.initializer.extend(b.initializers)
    old_inputs = [i for i in graph.input if i.name != in_name]
    del graph.input[:]
    graph.input.extend([_image_input(), *old_inputs])
    # Drop stale shape information about the old input.
    for value in list(graph.value_info):
        if value.name == in_name:
            graph.value_info.remove(value)
    guard_float_layers(model)
    used = {name for node in graph.node for name in node.input}
    for init in [i for i in graph.initializer if i.name not in used]:
        graph.initializer.remove(init)


def fold_pads_into_convs(model: Any) -> int:
    """Fold constant zero `Pad` nodes that feed a `Conv` into the Conv's `pads`; returns how many."""
    onnx = _onnx()
    nh = onnx.numpy_helper
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    folded = 0
    for pad in [n for n in graph.node if n.op_type == "Pad"]:
        users = consumers.get(pad.output[0], [])
        if len(users) != 1 or users[0].op_type != "Conv":
            continue
        mode = next((a.s.decode() for a in pad.attribute if a.name == "mode"), "constant")
        if mode != "constant" or len(pad.input) < 2 or pad.input[1] not in inits:
            continue
        if (len(pad.input) > 2 and pad.input[2]) and (
            pad.input[2] not in inits or float(nh.to_array(inits[pad.input[2]]).reshape(-1)[0]) != 0.0
        ):
            continue
        pads = nh.to_array(inits[pad.input[1]]).astype(np.int64).reshape(-1)
        if len(pads) != 8 or pads[0] or pads[1] or pads[4] or pads[5] or (pads < 0).any():
            continue
        conv = users[0]
        old = next((list(a.ints) for a in conv.attribute if a.name == "pads"), [0, 0, 0, 0])
        auto = next((a.s.decode() for a in conv.attribute if a.name == "auto_pad"), "NOTSET")
        if auto not in ("NOTSET", ""):
            continue
        new = [old[0] + int(pads[2]), old[1] + int(pads[3]), old[2] + int(pads[6]), old[3] + int(pads[7])]
        for attr in list(conv.attribute):
            if attr.name == "pads":
                conv.attribute.remove(attr)
        conv.attribute.append(onnx.helper.make_attribute("pads", new))
        conv.input[0] = pad.input[0]
        graph.node.remove(pad)
        folded += 1
    return folded


def guard_float_layers(model: Any) -> int:
    """Keep float layers of a QDQ graph really in float; returns how many were guarded.

    ONNX Runtime's `WeightBiasQuantization` optimisation quantizes the float weights of any Conv/Gemm
    fed by a DequantizeLinear (per tensor, which wrecks depthwise convs) so that it can fuse it. An
    identity Clip (±FLT_MAX) between the DequantizeLinear and such a layer keeps it in float."""
    onnx = _onnx()
    h, nh = onnx.helper, onnx.numpy_helper
    graph = model.graph
    producers = {o: n for n in graph.node for o in n.output}
    const = {i.name for i in graph.initializer}
    lo, hi = "guard/min", "guard/max"
    new_nodes: list[tuple[int, Any]] = []
    for index, node in enumerate(graph.node):
        if (
            node.op_type not in ("Conv", "Gemm", "MatMul")
            or len(node.input) < 2
            or node.input[1] not in const
        ):
            continue
        src = producers.get(node.input[0])
        if src is None or src.op_type != "DequantizeLinear" or src.input[0] in const:
            continue
        out = f"{node.input[0]}/float_guard/{node.name}"
        clip = h.make_node("Clip", [node.input[0], lo, hi], [out], name=f"{node.name}/float_guard")
        new_nodes.append((index, clip))
        node.input[0] = out
    if new_nodes:
        big = float(np.finfo(np.float32).max)
        graph.initializer.extend(
            [nh.from_array(np.array(-big, np.float32), lo), nh.from_array(np.array(big, np.float32), hi)]
        )
        for offset, (index, clip) in enumerate(new_nodes):
            graph.node.insert(index + offset, clip)
    return len(new_nodes)


def naive_preprocessing(model: Any) -> Any | None:
    """The same INT8 graph with the textbook preprocessing: Cast → Sub → Mul → QuantizeLinear in
    front of the stem's DequantizeLinear instead of the uint8 pixels feeding it directly.

    Numerically identical (the QuantizeLinear gives back exactly the pixels); only for the benchmark
    that shows what the shortcut saves. None when `model` does not use the uint8 input."""
    onnx = _onnx()
    h, nh = onnx.helper, onnx.numpy_helper
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    pixels = _PRE + "nchw"
    deqs = [n for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0] == pixels]
    if not deqs:
        return None
    inits = {i.name: nh.to_array(i) for i in graph.initializer}
    scale, zero = deqs[0].input[1], deqs[0].input[2]
    mean = float(inits[zero])
    inv_std = float(inits[scale])
    graph.initializer.extend(
        [
            nh.from_array(np.array(mean, np.float32), _PRE + "naive_mean"),
            nh.from_array(np.array(inv_std, np.float32), _PRE + "naive_inv_std"),
        ]
    )
    nodes = [
        h.make_node("Cast", [pixels], [_PRE + "naive_float"], to=onnx.TensorProto.FLOAT),
        h.make_node("Sub", [_PRE + "naive_float", _PRE + "naive_mean"], [_PRE + "naive_centred"]),
        h.make_node("Mul", [_PRE + "naive_centred", _PRE + "naive_inv_std"], [_PRE + "naive_normalised"]),
        h.make_node("QuantizeLinear", [_PRE + "naive_normalised", scale, zero], [_PRE + "naive_q"]),
    ]
    for deq in deqs:
        deq.input[0] = _PRE + "naive_q"
    index = min(i for i, n in enumerate(graph.node) if n in deqs)
    for offset, node in enumerate(nodes):
        graph.node.insert(index + offset, node)
    return copy
