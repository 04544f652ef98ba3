"""A tiny ONNX model (y = Relu(x), x: float32 [N, 4], opset 13) to prove a provider really runs.

Embedded as bytes so the installer needs neither the `onnx` package nor package data on the device.
`tests/installer/test_tiny_model.py` rebuilds it with `onnx` and checks it is the same graph.
"""

from __future__ import annotations

import base64
from pathlib import Path

TINY_MODEL_B64 = (
    "CAgSCWVkZ2VpbmZlcjpBCgwKAXgSAXkiBFJlbHUSBXByb2JlWhQKAXgSDwoNCAESCQoDEgFOCgIIBGIUCgF5Eg8KDQgBEgkKAxIB"
    "TgoCCARCBAoAEA0="
)


def tiny_model_bytes() -> bytes:
    return base64.b64decode(TINY_MODEL_B64)


def write_tiny_model(folder: Path) -> Path:
    path = folder / "edgeinfer-probe.onnx"
    path.write_bytes(tiny_model_bytes())
    return path
