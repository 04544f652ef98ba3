"""A pulled capture folder as the build's calibration or gate set: its manifest's images only, and a
report that names the set and says how INT8 agrees with FP32 on it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgeinfer.errors import EdgeinferError
from edgeinfer.model.build import BuildOptions, build
from edgeinfer.model.field import FIELD_MANIFEST, FieldRecord, FieldSet
from edgeinfer.model.gate import Thresholds

pytest.importorskip("onnxruntime")
pytest.importorskip("skimage")

FAST: dict[str, Any] = {"calibration_per_photo": 4, "validation_per_photo": 2, "min_calibration": 4}


def field_folder(folder: Path, count: int, things: tuple[str, ...] = ("cam-a", "cam-b")) -> FieldSet:
    """A folder as `edgeinfer capture pull` leaves it: images, documents, the manifest."""
    import cv2

    records = []
    for i in range(count):
        thing = things[i % len(things)]
        rel = f"{thing}/tiny/1.0.0/2026/01/01/{1_767_225_600_000 + i:013d}-r{i}-00"
        image = np.random.default_rng(i).integers(0, 256, (30 + i, 40, 3), dtype=np.uint8)
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(folder / f"{rel}.jpg"), image)
        (folder / f"{rel}.json").write_text('{"reason": "random"}')
        records.append(
            FieldRecord(
                id=rel.rsplit("/", 1)[1],
                key=f"edgeinfer-capture/{rel}",
                thing=thing,
                model="tiny",
                version="1.0.0",
                captured_at="2026-01-01T00:00:00.000Z",
                image=f"{rel}.jpg",
                document=f"{rel}.json",
                bytes=1,
            )
        )
    field_set = FieldSet(folder, records, [{"group": "cams"}])
    field_set.save()
    return field_set


def _options(tiny_onnx: Path, out: Path, **kw: Any) -> BuildOptions:
    return BuildOptions(onnx=tiny_onnx, out=out, thresholds=Thresholds(0.0, 0.0, 0.0), **{**FAST, **kw})


def test_a_plain_folder_is_not_a_field_set_and_a_broken_manifest_says_so(tmp_path: Path) -> None:
    assert FieldSet.load(tmp_path) is None
    (tmp_path / FIELD_MANIFEST).write_text('{"format": "something else"}')
    with pytest.raises(EdgeinferError, match=rf"^capture folder {tmp_path}: {FIELD_MANIFEST} does not read"):
        FieldSet.load(tmp_path)


def test_calibrating_on_a_field_set_reports_int8_on_its_images(tmp_path: Path, tiny_onnx: Path) -> None:
    field = tmp_path / "field"
    field_folder(field, 6)
    manifest = build(_options(tiny_onnx, tmp_path / "store", calibration=field), quiet=True)
    assert manifest.quantization["calibration_skipped"] == 0  # the documents are not counted as images
    assert manifest.calibration_size == 6 * FAST["calibration_per_photo"] // 4
    [entry] = manifest.validation["field_sets"]
    assert entry["role"] == "calibration"
    assert entry["held_out"] is False
    assert (entry["folder"], entry["records"], entry["records_used"]) == (str(field), 6, 6)
    assert entry["things"] == ["cam-a", "cam-b"]
    assert entry["models"] == ["tiny 1.0.0"]
    assert set(entry["agreement"]) == {"int8-cpu", "int8-tensorrt"}
    assert entry["agreement"]["int8-cpu"]["count"] == 6  # each field image once, as the device saw it
    assert 0.0 <= entry["agreement"]["int8-cpu"]["top1"] <= 1.0


def test_a_field_set_as_the_gates_set_is_judged_and_named(tmp_path: Path, tiny_onnx: Path) -> None:
    field = tmp_path / "field"
    field_folder(field, 9)
    manifest = build(_options(tiny_onnx, tmp_path / "store", validation=field), quiet=True)
    assert manifest.validation_size == 9
    [entry] = manifest.validation["field_sets"]
    assert entry["role"] == "gate"
    assert entry["held_out"] is True
    assert entry["agreement"]["int8-cpu"] == manifest.validation["variants"]["int8-cpu"]["final"]
    assert entry["agreement"]["int8-cpu"]["count"] == 9

    both = build(_options(tiny_onnx, tmp_path / "store2", calibration=field, validation=field), quiet=True)
    [entry] = both.validation["field_sets"]  # the one folder, reported once
    assert entry["role"] == "gate"
    assert entry["held_out"] is False


def test_a_broken_field_manifest_stops_the_build_in_one_line(tmp_path: Path, tiny_onnx: Path) -> None:
    field = tmp_path / "field"
    field_folder(field, 6)
    (field / FIELD_MANIFEST).write_text("{")
    with pytest.raises(EdgeinferError, match="does not read"):
        build(_options(tiny_onnx, tmp_path / "store", calibration=field), quiet=True)
    assert not (tmp_path / "store").exists()


def test_a_detector_calibrated_on_a_field_set_reports_boxes_agreement(tmp_path: Path) -> None:
    import onnx

    from tests.helpers.tiny_detector import make_tiny_detector

    source = tmp_path / "tiny-detector.onnx"
    onnx.save(make_tiny_detector("objectness"), str(source))
    field = tmp_path / "field"
    field_folder(field, 6)
    manifest = build(
        BuildOptions(
            onnx=source,
            task="detection",
            out=tmp_path / "store",
            calibration=field,
            thresholds=Thresholds(min_precision=0.0, min_recall=0.0, min_mean_iou=0.0),
            **FAST,
        ),
        quiet=True,
    )
    [entry] = manifest.validation["field_sets"]
    assert entry["role"] == "calibration"
    figures = entry["agreement"]["int8-cpu"]
    assert figures["images"] == 6  # each field image once, letterboxed as the device does
    assert {"precision", "recall", "mean_iou"} <= set(figures)
