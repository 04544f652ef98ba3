"""The runtime benchmark's helpers (the benchmark itself runs with `edgeinfer bench runtime`)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from edgeinfer.cli import build_parser
from edgeinfer.runtime.bench import (
    CLIENT,
    COMPONENT,
    bench_images,
    pct,
    prepare_device,
    request_payloads,
    running_ms_from_log,
    table_lines,
)

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results" / "runtime.json"


def test_percentile_and_log_parsing() -> None:
    assert pct([5.0, 1.0, 3.0], 50) == 3.0
    assert pct(list(range(101)), 99) == 99
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
    assert all((artifacts / "com.edgeinfer.ModelStore" / "0.1.0" / f).is_file() for f in files)
    prepare_device(tmp_path / "dev", tiny_store)  # again: idempotent


def test_images_and_payloads() -> None:
    images = bench_images(3)
    assert all(img[:3] == b"\xff\xd8\xff" for img in images)
    payloads = request_payloads(images)
    assert all(b'"id":"__ID__"' in p.replace(b" ", b"") for p in payloads)


def test_registered_under_bench() -> None:
    args = build_parser().parse_args(["bench", "runtime", "--requests", "5", "--json", "x.json"])
    assert args.requests == 5
    assert args.json == "x.json"


def test_table_shows_the_median_segment_and_every_segment() -> None:
    doc = json.loads(RESULTS.read_text())  # the recorded run: the table renders what JSON keeps
    segments = doc["runtime"]["load70_segments"]
    assert len(segments) == 3
    ratios = sorted(g["p99_ms"] / g["p50_ms"] for g in segments)
    assert doc["ratios"]["p99_over_p50_at_70pct"] == ratios[1]  # the median segment's
    text = "\n".join(table_lines(doc))
    for g in segments:
        assert f"{g['p99_ms'] / g['p50_ms']:.2f}× at {g['rps']:.0f}" in text
    assert f"{doc['runtime']['load70_rps']:.0f} req/s" in text
