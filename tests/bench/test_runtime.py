"""The runtime benchmark's helpers (the benchmark itself runs with `edgeinfer bench runtime`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from edgeinfer import __version__
from edgeinfer.cli import build_parser
from edgeinfer_bench.runtime import (
    CLIENT,
    COMPONENT,
    ECHO,
    RawPipeline,
    bench_images,
    combine_runs,
    floor_ratios,
    median_segment,
    prepare_device,
    running_ms_from_log,
    store_for,
    summary_lines,
    table_lines,
    verdict,
)


def test_log_parsing() -> None:
    log = "x\n2026 INFO edgeinfer.runtime: RUNNING 812 ms after process start: m 1 on CPU\n"
    assert running_ms_from_log(log) == 812.0
    assert running_ms_from_log("nothing") is None


def test_device_layout(tiny_store: Path, tmp_path: Path) -> None:
    recipes, artifacts = prepare_device(tmp_path / "dev", tiny_store)
    names = sorted(p.stem for p in recipes.glob("*.yaml"))
    assert COMPONENT in names
    assert CLIENT in names
    store = yaml.safe_load((recipes / "com.edgeinfer.ModelStore.yaml").read_text())
    files = {a["URI"].rsplit("/", 1)[1] for a in store["Manifests"][0]["Artifacts"]}
    assert "manifest.json" in files
    assert all((artifacts / "com.edgeinfer.ModelStore" / __version__ / f).is_file() for f in files)
    prepare_device(tmp_path / "dev", tiny_store)  # again: idempotent


def test_images() -> None:
    images = bench_images(3)
    assert all(img[:3] == b"\xff\xd8\xff" for img in images)


def test_registered_under_bench() -> None:
    args = build_parser().parse_args(["bench", "runtime", "--requests", "5", "--json", "x.json"])
    assert args.requests == 5
    assert args.json == "x.json"


def seg(rps: float, p50: float, p99: float, errors: int = 0) -> dict[str, float]:
    return {"saturated_rps": rps / 0.7, "rps": rps, "p50_ms": p50, "p99_ms": p99, "errors": errors}


def test_median_segment_ranks_failed_segments_worst() -> None:
    good, mid, bad = seg(140, 10, 15), seg(150, 10, 25), seg(145, 10, 60)
    assert median_segment([bad, good, mid]) is mid
    nothing = seg(150, math.nan, math.nan)  # no ok latencies at all
    errors = seg(150, 10, 12, errors=30)  # a fine tail, but what failed is not in it
    assert median_segment([nothing, good, errors]) in (nothing, errors)
    assert median_segment([nothing, good, mid]) is mid
    assert median_segment([good]) is good


def test_table_shows_the_median_segment_and_every_segment() -> None:
    segments = [seg(149, 21.3, 74.0), seg(142, 27.4, 139.5, errors=2), seg(107, 13.9, 24.8)]
    mid = median_segment(segments)
    stages = dict.fromkeys(("queue", "decode", "inference", "postprocess", "total"), 1.0)
    doc: dict[str, Any] = {
        "raw": {"provider": "CPUExecutionProvider", "variant": "int8-cpu", "p50_ms": 5.2,
                "batched_loop_rps": 257.0, "batched_loop_cpu_ms_per_image": 6.1},
        "runtime": {"provider": "CPUExecutionProvider", "variant": "int8-cpu", "local_p50_ms": 7.9,
                    "local_p99_ms": 14.6, "local_runtime_stages_p50_ms": stages, "ipc_hop_p50_ms": 1.3,
                    "iot_p50_ms": 8.6, "iot_p99_ms": 17.6, "saturated_rps": 228.0,
                    "saturated_mean_batch": 7.9,
                    "saturated_cpu_ms_per_request": {"runtime": 7.9, "nucleus_and_load_generator": 1.5},
                    "load70_rps": mid["rps"], "load70_p50_ms": mid["p50_ms"], "load70_p99_ms": mid["p99_ms"],
                    "load70_segments": segments,
                    "load70_poisson_p50_ms": 32.0, "load70_poisson_p99_ms": 142.0,
                    "start_to_running_ms": 850.0, "starts": 3, "first_request_ms": 9.6},
        "ratios": {"p50_ratio": 1.51, "iot_p50_ratio": 1.63, "throughput_ratio": 0.89,
                   "p99_over_p50_at_70pct": mid["p99_ms"] / mid["p50_ms"], "first_over_warm_p50": 1.21},
        "pass": {"p50_ratio": False},
    }  # fmt: skip
    text = "\n".join(table_lines(doc))
    assert mid["rps"] == 149  # the segment with errors ranks worst, so the median is the 3.47x one
    assert "21.30 / 74.00 ms at 149 req/s" in text
    assert "p99 3.47× p50 (≤ 2), median segment" in text
    assert "3.47× at 149, 5.09× at 142 (2 errors), 1.78× at 107" in text
    assert "echo" not in text  # recorded before the echo component existed
    doc["runtime"] |= {"echo_p50_ms": 2.9, "echo_p99_ms": 8.7}
    doc["ratios"] |= floor_ratios([5.2, 5.0, 5.4], [7.9, 8.1, 8.0], [2.9, 3.3, 2.4])
    text = "\n".join(table_lines(doc))
    assert "2.90 / 8.70 ms" in text
    assert "transport floor: raw + echo = 1.56× raw" in text
    assert "5.00 ms" in text  # the median of the paired differences 5.0, 4.8 and 5.6
    assert "0.96× raw (for information)" in text


def test_floor_ratios_pair_each_round() -> None:
    # The machine slows down halfway: a difference of medians would mix rounds, the pairs do not.
    raw, local, echo = [5.0, 5.0, 5.0, 5.0], [8.0, 8.0, 12.0, 12.0], [3.0, 3.0, 7.0, 7.0]
    got = floor_ratios(raw, local, echo)
    assert got["p50_ratio_floor"] == (5.0 + 5.0) / 5.0
    assert got["p50_ratio_beyond_transport"] == 1.0  # 5 ms beyond the echo in every round


def test_device_layout_with_the_echo(tiny_store: Path, tmp_path: Path) -> None:
    recipes, _ = prepare_device(tmp_path / "dev", tiny_store, echo=True)
    echo = yaml.safe_load((recipes / f"{ECHO}.yaml").read_text())
    assert echo["Manifests"][0]["Lifecycle"]["Run"].endswith(" -m edgeinfer_bench.echo")
    grants = echo["ComponentConfiguration"]["DefaultConfiguration"]["accessControl"][
        "aws.greengrass.ipc.pubsub"
    ]
    assert sorted(r for g in grants.values() for r in g["resources"]) == [
        "edgeinfer/{iot:thingName}/echo/infer",
        "edgeinfer/{iot:thingName}/echo/result",
    ]
    prepare_device(tmp_path / "dev", tiny_store)  # the same folder without it
    assert not (recipes / f"{ECHO}.yaml").exists()


def test_several_runs_are_judged_by_each_ratios_median() -> None:
    def run(p50: float, thr: float, tail: float) -> dict[str, Any]:
        ratios = {"p50_ratio": p50, "throughput_ratio": thr, "p99_over_p50_at_70pct": tail}
        return {"raw": {}, "runtime": {"local_p50_ms": p50}, "ratios": ratios, "pass": verdict(ratios)}

    runs = [run(1.45, 0.79, 2.09), run(1.43, 0.86, 7.57), run(1.48, 0.85, 2.38)]
    out = combine_runs(runs)
    assert out["ratios"] == {"p50_ratio": 1.45, "throughput_ratio": 0.85, "p99_over_p50_at_70pct": 2.38}
    assert out["ratio_ranges"]["throughput_ratio"] == [0.79, 0.86]
    assert out["pass"] == {"p50_ratio": False, "throughput_ratio": True, "p99_over_p50_at_70pct": False}
    assert out["runtime"] == {"local_p50_ms": 1.48}  # the last run's figures
    text = "\n".join(summary_lines(out))
    assert "over 3 runs (median, min-max):" in text
    assert "throughput_ratio         0.85 (0.79-0.86)  target ≥ 0.85 ✓  (met in 2 of 3)" in text
    assert "targets: missed: p50_ratio, p99_over_p50_at_70pct" in text


def test_runs_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    from edgeinfer.cli import main

    assert main(["bench", "runtime", "--runs", "0"]) == 2
    assert capsys.readouterr().err.strip() == "edgeinfer: error: --runs must be at least 1, not 0"


def test_the_detector_store_is_chosen_and_checked(tiny_store: Path, tmp_path: Path) -> None:
    from edgeinfer.errors import EdgeinferError
    from edgeinfer.model.build import BuildOptions

    args = build_parser().parse_args(["bench", "runtime", "--detector"])
    assert args.detector
    assert not build_parser().parse_args(["bench", "runtime"]).detector
    with pytest.raises(EdgeinferError, match="is a classification model"):
        store_for(str(tiny_store), detector=True)
    assert store_for(str(tiny_store))[0] == tiny_store
    with pytest.raises(EdgeinferError) as err:
        store_for(str(tmp_path / "absent"), detector=True)
    assert "\n" not in str(err.value)
    assert str(err.value).endswith("(build it: edgeinfer model build --task detection)")
    assert BuildOptions(task="detection").output_dir().parts[-3:-1] == ("models", "yolov3-tiny")


def test_the_raw_side_of_a_detector_letterboxes_and_finds_detections(tmp_path: Path) -> None:
    import numpy as np

    from edgeinfer.runtime.config import RuntimeConfig
    from tests.helpers.images import solid_jpeg
    from tests.helpers.tiny_detector import TINY_SIZE, build_tiny_detector_store, expected_boxes

    store = build_tiny_detector_store(tmp_path / "det")
    cfg = RuntimeConfig(execution_providers=["CPUExecutionProvider"], max_batch_size=2)
    # The tiny detector finds its four boxes in a white image and nothing in a black one.
    images = [solid_jpeg((255, 255, 255), size=(640, 480)), solid_jpeg((0, 0, 0), size=(640, 480))]
    raw = RawPipeline(store, images, cfg, tmp_path / "work")
    assert raw.engine.detector
    image, geometry = raw.decode(0)
    assert image.shape == (raw.engine.input_size, raw.engine.input_size, 3)
    assert geometry is not None  # 640×480 into a square: letterboxed, boxes mapped back with it
    white = raw.post(raw.engine.run(image[None])[0], geometry)
    assert len(white) == 4
    want = expected_boxes(640, 480)
    net_pixel = 640 / TINY_SIZE  # one pixel of the network's input, in the source image
    for d in white:  # in the 640×480 image's pixels, as the runtime answers them
        box = np.array([d.box.x_min, d.box.y_min, d.box.x_max, d.box.y_max])
        assert np.abs(want - box).max(axis=1).min() <= net_pixel
    black, black_geometry = raw.decode(1)
    assert raw.post(raw.engine.run(black[None])[0], black_geometry) == []
    assert raw.once(0) > 0
    rps, cpu_ms = raw.batched(2)
    assert rps > 0
    assert cpu_ms > 0


def test_the_raw_side_of_a_classifier_crops_and_ranks(tiny_store: Path, tmp_path: Path) -> None:
    from edgeinfer.runtime.config import RuntimeConfig

    cfg = RuntimeConfig(execution_providers=["CPUExecutionProvider"], max_batch_size=2)
    raw = RawPipeline(tiny_store, bench_images(2), cfg, tmp_path / "work")
    image, geometry = raw.decode(0)
    assert (image.shape, geometry) == ((raw.engine.input_size, raw.engine.input_size, 3), None)
    top = raw.post(raw.engine.run(image[None])[0], geometry)
    assert len(top) == 5
    assert [p.score for p in top] == sorted((p.score for p in top), reverse=True)
    assert len({p.index for p in top}) == 5
    assert raw.once(1) > 0
    assert raw.batched(1)[0] > 0
