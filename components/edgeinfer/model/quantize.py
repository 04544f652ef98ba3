"""Static INT8 QDQ quantization of the float core network, plus what ONNX Runtime's quantizer lacks.

* `quantize_core`: per-channel static QDQ through `onnxruntime.quantization.quantize_static`, in one of
  two schemes: U8S8 (uint8 activations, int8 weights: the fast one on the CPU provider) or S8S8
  symmetric (what TensorRT's explicit quantization wants).
* `bias_correct`: empirical bias correction (Nagel et al. 2019, §4.2): the expected output shift a
  layer's weight quantization causes, E[(W̃ − W) x] with x the layer's real (quantized) input, is
  taken out of the layer's int32 bias.
* `equalize_ranges`: cross-layer equalization (Nagel et al. 2019, §4.1) on pairs of convs
  joined by a ReLU-like activation.
* `sensitivity`: per-layer ranking of where the quantized network's activations drift from FP32,
  so the worst layers can stay in float (`nodes_to_exclude`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.files import atomic_write

log = logging.getLogger(__name__)

SCHEMES: dict[str, dict[str, Any]] = {
    "u8s8": {"activation": "QUInt8", "weight": "QInt8", "symmetric_activations": False},
    "s8s8": {"activation": "QInt8", "weight": "QInt8", "symmetric_activations": True},
}
SCHEME_LABEL = {"u8s8": "QDQ U8S8 per-channel", "s8s8": "QDQ S8S8 symmetric per-channel"}

Tick = Callable[[int], None]


def _session(model: Any, threads: int = 0, *, unfused: bool = False) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if unfused:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if threads:
        opts.intra_op_num_threads = threads
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])


def ensure_node_names(model: Any) -> None:
    seen: set[str] = set()
    for i, node in enumerate(model.graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{i}"
        seen.add(node.name)


def quantize_core(
    core: Path,
    out: Path,
    calibration: np.ndarray,
    *,
    scheme: str,
    input_name: str,
    exclude: Sequence[str] = (),
    batch: int = 8,
    tick: Tick | None = None,
    method: str = "MinMax",
    percentile: float = 99.999,
    extra_options: dict[str, Any] | None = None,
    reduce_range: bool = False,
) -> None:
    """Static QDQ quantization of a float NCHW core network, calibrated with MinMax on `calibration`.

    `reduce_range`: 7-bit weights. Without AVX-512 VNNI (AVX2 x86-64), ONNX Runtime's U8S8 kernels
    add pairs of u8 × s8 products in int16 (`vpmaddubsw`), which saturates once both are large;
    7-bit weights keep every pair in range."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    spec = SCHEMES[scheme]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.start = 0

        def get_next(self) -> dict[str, np.ndarray] | None:
            if self.start >= len(calibration):
                return None
            chunk = calibration[self.start : self.start + batch]
            self.start += batch
            if tick is not None:
                tick(len(chunk))
            return {input_name: chunk}

        def rewind(self) -> None:
            self.start = 0

    extra: dict[str, Any] = {
        "ActivationSymmetric": bool(spec["symmetric_activations"]),
        "WeightSymmetric": True,
        # With layers excluded, the quantizer would drop a Clip whose output is no longer quantized
        # (its range no longer stands in for the ReLU6): keep them; ORT's ClipQuantFusion still
        # removes the redundant ones at load time.
        "QDQKeepRemovableActivations": bool(exclude),
    }
    if method == "Percentile":
        extra["CalibPercentile"] = percentile
    extra.update(extra_options or {})
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantizer warns about pre-processing through the root logger
    try:
        quantize_static(
            str(core),
            str(out),
            Reader(),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=getattr(QuantType, spec["activation"]),
            weight_type=getattr(QuantType, spec["weight"]),
            calibrate_method=getattr(CalibrationMethod, method),
            nodes_to_exclude=list(exclude),
            extra_options=extra,
            reduce_range=reduce_range,
        )
    finally:
        root.setLevel(level)


# ------------------------------------------------------------------------------------------- analysis


def _with_outputs(model: Any, names: Sequence[str]) -> Any:
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    existing = {o.name for o in copy.graph.output}
    for name in names:
        if name not in existing:
            copy.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    return copy


def _run_collect(
    model: Any,
    input_name: str,
    data: np.ndarray,
    names: Sequence[str],
    batch: int = 16,
    *,
    unfused: bool = False,
) -> dict[str, list[np.ndarray]]:
    sess = _session(_with_outputs(model, names), unfused=unfused)
    got: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for start in range(0, len(data), batch):
        outs = sess.run(list(names), {input_name: data[start : start + batch]})
        for name, value in zip(names, outs, strict=True):
            got[name].append(value)
    return got


def _initializers(model: Any) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


def _dequant(inits: dict[str, np.ndarray], node: Any) -> np.ndarray | None:
    """Dequantize a constant DequantizeLinear node (weights, bias), or None if not constant."""
    if node.input[0] not in inits:
        return None
    q = inits[node.input[0]].astype(np.float64)
    scale = inits[node.input[1]].astype(np.float64)
    zero = inits[node.input[2]].astype(np.float64) if len(node.input) > 2 and node.input[2] else 0.0
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
    if np.ndim(scale) == 1 and q.ndim > 1:
        shape = [1] * q.ndim
        shape[axis] = -1
        scale = scale.reshape(shape)
        zero = np.reshape(zero, shape) if np.ndim(zero) == 1 else zero
    return np.asarray((q - zero) * scale)


def bias_correct(
    float_core: Any, quant_core: Any, input_name: str, data: np.ndarray, *, unfused: bool = False
) -> tuple[Any, int]:
    """Empirical bias correction of every quantized Conv/Gemm; returns (model, layers corrected).
    `unfused`: the quantized network's inputs measured as its QDQ arithmetic in float (see _session),
    not as this host's integer kernels compute them (which may saturate).

    For each layer, E[x] per input channel is measured on the quantized network's own input to that
    layer; the shift its weight quantization adds to the output mean is Σ (W̃ − W)·E[x] (exact for
    1×1 convs and Gemm, exact up to the zero-padded border for k×k convs) and is subtracted from the
    int32 bias, so E[output] matches the float layer's given the same input."""
    from onnx import numpy_helper

    producers = {o: n for n in quant_core.graph.node for o in n.output}
    inits = _initializers(quant_core)
    float_inits = _initializers(float_core)
    float_nodes = {n.name: n for n in float_core.graph.node}
    jobs = []
    for node in quant_core.graph.node:
        if node.op_type not in ("Conv", "Gemm") or len(node.input) < 3 or node.name not in float_nodes:
            continue
        w_dq = producers.get(node.input[1])
        b_dq = producers.get(node.input[2])
        x_dq = producers.get(node.input[0])
        if not (w_dq and b_dq and x_dq) or "DequantizeLinear" not in (
            w_dq.op_type,
            b_dq.op_type,
            x_dq.op_type,
        ):
            continue
        if w_dq.op_type != "DequantizeLinear" or b_dq.op_type != "DequantizeLinear":
            continue
        fnode = float_nodes[node.name]
        if fnode.input[1] not in float_inits:
            continue
        w_q = _dequant(inits, w_dq)
        if w_q is None:
            continue
        w_f = float_inits[fnode.input[1]].astype(np.float64)
        if w_f.shape != w_q.shape:
            continue
        jobs.append((node, w_q - w_f, b_dq, node.input[0]))
    if not jobs:
        return quant_core, 0
    means: dict[str, np.ndarray] = {}
    names = sorted({j[3] for j in jobs})
    collected = _run_collect(quant_core, input_name, data, names, unfused=unfused)
    for name, chunks in collected.items():
        x = np.concatenate(chunks).astype(np.float64)
        means[name] = x.mean(axis=(0, 2, 3)) if x.ndim == 4 else x.mean(axis=0)
    by_name = {i.name: i for i in quant_core.graph.initializer}
    corrected = 0
    for node, eps, b_dq, x_name in jobs:
        mean_x = means[x_name]
        if node.op_type == "Gemm":
            trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
            e = eps if trans_b else eps.T  # [out, in]
            shift = e @ mean_x
        else:
            group = next((a.i for a in node.attribute if a.name == "group"), 1)
            out_c, in_per_group = eps.shape[0], eps.shape[1]
            summed = eps.sum(axis=(2, 3))  # [out, in/group]
            per_out = out_c // group
            idx = np.arange(out_c)[:, None] // per_out * in_per_group + np.arange(in_per_group)[None, :]
            shift = (summed * mean_x[idx]).sum(axis=1)
        bias_init = by_name[b_dq.input[0]]
        scale = inits[b_dq.input[1]].astype(np.float64)
        q = numpy_helper.to_array(bias_init).astype(np.float64)
        new_q = np.round(q - shift / scale)
        info = np.iinfo(np.int32)
        bias_init.CopyFrom(
            numpy_helper.from_array(np.clip(new_q, info.min, info.max).astype(np.int32), bias_init.name)
        )
        corrected += 1
    return quant_core, corrected


def sensitivity(
    float_core: Any, quant_core: Any, input_name: str, data: np.ndarray, *, unfused: bool = False
) -> list[tuple[str, float]]:
    """Rank quantized Conv/Gemm layers by the relative error they add (descending).

    For each layer: relative MSE against FP32 of its output (after its ReLU6, which is what the
    next layer sees) minus that of its input as the layer receives it (dequantized). The layers
    that add most are the ones to keep in float."""
    float_nodes = {n.name: n for n in float_core.graph.node}
    float_inits = _initializers(float_core)
    consumers: dict[str, list[Any]] = {}
    for n in float_core.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    jobs = []  # (name, q input, f input, q output, f output, clip)
    for node in quant_core.graph.node:
        fnode = float_nodes.get(node.name)
        if node.op_type not in ("Conv", "Gemm") or fnode is None:
            continue
        f_out = fnode.output[0]
        clip: tuple[float, float] | None = None
        users = consumers.get(f_out, [])
        if len(users) == 1 and users[0].op_type == "Clip" and len(users[0].input) == 3:
            lo, hi = users[0].input[1:3]
            if lo in float_inits and hi in float_inits:
                clip = (float(float_inits[lo]), float(float_inits[hi]))
        jobs.append((node.name, node.input[0], fnode.input[0], node.output[0], f_out, clip))
    if not jobs:
        return []
    f = _run_collect(float_core, input_name, data, sorted({j[2] for j in jobs} | {j[4] for j in jobs}))
    q = _run_collect(
        quant_core, input_name, data, sorted({j[1] for j in jobs} | {j[3] for j in jobs}), unfused=unfused
    )

    def rel(fv: np.ndarray, qv: np.ndarray) -> float:
        return float(((fv - qv) ** 2).mean() / max(float((fv**2).mean()), 1e-12))

    def get(store: dict[str, list[np.ndarray]], name: str) -> np.ndarray:
        if name == input_name and name not in store:
            return data.astype(np.float64)
        return np.concatenate(store[name]).astype(np.float64)

    scores = []
    for name, q_in, f_in, q_out, f_out, clip in jobs:
        fo, qo = get(f, f_out), get(q, q_out)
        if clip is not None:
            fo, qo = np.clip(fo, *clip), np.clip(qo, *clip)
        scores.append((name, rel(fo, qo) - rel(get(f, f_in), get(q, q_in))))
    scores.sort(key=lambda s: s[1], reverse=True)
    return scores


def save(model: Any, path: Path) -> None:
    """Save atomically (temp file in the same folder, then rename), readable by the component user."""
    atomic_write(path, model.SerializeToString())


class _Weights:
    """A model's graph as the equalization reads it: initializers by name, each tensor's consumers."""

    def __init__(self, graph: Any) -> None:
        self.inits = {i.name: i for i in graph.initializer}
        self.consumers: dict[str, list[Any]] = {}
        for n in graph.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)

    def array(self, name: str) -> np.ndarray:
        from onnx import numpy_helper

        return numpy_helper.to_array(self.inits[name]).astype(np.float64)

    def store(self, name: str, value: np.ndarray) -> None:
        from onnx import numpy_helper

        self.inits[name].CopyFrom(numpy_helper.from_array(value.astype(np.float32), name))

    def only(self, name: str) -> Any:
        """The one node reading `name`, or None (no reader, or several)."""
        users = self.consumers.get(name, [])
        return users[0] if len(users) == 1 else None


def _attr(node: Any, key: str, default: int) -> int:
    return next((a.i for a in node.attribute if a.name == key), default)


@dataclass(frozen=True)
class _Pair:
    """conv A → ReLU-like → B: A's output channels scale up, B's matching input channels down."""

    a: Any
    bound: float | None  # the clip's upper limit (ReLU6: 6); None for a plain ReLU
    b: Any
    kind: str  # depthwise | dense | gemm


def _relu_bound(w: _Weights, act: Any) -> tuple[bool, float | None]:
    """Whether `act` is a ReLU or a Clip from 0, and its upper bound (None: unbounded)."""
    if act.op_type == "Clip" and len(act.input) == 3 and all(x in w.inits for x in act.input[1:]):
        lo, hi = float(w.array(act.input[1])), float(w.array(act.input[2]))
        return lo == 0.0, hi
    return act.op_type == "Relu", None


def _pair_kind(w: _Weights, b: Any, channels: int) -> tuple[Any, str] | None:
    """The node whose input channels undo A's scaling, and how its weights hold them."""
    if b.op_type == "Conv" and b.input[1] in w.inits:
        wb = w.array(b.input[1])
        group = _attr(b, "group", 1)
        if group == channels and wb.shape[1] == 1:
            return b, "depthwise"
        if group == 1 and wb.shape[1] == channels:
            return b, "dense"
    elif b.op_type == "GlobalAveragePool":
        nxt = w.only(b.output[0])
        while nxt is not None and nxt.op_type in ("Flatten", "Reshape"):
            nxt = w.only(nxt.output[0])
        if nxt is not None and nxt.op_type == "Gemm" and nxt.input[1] in w.inits:
            return nxt, "gemm"
    return None


def _pair_from(w: _Weights, a: Any) -> _Pair | None:
    """The pair starting at conv `a`, if its output reaches a scalable node through one ReLU-like."""
    if a.op_type != "Conv" or len(a.input) < 3 or a.input[1] not in w.inits or a.input[2] not in w.inits:
        return None
    act = w.only(a.output[0])
    if act is None:
        return None
    relu, bound = _relu_bound(w, act)
    b = w.only(act.output[0]) if relu else None
    if b is None:
        return None
    found = _pair_kind(w, b, w.array(a.input[1]).shape[0])
    return _Pair(a, bound, found[0], found[1]) if found is not None else None


def _rescale(w: _Weights, pair: _Pair, k: np.ndarray) -> None:
    """A's output channels times k, B's input channels divided by k: the same function."""
    a, b = pair.a, pair.b
    wa, ba = w.array(a.input[1]), w.array(a.input[2])
    w.store(a.input[1], wa * k.reshape((-1,) + (1,) * (wa.ndim - 1)))
    w.store(a.input[2], ba * k)
    wb = w.array(b.input[1])
    if pair.kind == "depthwise":
        wb = wb / k.reshape((-1,) + (1,) * (wb.ndim - 1))
    elif pair.kind == "dense":
        wb = wb / k.reshape((1, -1) + (1,) * (wb.ndim - 2))
    else:  # Gemm: input features are the columns with transB=1, the rows otherwise
        wb = wb / (k.reshape(1, -1) if _attr(b, "transB", 0) else k.reshape(-1, 1))
    w.store(b.input[1], wb)


def equalize_ranges(
    float_core: Any,
    input_name: str,
    data: np.ndarray,
    *,
    alpha: float = 1.0,
    max_scale: float = 16.0,
    headroom: float = 2.0,
) -> tuple[Any, int]:
    """Cross-layer equalization of activation ranges (after Nagel et al. 2019, §4.1), for ReLU6 nets.

    Per-tensor activation quantization gives every channel of a tensor the same step, so channels
    with a small range get few levels. For each pair `conv A → ReLU6/ReLU → conv B` (B depthwise or
    dense, or A → ReLU6 → GlobalAveragePool → Gemm), channel c of A is scaled up by
    k_c = (bound / max_c)^alpha (≤ max_scale, ≥ 1) and B's weights for that input channel down by
    k_c: the network computes the same function, and every channel uses the tensor's range. With
    ReLU6 the bound is 6, the clip's own limit, so scaled channels still clip at 6 — the result only
    differs from FP32 where a channel exceeds its calibrated maximum. Returns (model, pairs)."""
    import onnx

    model = onnx.ModelProto()
    model.CopyFrom(float_core)
    w = _Weights(model.graph)
    pairs = [p for p in (_pair_from(w, a) for a in model.graph.node) if p is not None]
    if not pairs:
        return model, 0
    got = _run_collect(float_core, input_name, data, [p.a.output[0] for p in pairs])
    for pair in pairs:
        x = np.concatenate(got[pair.a.output[0]]).astype(np.float64)
        peak = x.max(axis=(0, 2, 3)) if x.ndim == 4 else x.max(axis=0)
        top = pair.bound if pair.bound is not None else float(peak.max())
        peak = np.minimum(peak, top)
        k = np.ones_like(peak)
        alive = peak > top * 1e-3
        k[alive] = np.clip((top / (headroom * peak[alive])) ** alpha, 1.0, max_scale)
        _rescale(w, pair, k)
    return model, len(pairs)
