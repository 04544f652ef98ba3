"""bench/gpu/check.py off a GPU: its TensorRT starts run, and call nothing TensorRT-backed that is not."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from edgeinfer.model.manifest import Manifest
from tests.helpers import PROJECT


def gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", PROJECT / "bench" / "gpu" / "check.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tensorrt_starts_without_tensorrt_are_not_tensorrt_backed(tiny_store: Path, tmp_path: Path) -> None:
    check = gpu_check()
    for fp16, int8 in ((True, False), (True, True)):
        row = check.trt_starts(Manifest.load(tiny_store), str(tmp_path), 8, fp16=fp16, int8=int8)
        assert row["first"]["backed"] is False
        assert row["first"]["why"] == "ONNX Runtime fell back to CPUExecutionProvider"
        assert row["built_then_reused"] is False
