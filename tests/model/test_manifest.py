from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgeinfer.errors import EdgeinferError
from edgeinfer.model import samples
from edgeinfer.model.manifest import (
    CPU,
    CUDA,
    TENSORRT,
    Manifest,
    ManifestError,
    Preprocessing,
    TensorSpec,
    Variant,
    default_store_dir,
    sha256_file,
)


def _store(tmp_path: Path) -> Manifest:
    files = {"model_fp32.onnx": b"fp32", "model_int8_cpu.onnx": b"int8cpu", "model_int8_trt.onnx": b"trt"}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "labels.json").write_text(json.dumps(["a", "b"]))

    def variant(file: str, name: str, precision: str, providers: list[str]) -> Variant:
        path = tmp_path / file
        return Variant(file, precision, providers, sha256_file(path), path.stat().st_size, name=name)

    manifest = Manifest(
        name="efficientnet-lite0",
        version="0.1.0",
        inputs=[TensorSpec("images", "uint8", ["N", "H", "W", 3])],
        outputs=[TensorSpec("logits", "float32", ["N", 1000])],
        preprocessing=Preprocessing(),
        labels_file="labels.json",
        variants=[
            variant("model_int8_cpu.onnx", "int8-cpu", "int8", [CPU]),
            variant("model_int8_trt.onnx", "int8-tensorrt", "int8", [TENSORRT]),
            variant("model_fp32.onnx", "fp32", "fp32", [CUDA, TENSORRT, CPU]),
        ],
    )
    manifest.save(tmp_path)
    return manifest


def test_round_trip_and_variant_choice(tmp_path: Path) -> None:
    _store(tmp_path)
    assert not list(tmp_path.glob(".manifest.*")), "temp file left behind"
    manifest = Manifest.load(tmp_path)
    assert manifest.root == tmp_path
    assert manifest.variant_for(CPU).name == "int8-cpu"
    assert manifest.variant_for(TENSORRT).name == "int8-tensorrt"
    assert manifest.variant_for(CUDA).name == "fp32"
    assert manifest.fp32.file == "model_fp32.onnx"
    assert manifest.path(manifest.fp32) == tmp_path / "model_fp32.onnx"
    assert manifest.labels() == ["a", "b"]
    assert json.loads((tmp_path / "manifest.json").read_text())["labels"] == "labels.json"
    assert manifest.preprocessing.preferred_input == [256, 256]
    assert manifest.inputs[0].shape == ["N", "H", "W", 3]
    manifest.verify()
    with pytest.raises(ManifestError, match="no variant for"):
        manifest.variant_for("OpenVINOExecutionProvider")


def test_verify_detects_tampering(tmp_path: Path) -> None:
    _store(tmp_path)
    (tmp_path / "model_fp32.onnx").write_bytes(b"FP32")  # same size, other bytes
    with pytest.raises(ManifestError, match="sha256"):
        Manifest.load(tmp_path).verify()
    (tmp_path / "model_fp32.onnx").write_bytes(b"longer")
    with pytest.raises(ManifestError, match="bytes"):
        Manifest.load(tmp_path).verify()


def test_load_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(EdgeinferError, match="no model store"):
        Manifest.load(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(EdgeinferError) as info:
        Manifest.load(tmp_path)
    assert "\n" not in str(info.value)


def test_preprocessing_for_size() -> None:
    pre = Preprocessing.for_size(260)
    assert pre.preferred_input == [297, 297]
    assert pre.interpolation == "linear"


def test_default_store_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EDGEINFER_ARTIFACTS", str(tmp_path))
    assert default_store_dir(version="9.9") == tmp_path / "com.edgeinfer.ModelStore" / "9.9"


def test_samples_bundled() -> None:
    images = samples.sample_images()
    assert len(images) >= 4
    assert samples.cat_image() in images
    assert all(p.stat().st_size < 200_000 for p in images)


def test_the_manifest_names_its_task(tmp_path: Path) -> None:
    import json

    from edgeinfer.model.manifest import DetectionSpec, Manifest, ManifestError, Preprocessing, TensorSpec

    manifest = Manifest(
        name="det",
        version="1",
        inputs=[TensorSpec("images", "uint8", ["N", "H", "W", 3])],
        outputs=[
            TensorSpec("boxes", "float32", ["N", "A", 4]),
            TensorSpec("scores", "float32", ["N", "A", 2]),
        ],
        preprocessing=Preprocessing(resize="letterbox", size=32),
        labels_file="labels.json",
        variants=[],
        task="detection",
        detection=DetectionSpec(layout="anchor_free", score_threshold=0.3),
    )
    manifest.save(tmp_path)
    loaded = Manifest.load(tmp_path)
    assert loaded.task == "detection"
    assert loaded.is_detector
    assert loaded.detection == DetectionSpec(layout="anchor_free", score_threshold=0.3)
    assert loaded.preprocessing.resize == "letterbox"
    doc = json.loads((tmp_path / "manifest.json").read_text())
    assert doc["task"] == "detection"
    del doc["task"], doc["detection"]  # a manifest written before tasks: a classifier
    (tmp_path / "manifest.json").write_text(json.dumps(doc))
    old = Manifest.load(tmp_path)
    assert old.task == "classification"
    assert old.detection is None
    doc["task"] = "segmentation"
    (tmp_path / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(ManifestError, match="unknown task 'segmentation'"):
        Manifest.load(tmp_path)
