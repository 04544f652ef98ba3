"""The whole pipeline on a tiny user model (`--onnx`), and its bad-input paths through the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgeinfer import __version__, procfs
from edgeinfer.cli import main
from edgeinfer.errors import EdgeinferError, GateFailedError
from edgeinfer.model.build import BuildOptions, build, build_hash
from edgeinfer.model.gate import Thresholds
from edgeinfer.model.manifest import CPU, CUDA, TENSORRT, Manifest
from tests.test_procfs import EPYC_AVX2, PI4, XEON_VNNI

pytest.importorskip("onnxruntime")
pytest.importorskip("skimage")

NO_GATE = Thresholds(0.0, 0.0, 0.0)
FAST = {"calibration_per_photo": 2, "validation_per_photo": 2, "min_calibration": 4}


def _options(tiny_onnx: Path, out: Path, **kw: Any) -> BuildOptions:
    return BuildOptions(onnx=tiny_onnx, out=out, thresholds=kw.pop("thresholds", NO_GATE), **{**FAST, **kw})


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_build_user_onnx(tmp_path: Path, tiny_onnx: Path) -> None:
    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join(f"thing {i}" for i in range(5)))
    out = tmp_path / "store"
    manifest = build(_options(tiny_onnx, out, labels=labels), quiet=True)
    assert manifest.root == out
    loaded = Manifest.load(out)
    loaded.verify()
    assert loaded.labels() == [f"thing {i}" for i in range(5)]
    assert [v.name for v in loaded.variants] == ["int8-cpu", "int8-tensorrt", "fp32"]
    assert loaded.variant_for(CPU).name == "int8-cpu"
    assert loaded.variant_for(TENSORRT).name == "int8-tensorrt"
    assert loaded.variant_for(CUDA).name == "fp32"
    assert loaded.inputs[0].dtype == "uint8"
    assert loaded.inputs[0].shape == ["N", "H", "W", 3]
    assert loaded.preprocessing.size == 8
    assert loaded.quantization["uint8_input_dequantize"] is True
    assert loaded.calibration_size > 0
    assert loaded.validation_size > 0
    report = loaded.validation["variants"]["int8-cpu"]
    assert {"plain", "bias_corrected", "final"} <= set(report)
    assert loaded.tools["onnxruntime"]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["manifest.json", "labels.json", "model_fp32.onnx", "model_int8_cpu.onnx", "model_int8_tensorrt.onnx"]
    )
    assert _leftovers(tmp_path) == ["labels.txt", "store", "tiny.onnx"]

    # every published graph takes uint8 NHWC of any size and batch
    import onnxruntime as ort

    images = np.random.default_rng(0).integers(0, 256, (3, 20, 14, 3), dtype=np.uint8)
    for variant in loaded.variants:
        sess = ort.InferenceSession(str(loaded.path(variant)), providers=[CPU])
        assert sess.run(None, {"images": images})[0].shape == (3, 5)

    # same inputs: cached, nothing rebuilt
    again = build(_options(tiny_onnx, out, labels=labels), quiet=True)
    assert again.created == loaded.created
    assert again.source["build_hash"] == build_hash(_options(tiny_onnx, out, labels=labels))


def test_build_fp32_only(tmp_path: Path, tiny_onnx: Path) -> None:
    manifest = build(_options(tiny_onnx, tmp_path / "s", int8=False), quiet=True)
    assert [v.name for v in manifest.variants] == ["fp32"]
    assert manifest.variant_for(CPU).precision == "fp32"


def test_failed_gate_leaves_nothing(tmp_path: Path, tiny_onnx: Path) -> None:
    out = tmp_path / "store"
    strict = Thresholds(max_mean_abs_logit_delta=1e-9)  # INT8 is never that close to FP32
    with pytest.raises(GateFailedError, match=r"mean \|Δlogit\| \d+\.\d+ > 0\.000"):
        build(_options(tiny_onnx, out, thresholds=strict, sensitivity="off"), quiet=True)
    assert _leftovers(tmp_path) == ["tiny.onnx"]


@pytest.mark.parametrize(
    ("machine", "cpuinfo"), [("x86_64", EPYC_AVX2), ("x86_64", XEON_VNNI), ("aarch64", PI4)]
)
def test_the_cpu_variant_is_judged_as_the_devices_it_is_meant_for_compute_it(
    tmp_path: Path, tiny_onnx: Path, monkeypatch: pytest.MonkeyPatch, machine: str, cpuinfo: str
) -> None:
    host = procfs.int8_saturating_host(machine, cpuinfo)
    monkeypatch.setattr(procfs, "saturating_int8_here", lambda proc=procfs.PROC: host)
    manifest = build(_options(tiny_onnx, tmp_path / "store", sensitivity="off"), quiet=True)
    report = manifest.validation
    u8 = report["variants"]["int8-cpu"]
    assert report["build_host_int8"] == (host or "exact")
    # on a host whose U8S8 kernels saturate: the unfused QDQ graph in float, and the host's own figures
    assert ("evaluated_as" in u8, "host_kernels" in u8) == (host is not None, host is not None)
    if host is not None:
        assert "unfused" in u8["evaluated_as"]
    assert "evaluated_as" not in report["variants"]["int8-tensorrt"]  # a classifier's: reported as run
    assert manifest.variant("int8-cpu").saturates_on == [procfs.SATURATING_INT8]
    assert manifest.variant("fp32").saturates_on == []


def test_calibration_folder_skips_and_counts(tmp_path: Path, tiny_onnx: Path) -> None:
    import cv2

    folder = tmp_path / "calib"
    folder.mkdir()
    for i in range(3):
        image = np.random.default_rng(i).integers(0, 256, (40, 50, 3), dtype=np.uint8)
        cv2.imwrite(str(folder / f"img{i}.png"), image)
    (folder / "notes.txt").write_text("not an image")
    (folder / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    manifest = build(
        _options(tiny_onnx, tmp_path / "store", calibration=folder, min_calibration=3), quiet=True
    )
    assert manifest.quantization["calibration_skipped"] == 2
    with pytest.raises(EdgeinferError, match="too few usable images: 3 < 50"):
        build(_options(tiny_onnx, tmp_path / "store2", calibration=folder, min_calibration=50), quiet=True)
    assert not (tmp_path / "store2").exists()


# ------------------------------------------------------------------------------------ CLI bad input


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["model", "build", "--quiet", *args])
    err = capsys.readouterr().err.strip()
    return code, err


def _one_line(err: str) -> str:
    err = err.strip()
    assert "\n" not in err, err
    assert "Traceback" not in err
    assert err.startswith("edgeinfer: error: ")
    return err


@pytest.mark.parametrize(
    ("make", "expect"),
    [
        (lambda d: d / "missing.onnx", "does not exist"),
        (
            lambda d: (d / "corrupt.onnx").write_bytes(b"\x00garbage" * 10) and d / "corrupt.onnx",
            "not a valid ONNX",
        ),
    ],
)
def test_cli_bad_model_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Any, expect: str
) -> None:
    path = make(tmp_path)
    out = tmp_path / "out"
    code, err = _cli(["--onnx", str(path), "--out", str(out)], capsys)
    assert code != 0
    assert expect in _one_line(err)
    assert not out.exists()


def test_cli_non_image_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tiny_classifier: Any
) -> None:
    import onnx

    path = tmp_path / "vector.onnx"
    model = tiny_classifier(input_shape=["N", 3, 8])
    onnx.save(model, str(path))
    code, err = _cli(["--onnx", str(path), "--out", str(tmp_path / "out")], capsys)
    assert code != 0
    assert "image tensor" in _one_line(err) or "not a valid ONNX" in err
    assert not (tmp_path / "out").exists()


def test_cli_empty_calibration_dir(
    tmp_path: Path, tiny_onnx: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "out"
    code, err = _cli(["--onnx", str(tiny_onnx), "--calibration", str(empty), "--out", str(out)], capsys)
    assert code != 0
    assert "too few usable images: 0" in _one_line(err)
    assert not out.exists()
    assert _leftovers(tmp_path) == ["empty", "tiny.onnx"]


def test_cli_failed_gate(tmp_path: Path, tiny_onnx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code, err = _cli(
        ["--onnx", str(tiny_onnx), "--out", str(out), "--max-logit-delta", "1e-9", "--sensitivity", "off"],
        capsys,
    )
    assert code == GateFailedError.exit_code
    assert "accuracy gate failed" in _one_line(err)
    assert not out.exists()


def test_cli_says_when_the_store_is_not_the_one_the_bundle_ships(
    tmp_path: Path, tiny_onnx: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "mine"
    gates = ["--min-top1", "0", "--min-top1-confident", "0", "--min-top5", "0"]
    artifacts = ["--artifacts", str(tmp_path / "artifacts")]
    code, err = _cli(["--onnx", str(tiny_onnx), "--out", str(out), *artifacts, *gates], capsys)
    assert code == 0
    shipped = tmp_path / "artifacts" / "com.edgeinfer.ModelStore" / __version__
    assert err.splitlines() == [
        f"note: `edgeinfer build` ships {shipped}, not this store; to deploy this model, build it "
        f"with --out {shipped}, or set the runtime's modelDir to this folder on the device"
    ]


def test_model_info_names_the_folder_it_looked_in(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "info", "--store", str(tmp_path / "nowhere")]) == 2
    assert f"no model store at {tmp_path / 'nowhere'} (missing manifest.json" in _one_line(
        capsys.readouterr().err
    )
    (tmp_path / "manifest.json").write_text('{"name": "x"}')
    assert main(["model", "info", "--store", str(tmp_path)]) == 2
    err = _one_line(capsys.readouterr().err)
    assert f"{tmp_path / 'manifest.json'}: malformed manifest: missing key" in err


def test_cli_impossible_gates_are_refused_before_building(
    tmp_path: Path, tiny_onnx: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "a" / "out"
    for flag, value in (
        ("--min-top1", "5"),
        ("--min-top5", "-0.1"),
        ("--max-exclude", "-4"),
        ("--size", "-5"),
    ):
        code, err = _cli(["--onnx", str(tiny_onnx), "--out", str(out), flag, value], capsys)
        assert code == 2
        assert flag in _one_line(err)
    assert _leftovers(tmp_path) == ["tiny.onnx"]


def test_a_store_of_an_older_manifest_schema_is_rebuilt(
    tmp_path: Path, tiny_onnx: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "store"
    out.mkdir()
    (out / "manifest.json").write_text('{"name": "tiny", "variants": []}')  # no version: an old schema
    (out / "model_fp32.onnx").write_bytes(b"old")
    gates = ["--min-top1", "0", "--min-top1-confident", "0", "--min-top5", "0"]
    code, _ = _cli(["--onnx", str(tiny_onnx), "--out", str(out), *gates], capsys)
    assert code == 0
    assert (out / "model_fp32.onnx").read_bytes() != b"old"


@pytest.mark.parametrize(
    "files",
    [
        {"notes.txt": "mine"},
        # A web app's manifest.json is not a store's.
        {"manifest.json": '{"name": "My App", "start_url": "/"}', "index.html": "<html></html>"},
    ],
)
def test_a_folder_that_is_not_a_store_is_never_replaced(
    tmp_path: Path, tiny_onnx: Path, capsys: pytest.CaptureFixture[str], files: dict[str, str]
) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    for name, text in files.items():
        (out / name).write_text(text)
    code, err = _cli(["--onnx", str(tiny_onnx), "--out", str(out)], capsys)
    assert code == 2
    assert "refusing to replace" in _one_line(err)
    assert {p.name: p.read_text() for p in out.iterdir()} == files


def test_cli_build_info_classify(tmp_path: Path, tiny_onnx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from edgeinfer.model import samples

    out = tmp_path / "out"
    code = main(["model", "build", "--quiet", "--onnx", str(tiny_onnx), "--out", str(out), "--min-top1", "0",
                 "--min-top1-confident", "0", "--min-top5", "0"])  # fmt: skip
    assert code == 0
    capsys.readouterr()
    assert main(["model", "info", "--store", str(out), "--verify"]) == 0
    assert "verified" in capsys.readouterr().out
    assert main(["model", "classify", "--store", str(out), "--json", str(samples.cat_image())]) == 0
    result = json.loads(capsys.readouterr().out.splitlines()[0])
    assert len(result["predictions"]) == 5
    assert result["provider"] == CPU
    assert result["model"]["variant"] == "int8-cpu"
    code = main(["model", "classify", "--store", str(out), str(tmp_path / "nope.jpg")])
    assert code != 0
    assert "does not exist" in _one_line(capsys.readouterr().err)
    code = main(["model", "info", "--store", str(tmp_path / "nowhere")])
    assert code != 0
    assert "no model store" in _one_line(capsys.readouterr().err)


def test_bench_model_on_tiny_store(
    tmp_path: Path, tiny_onnx: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "store"
    build(_options(tiny_onnx, out), quiet=True)
    report_path = tmp_path / "bench" / "model.json"
    code = main(
        ["bench", "model", "--store", str(out), "--rounds", "1", "--runs", "4", "--json", str(report_path)]
    )
    assert code == 0
    table = capsys.readouterr().out
    assert "int8-cpu" in table
    assert "fp32" in table
    report = json.loads(report_path.read_text())
    assert report["scenario"] == "model"
    assert set(report["variants"]) == {"fp32", "int8-cpu", "int8-tensorrt", "int8-cpu-naive"}
    for figures in report["variants"].values():
        for key in (
            "session_create_ms",
            "first_run_ms",
            "b1_median_ms",
            "b1_p99_ms",
            "b8_median_ms",
            "b8_p99_ms",
        ):
            assert figures[key] > 0
        assert figures["speedup_b1"] > 0
        assert 0 <= figures["agreement_bench_inputs"] <= 1
    assert report["variants"]["fp32"]["speedup_b1"] == 1.0
    assert "agreement_held_out" in report["variants"]["int8-cpu"]
    # the reference row computes exactly what int8-cpu computes, only slower
    assert report["variants"]["int8-cpu-naive"]["agreement_bench_inputs"] == 1.0


def test_build_with_equalization_and_sensitivity(tmp_path: Path, tiny_onnx: Path) -> None:
    manifest = build(
        _options(tiny_onnx, tmp_path / "s", equalize=True, sensitivity="always", max_exclude=1), quiet=True
    )
    assert manifest.quantization["equalized_pairs"] == 2
    sens = manifest.validation["variants"]["int8-cpu"]["sensitivity"]
    assert len(sens["excluded"]) == 1
    assert {"before", "after", "ranking", "kept"} <= set(sens)


def test_build_with_torchvision_normalisation(tmp_path: Path, tiny_onnx: Path) -> None:
    """Per-channel float mean/std: no uint8 shortcut, float normalisation in every graph."""
    options = _options(
        tiny_onnx,
        tmp_path / "s",
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
        channel_order="BGR",
    )
    manifest = build(options, quiet=True)
    assert manifest.quantization["uint8_input_dequantize"] is False
    assert manifest.preprocessing.mean == [123.675, 116.28, 103.53]
    assert manifest.preprocessing.channel_order == "BGR"
    import onnx

    ops = {n.op_type for n in onnx.load(str(manifest.path(manifest.variant("int8-cpu")))).graph.node}
    assert {"Sub", "Mul", "QuantizeLinear"} <= ops


def test_cli_labels_must_match_classes(
    tmp_path: Path, tiny_onnx: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps(["a", "b"]))
    out = tmp_path / "out"
    code, err = _cli(["--onnx", str(tiny_onnx), "--labels", str(labels), "--out", str(out)], capsys)
    assert code != 0
    assert "has 2 labels but the model has 5 classes" in _one_line(err)
    assert not out.exists()


def test_the_build_lock_is_the_folder_itself(tmp_path: Path) -> None:
    import fcntl
    import os

    from edgeinfer.model.build import _lock

    def try_lock() -> bool:
        fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        finally:
            os.close(fd)  # closing the descriptor drops a lock it took
        return True

    with _lock(tmp_path):
        assert not try_lock()  # another builder waits
    assert try_lock()
    assert list(tmp_path.iterdir()) == []  # and no lock file is left anywhere


# ------------------------------------------------------------------------------------------ detectors


@pytest.fixture(scope="module", params=["objectness", "anchor_free"])
def tiny_detector_store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bring-your-own detector in each export layout, built through the whole pipeline."""
    from tests.helpers.tiny_detector import build_tiny_detector_store

    return build_tiny_detector_store(tmp_path_factory.mktemp(f"byo-{request.param}"), request.param)


def test_a_bring_your_own_detector_is_built_in_its_layout(tiny_detector_store: Path) -> None:
    manifest = Manifest.load(tiny_detector_store)
    manifest.verify()
    assert manifest.task == "detection"
    assert manifest.detection is not None
    assert manifest.detection.layout in tiny_detector_store.parent.name
    assert manifest.preprocessing.resize == "letterbox"
    assert manifest.preprocessing.size == 32
    assert [o.name for o in manifest.outputs] == ["boxes", "scores"]
    assert [v.name for v in manifest.variants] == ["int8-cpu", "int8-tensorrt", "fp32"]
    assert manifest.labels() == ["square", "round"]
    final = manifest.validation["variants"]["int8-cpu"]["final"]
    assert {"precision", "recall", "mean_iou", "matched"} <= set(final)
    assert manifest.validation["passed"] is True
    assert "head" in manifest.quantization["exclude_nodes"]  # the head and its tail stay in float


def test_a_built_detector_is_served_with_boxes_in_each_images_pixels(tiny_detector_store: Path) -> None:
    """Mixed image sizes in one batch, defaults and per-request overrides, DLR's shape, bad input."""
    import base64

    from edgeinfer.messages import ErrorCode, Result
    from edgeinfer.runtime.config import RuntimeConfig
    from edgeinfer.runtime.engine import Engine
    from edgeinfer.runtime.server import InferenceServer
    from edgeinfer.transport import MemoryBus
    from tests.helpers.images import solid_jpeg, solid_png
    from tests.helpers.tiny_detector import expected_boxes
    from tests.helpers.wait import eventually

    cfg = RuntimeConfig(max_batch_size=4, max_queue_size=16, max_payload_bytes=64 * 1024)
    engine = Engine.create(Manifest.load(tiny_detector_store), cfg, str(tiny_detector_store.parent / "work"))
    engine.warm_up(runs=1)
    bus = MemoryBus()
    server = InferenceServer(bus, engine, cfg, "det1")
    server.start()
    try:
        sizes = {"wide": (200, 100), "tall": (60, 180), "square": (64, 64)}
        for name, (w, h) in sizes.items():
            image = base64.b64encode(solid_jpeg((255, 255, 255), size=(w, h))).decode()
            bus.publish("edgeinfer/det1/infer", json.dumps({"id": name, "image": image}).encode())
        one = base64.b64encode(solid_png((255, 255, 255), size=(64, 64))).decode()
        bus.publish(
            "edgeinfer/det1/infer",
            json.dumps({"id": "one", "image": one, "max_detections": 1, "result_format": "dlr"}).encode(),
        )
        bus.publish(
            "edgeinfer/det1/infer", json.dumps({"id": "none", "image": one, "score_threshold": 0.99}).encode()
        )
        bus.publish("edgeinfer/det1/infer", json.dumps({"id": "bad", "image": "bm90IGFuIGltYWdl"}).encode())
        bus.publish(
            "edgeinfer/det1/infer", json.dumps({"id": "k", "image": one, "max_detections": 0}).encode()
        )

        def answers() -> dict[str, Any]:
            return {
                json.loads(m.payload)["id"]: json.loads(m.payload)
                for m in bus.messages_on("edgeinfer/det1/result")
            }

        eventually(lambda: len(answers()) == 7)
        got = answers()
        for name, (w, h) in sizes.items():
            result = Result.from_dict(got[name])
            assert result.status == "ok"
            assert result.predictions == []
            assert result.detections is not None
            assert sorted(d.label for d in result.detections) == ["round", "round", "square", "square"]
            boxes = np.array(
                [[d.box.x_min, d.box.y_min, d.box.x_max, d.box.y_max] for d in result.detections]
            )
            want = expected_boxes(w, h)
            for box in boxes:  # each answer is one of the four, within a pixel of the source's scale
                assert np.abs(want - box).max(axis=1).min() <= max(w, h) / 32 + 1
        assert len(got["one"]["inference-results"]) == 1
        assert got["one"]["inference-type"] == "object-detection"
        assert got["none"]["detections"] == []
        assert got["bad"]["error"]["code"] == ErrorCode.BAD_IMAGE.value
        assert got["k"]["error"]["code"] == ErrorCode.BAD_REQUEST.value
    finally:
        server.stop()


def test_an_unknown_detector_layout_is_refused_in_one_line(
    tmp_path: Path, tiny_onnx: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["model", "build", "--onnx", str(tiny_onnx), "--task", "detection", "--out", str(tmp_path / "s")]
    )
    assert code != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "unknown detector output layout" in err
    assert not (tmp_path / "s").exists()


def test_a_folder_source_on_a_detector_publishes_boxes_per_frame(
    tiny_detector_store: Path, tmp_path: Path
) -> None:
    from edgeinfer.messages import Result
    from edgeinfer.runtime.config import RuntimeConfig, SourceConfig
    from edgeinfer.runtime.engine import Engine
    from edgeinfer.runtime.server import InferenceServer
    from edgeinfer.runtime.sources import SourceRunner
    from edgeinfer.transport import MemoryBus
    from tests.helpers.images import solid_jpeg
    from tests.helpers.tiny_detector import expected_boxes
    from tests.helpers.wait import eventually

    frames = tmp_path / "frames"
    frames.mkdir()
    (frames / "a.jpg").write_bytes(solid_jpeg((255, 255, 255), size=(160, 80)))
    (frames / "b.jpg").write_bytes(solid_jpeg((0, 0, 0), size=(96, 96)))  # square: no grey bands
    cfg = RuntimeConfig(max_batch_size=2)
    engine = Engine.create(Manifest.load(tiny_detector_store), cfg, str(tmp_path / "work"))
    bus = MemoryBus()
    server = InferenceServer(bus, engine, cfg, "cam1")
    server.start()
    runner = SourceRunner(
        # looped: a frame that comes while the one before is in flight is dropped (latest wins), so
        # the test waits until each image has been served at least once, however slow the machine
        SourceConfig(kind="folder", uri=str(frames), rate_hz=50, loop=True),
        server,
        "cam1",
        engine.input_size,
        letterboxed=True,
    )

    def served() -> list[Result]:
        return [Result.parse(m.payload) for m in bus.messages_on("edgeinfer/cam1/result")]

    try:
        runner.start()
        eventually(lambda: {bool(r.detections) for r in served()} == {True, False})
    finally:
        runner.stop()
        server.stop()
    white = next(r for r in served() if r.detections)
    black = next(r for r in served() if not r.detections)
    assert white.detections is not None
    assert len(white.detections) == 4
    want = expected_boxes(160, 80)
    for d in white.detections:
        box = np.array([d.box.x_min, d.box.y_min, d.box.x_max, d.box.y_max])
        assert np.abs(want - box).max(axis=1).min() <= 6
    assert black.detections == []


def test_configured_detection_defaults_apply_when_the_request_leaves_them_out(
    tiny_detector_store: Path, tmp_path: Path
) -> None:
    import base64

    from edgeinfer.runtime.config import RuntimeConfig
    from edgeinfer.runtime.engine import Engine
    from edgeinfer.runtime.server import InferenceServer
    from edgeinfer.transport import MemoryBus
    from tests.helpers.images import solid_jpeg
    from tests.helpers.wait import eventually

    cfg = RuntimeConfig(max_batch_size=2, max_detections=2)
    engine = Engine.create(Manifest.load(tiny_detector_store), cfg, str(tmp_path / "work"))
    bus = MemoryBus()
    server = InferenceServer(bus, engine, cfg, "det2")
    server.start()
    image = base64.b64encode(solid_jpeg((255, 255, 255), size=(64, 64))).decode()
    try:
        bus.publish("edgeinfer/det2/infer", json.dumps({"id": "dflt", "image": image}).encode())
        bus.publish(
            "edgeinfer/det2/infer", json.dumps({"id": "own", "image": image, "max_detections": 3}).encode()
        )
        eventually(lambda: len(bus.messages_on("edgeinfer/det2/result")) == 2)
    finally:
        server.stop()
    got = {
        json.loads(m.payload)["id"]: json.loads(m.payload) for m in bus.messages_on("edgeinfer/det2/result")
    }
    assert len(got["dflt"]["detections"]) == 2
    assert len(got["own"]["detections"]) == 3


def test_every_bad_input_the_classifier_answers_with_a_code_a_detector_answers_alike(
    tiny_detector_store: Path, tmp_path: Path
) -> None:
    from edgeinfer.messages import Result
    from edgeinfer.runtime.config import RuntimeConfig
    from edgeinfer.runtime.engine import Engine
    from edgeinfer.runtime.server import InferenceServer
    from edgeinfer.transport import MemoryBus
    from tests.helpers.wait import eventually
    from tests.runtime.test_server import _bad_requests

    cfg = RuntimeConfig(max_batch_size=4, max_queue_size=16, max_payload_bytes=64 * 1024)
    engine = Engine.create(Manifest.load(tiny_detector_store), cfg, str(tmp_path / "work"))
    bus = MemoryBus()
    server = InferenceServer(bus, engine, cfg, "det3")
    server.start()
    cases = _bad_requests(tmp_path)
    try:
        for payload, _, _ in cases:
            bus.publish("edgeinfer/det3/infer", payload)
        eventually(lambda: len(bus.messages_on("edgeinfer/det3/result")) == len(cases))
    finally:
        server.stop()
    results = [Result.parse(m.payload) for m in bus.messages_on("edgeinfer/det3/result")]
    got = sorted(((r.id or "", r.error.code) for r in results if r.error), key=str)
    assert got == sorted(((rid or "", code) for _, rid, code in cases), key=str)
