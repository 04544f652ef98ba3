"""`edgeinfer report` writes valid PNGs from telemetry windows and from benchmark JSON."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from edgeinfer.cli import main
from edgeinfer.messages import ErrorCode, Latency, ModelRef, Prediction, TimingBatch, TimingRecord
from edgeinfer.stats import quantile
from edgeinfer.telemetry.report import (
    find_quantiles,
    fleet_figsize,
    fleet_series,
    fleet_summary,
    load,
    low_confidence_series,
)
from edgeinfer.telemetry.window import WindowAggregator
from tests.helpers.clock import FakeClock
from tests.helpers.telemetry import make_record

PNG = b"\x89PNG\r\n\x1a\n"


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG)
    import matplotlib.image

    pixels = matplotlib.image.imread(path)
    assert pixels.shape[0] > 100
    assert pixels.shape[1] > 100


def recorded_windows(tmp_path: Path, clock: FakeClock, things: tuple[str, ...] = ("dev",)) -> Path:
    rng = random.Random(8)
    lines = []
    for thing in things:
        agg = WindowAggregator(thing, window_s=10, clock=clock, wall=lambda: clock.now + 1.7e9)
        for _ in range(6):
            agg.add(TimingBatch(thing, [make_record(rng) for _ in range(50)], executions=[8] * 6))
            clock.advance(10)
            lines += [w.to_json().decode() for w in agg.poll()]
    path = tmp_path / "telemetry.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_report_from_recorded_telemetry(
    tmp_path: Path, clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    src = recorded_windows(tmp_path, clock)
    assert main(["report", str(src), "--out", str(tmp_path / "plots")]) == 0
    out = tmp_path / "plots" / "telemetry.png"
    assert capsys.readouterr().out.strip() == str(out)
    assert_png(out)
    assert not list((tmp_path / "plots").glob(".*"))  # no temporary file left


def test_report_one_png_per_device(tmp_path: Path, clock: FakeClock) -> None:
    src = recorded_windows(tmp_path, clock, ("a", "b"))
    assert main(["report", str(src), "--out", str(tmp_path)]) == 0
    assert_png(tmp_path / "telemetry-a.png")
    assert_png(tmp_path / "telemetry-b.png")


def test_report_from_a_json_list_of_windows(tmp_path: Path, clock: FakeClock) -> None:
    src = recorded_windows(tmp_path, clock)
    as_list = tmp_path / "windows.json"
    as_list.write_text(json.dumps({"windows": [json.loads(line) for line in src.read_text().splitlines()]}))
    kind, windows = load(as_list)
    assert kind == "telemetry"
    assert len(windows) == 6


def test_report_from_benchmark_json(tmp_path: Path) -> None:
    bench = {
        "machine": {"cores": 2},
        "runs": [
            {"name": "fp32-b1", "latency_ms": {"p50": 4.4, "p99": 6.0, "max": 9.0}},
            {"name": "int8-b1", "latency_ms": {"p50": 2.8, "p99": 3.9}},
        ],
        "telemetry": {"on": {"p50": 3.0, "p99": 5.1}, "off": {"p50": 2.9, "p99": 5.0}},
        "not_latency": {"p50": "fast"},
        "runtime": {
            "local_p50_ms": 5.1,
            "local_p99_ms": 9.2,
            "iot_p50_ms": 7.0,
            "iot_p99_ms": 12.0,
            "rps": 9,
        },
    }
    src = tmp_path / "model.json"
    src.write_text(json.dumps(bench))
    labels = [label for label, _ in find_quantiles(bench)]
    assert labels == [
        "runs/fp32-b1/latency_ms",
        "runs/int8-b1/latency_ms",
        "telemetry/on",
        "telemetry/off",
        "runtime/local",
        "runtime/iot",
    ]
    assert main(["report", str(src), "--out", str(tmp_path)]) == 0
    assert_png(tmp_path / "model.png")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        ("{not json\n", "not JSON or JSON Lines"),
        ('{"a": 1}', "no latency figures found"),
        (
            '[{"thing": "t", "seq": 1, "window_s": 1, "count": 1, "latency_ms": []}]',
            "malformed telemetry window",
        ),
    ],
)
def test_bad_input_is_one_line_and_nonzero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, message: str
) -> None:
    src = tmp_path / "in.json"
    if content is not None:
        src.write_text(content)
    assert main(["report", str(src), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_a_binary_file_is_one_line_and_nonzero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "chart.png"
    src.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    assert main(["report", str(src), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"edgeinfer: error: {src} is not JSON or JSON Lines (not UTF-8 text)"]
    assert not (tmp_path / "out").exists()


def test_unwritable_out_folder_is_one_line_and_nonzero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "in.json"
    src.write_text('{"p50": 1.0, "p99": 2.0}')
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("")
    assert main(["report", str(src), "--out", str(in_the_way)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"edgeinfer: error: --out {in_the_way} is not a folder"


def test_a_bad_file_among_good_ones_writes_no_chart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"runtime": {"local_p50_ms": 9.0, "local_p99_ms": 14.0}}))
    bad = tmp_path / "bad.json"
    bad.write_text('{"a": 1}')
    assert main(["report", str(good), str(bad), "--out", str(tmp_path / "out")]) == 2
    assert "bad.json: no latency figures found" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_median_stands_for_the_p50() -> None:
    doc = {"variants": {"int8-cpu": {"b1_median_ms": 5.4, "b1_p99_ms": 18.1, "b8_median_ms": 33.3}}}
    assert list(find_quantiles(doc)) == [("variants/int8-cpu/b1", {"p50": 5.4, "p99": 18.1})]


def fleet_recording(tmp_path: Path, things: int = 20) -> Path:
    """Six windows per device, as `watch --record` keeps them (one window delivered twice); device i
    fails i requests in its last window only."""
    rng = random.Random(27)
    lines = []
    for i in range(things):
        thing = f"cam-{i:02d}"
        clock = FakeClock()

        def wall(c: FakeClock = clock) -> float:
            return c.now + 1.7e9

        agg = WindowAggregator(thing, window_s=10, clock=clock, wall=wall)
        for n in range(6):
            records = [make_record(rng) for _ in range(40)]
            if n == 5:
                records += [make_record(rng, status="error", code=ErrorCode.INTERNAL) for _ in range(i)]
            agg.add(TimingBatch(thing, records))
            clock.advance(10)
            lines += [w.to_json().decode() for w in agg.poll()]
    lines.append(lines[0])  # at-least-once delivery: recorded twice
    path = tmp_path / "fleet.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_fleet_summary_over_a_recording(tmp_path: Path) -> None:
    kind, windows = load(fleet_recording(tmp_path, things=3))
    assert kind == "telemetry"
    assert len(windows) == 19
    summary = fleet_summary(windows)
    assert [row.thing for row in summary] == ["cam-02", "cam-01", "cam-00"]  # worst first
    worst = summary[0]
    own = sorted((w for w in windows if w.thing == "cam-02"), key=lambda w: w.seq)
    assert (worst.requests, worst.errors) == (242, 2)  # 6 x 40 + 2, each window once
    assert worst.throughput_rps == 242 / 60
    assert worst.p99_ms == max(w.latency_ms["total"].p99 for w in own)
    assert worst.p50_ms == quantile([w.latency_ms["total"].p50 for w in own], 0.5)
    assert summary[2].requests == 240  # cam-00's first window was recorded twice, counted once
    label, series = fleet_series(windows)
    assert label == "time (s)"
    assert [x for x, _, _ in series["cam-00"]] == [0.0, 10.0, 20.0, 30.0, 40.0, 50.0]
    assert series["cam-02"][-1][2] == 2 / 42
    assert series["cam-02"][-1][1] == own[-1].latency_ms["total"].p99


def test_report_fleet_writes_one_png_of_every_device(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = fleet_recording(tmp_path)
    assert main(["report", "--fleet", str(src), "--out", str(tmp_path / "plots")]) == 0
    out = tmp_path / "plots" / "fleet.png"
    assert capsys.readouterr().out.strip() == str(out)
    assert_png(out)
    import matplotlib.image

    width, height = fleet_figsize(20)
    assert matplotlib.image.imread(out).shape[:2] == (round(height * 110), round(width * 110))


def test_report_fleet_takes_only_telemetry(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"p50": 1.0, "p99": 2.0}))
    assert (
        main(["report", "--fleet", str(fleet_recording(tmp_path)), str(bench), "--out", str(tmp_path)]) == 2
    )
    assert "holds benchmark figures" in capsys.readouterr().err
    assert not (tmp_path / "fleet.png").exists()


def test_report_draws_each_models_low_confidence_across_an_update(tmp_path: Path, clock: FakeClock) -> None:
    agg = WindowAggregator("dev", window_s=10, clock=clock, wall=lambda: clock.now + 1.7e9)
    windows = []
    for version, low in (("1", 0.2), ("1", 0.6), ("2", 0.9)):
        model = ModelRef("resnet", version, "int8")
        top = [(Prediction(0, "cat", low),), (Prediction(1, "dog", 0.95),)]
        records = [TimingRecord("r", "ok", Latency(total=3), model=model, top=t) for t in top]
        agg.add(TimingBatch("dev", records))
        clock.advance(10)
        windows += agg.poll()
    series = low_confidence_series(windows)
    assert list(series) == ["resnet 1", "resnet 2"]
    assert series["resnet 1"][:2] == [50.0, 0.0]
    assert math.isnan(series["resnet 1"][2])  # the old version's line ends at the update
    assert math.isnan(series["resnet 2"][0])
    assert series["resnet 2"][2] == 0.0
    src = tmp_path / "windows.jsonl"
    src.write_text("".join(w.to_json().decode() + "\n" for w in windows))
    assert main(["report", str(src), "--out", str(tmp_path)]) == 0
    assert_png(tmp_path / "windows.png")


def test_report_adds_a_capture_chart_when_the_windows_count_captures(
    tmp_path: Path, clock: FakeClock
) -> None:
    agg = WindowAggregator("dev", window_s=10, clock=clock, wall=lambda: clock.now + 1.7e9)
    lines = []
    for i in range(4):
        agg.add(TimingBatch("dev", [make_record(random.Random(i))], capture={"chosen": i, "uploaded": i}))
        clock.advance(10)
        lines += [w.to_json().decode() for w in agg.poll()]
    src = tmp_path / "telemetry.jsonl"
    src.write_text("\n".join(lines) + "\n")
    assert main(["report", str(src), "--out", str(tmp_path / "plots")]) == 0
    assert_png(tmp_path / "plots" / "telemetry.png")
    assert_png(tmp_path / "plots" / "telemetry-capture.png")


def test_report_without_captures_has_no_capture_chart(tmp_path: Path, clock: FakeClock) -> None:
    src = recorded_windows(tmp_path, clock)
    assert main(["report", str(src), "--out", str(tmp_path / "plots")]) == 0
    assert not (tmp_path / "plots" / "telemetry-capture.png").exists()
