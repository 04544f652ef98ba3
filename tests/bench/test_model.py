"""`bench model` on a tiny bring-your-own detector store: every row, the gate figures, the post step."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeinfer_bench.model import run_bench, table
from tests.helpers.tiny_detector import build_tiny_detector_store

pytest.importorskip("skimage")


@pytest.fixture(scope="module")
def detector_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_detector_store(tmp_path_factory.mktemp("bench-detector"))


def test_bench_model_on_a_detector_store(detector_store: Path) -> None:
    report = run_bench(detector_store, rounds=1, runs=2, threads=1)
    assert report["task"] == "detection"
    assert "letterboxed" in report["inputs"]
    rows = report["variants"]
    assert {"fp32", "int8-cpu", "int8-tensorrt", "int8-cpu-naive"} <= set(rows)
    assert rows["fp32"]["speedup_b1"] == 1.0
    held = rows["int8-cpu"]["agreement_held_out"]
    assert {"precision", "recall", "mean_iou"} <= set(held)
    assert {"precision", "recall", "mean_iou"} <= set(rows["int8-cpu"]["agreement_bench_inputs"])
    post = report["post_step"]
    assert post["numpy_ms_per_image"] > 0
    assert post["onnx_nms_ms_per_image"] > 0
    text = table(report)
    assert "prec" in text
    assert "post step per image" in text
