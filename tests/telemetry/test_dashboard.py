"""`watch`'s and `watch --fleet`'s rendering without a terminal: a frame rendered to a string."""

from __future__ import annotations

import io
import random

from rich.console import Console

from edgeinfer.messages import (
    ErrorCode,
    Latency,
    ModelRef,
    Prediction,
    Result,
    TelemetryWindow,
    TimingBatch,
    TimingRecord,
    error_result,
)
from edgeinfer.telemetry.dashboard import Dashboard, FleetDashboard, sparkline
from edgeinfer.telemetry.window import WindowAggregator
from tests.helpers.clock import FakeClock
from tests.helpers.telemetry import make_record


def frame(dashboard: Dashboard | FleetDashboard, width: int = 140) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False)
    console.print(dashboard.render())
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(out, str)
    return out


def test_empty_dashboard_says_it_is_waiting(clock: FakeClock) -> None:
    text = frame(Dashboard(source="127.0.0.1:1883", clock=clock))
    assert "127.0.0.1:1883" in text
    assert "waiting for telemetry" in text


def test_frame_shows_stages_rates_offload_and_errors(clock: FakeClock) -> None:
    rng = random.Random(3)
    agg = WindowAggregator(
        "cam-1", window_s=10, clock=clock, system=lambda: {"cpu_percent": 71.0, "rss_mb": 312.0}
    )
    dashboard = Dashboard(clock=clock)
    for seq in range(3):
        records = [make_record(rng) for _ in range(90)] + [
            make_record(rng, offloaded=True, provider="cloud") for _ in range(10)
        ]
        records += [make_record(rng, status="error", code=ErrorCode.DEADLINE_EXCEEDED) for _ in range(2)]
        agg.add(TimingBatch("cam-1", records, executions=[8] * 12 + [6]))
        clock.advance(10)
        (window,) = agg.poll()
        assert window.seq == seq
        dashboard.add_window(window)
    for i in range(30):
        ok = Result(
            id=str(i),
            status="ok",
            timestamp="",
            placement="cloud" if i % 3 == 0 else "edge",
            latency_ms=Latency(total=10.0 + i),
        )
        dashboard.add_result("cam-1", ok)
    dashboard.add_result("cam-1", error_result("x", ErrorCode.BAD_IMAGE, "not an image", timestamp=""))
    text = frame(dashboard)
    for stage in ("queue", "decode", "inference", "postprocess", "total"):
        assert stage in text
    assert "cam-1" in text
    assert "window #2 (10 s)" in text
    assert "throughput 10.2/s" in text
    assert "offloaded 10 (10%)" in text
    assert "DEADLINE_EXCEEDED 2" in text
    assert "cpu 71%" in text
    assert "rss 312 MB" in text
    assert "results (last 10 s) 3.1/s" in text
    assert "cloud 32%" in text
    assert "BAD_IMAGE 1" in text
    p50 = window.latency_ms["total"].p50
    assert f"{p50:.2f}" in text


def test_frame_has_a_line_per_model_with_its_version_and_low_confidence(clock: FakeClock) -> None:
    agg = WindowAggregator("cam-1", window_s=10, clock=clock)
    dashboard = Dashboard(clock=clock)
    v1, v2 = ModelRef("resnet50", "1.0.0", "int8"), ModelRef("resnet50", "1.1.0", "int8")
    for model in (v1, v2):  # a model update between two windows
        records = [
            TimingRecord(
                str(i),
                "ok",
                Latency(total=5),
                provider="CPUExecutionProvider",
                model=model,
                top=(Prediction(i % 4, ("cat", "dog", "fox", "owl")[i % 4], 0.3 if i < 5 else 0.9),),
            )
            for i in range(20)
        ]
        agg.add(TimingBatch("cam-1", records))
        clock.advance(10)
        dashboard.add_window(agg.poll()[0])
    text = frame(dashboard)
    assert "model resnet50 1.1.0 (int8, CPUExecutionProvider)  answers 20  low confidence 5 (25%)" in text
    assert "top cat 5, dog 5, fox 5" in text
    assert "1.0.0" not in text  # the latest window's models


def test_gaps_and_restarts_are_shown(clock: FakeClock) -> None:
    agg = WindowAggregator("d", window_s=1, clock=clock)
    windows = []
    for _ in range(5):
        clock.advance(1)
        windows += agg.poll()
    dashboard = Dashboard(clock=clock)
    for w in (windows[0], windows[3], windows[4], windows[4]):
        dashboard.add_window(w)
    text = frame(dashboard)
    assert "2 window(s) missing" in text
    assert "window #4 (" in text
    dashboard.add_window(windows[1])  # late, after an outage: fills a gap, does not become "last"
    text = frame(dashboard)
    assert "1 window(s) missing" in text
    assert "window #4 (" in text
    dashboard.add_window(windows[0])  # a duplicate (at-least-once delivery): ignored
    assert "restart" not in frame(dashboard)
    clock.advance(1)
    again = WindowAggregator("d", window_s=1, clock=clock, wall=lambda: 2e9)  # state lost: seq 0 anew
    clock.advance(1)
    dashboard.add_window(again.poll()[0])
    assert "1 restart(s)" in frame(dashboard)


def test_results_age_out(clock: FakeClock) -> None:
    dashboard = Dashboard(clock=clock, result_span_s=5)
    dashboard.add_result("d", Result(id="1", status="ok", timestamp=""))
    assert "0.2/s" in frame(dashboard)
    clock.advance(6)
    assert "none seen" in frame(dashboard)


def test_sparkline() -> None:
    assert sparkline([]) == ""
    assert sparkline([0, 0]) == "▁▁"
    assert sparkline([0, 5, 10]) == "▁▅█"


def fleet_window(thing: str, errors: int = 0, wall: float = 1.7e9) -> TelemetryWindow:
    rng = random.Random(thing)
    clock = FakeClock()  # the aggregator's own: the dashboard's clock moves only when the test says
    agg = WindowAggregator(thing, window_s=10, clock=clock, wall=lambda: wall)
    records = [make_record(rng) for _ in range(20)]
    records += [make_record(rng, status="error", code=ErrorCode.INTERNAL) for _ in range(errors)]
    agg.add(TimingBatch(thing, records))
    clock.advance(10)
    (window,) = agg.poll()
    return window


def test_fleet_rows_worst_first_with_stale_things_marked(clock: FakeClock) -> None:
    dashboard = FleetDashboard(source="broker:1883", stale_windows=3, clock=clock)
    assert "waiting for telemetry" in frame(dashboard)
    dashboard.add_window(fleet_window("quiet"))
    clock.advance(25)  # 2.5 of its 10 s windows: not yet stale
    dashboard.add_window(fleet_window("ok"), model="effnet 1.2.0")
    dashboard.add_window(fleet_window("bad", errors=5))
    assert [(f.thing, stale) for f, stale, _ in dashboard.rows()] == [
        ("bad", False),
        ("ok", False),
        ("quiet", False),
    ]
    clock.advance(6)  # quiet: 3.1 windows of silence
    assert [(f.thing, stale) for f, stale, _ in dashboard.rows()] == [
        ("quiet", True),
        ("bad", False),
        ("ok", False),
    ]
    text = frame(dashboard)
    assert "3 thing(s)  1 stale" in text
    assert "stale 31s" in text
    assert "effnet 1.2.0" in text
    assert "5 (20.0%)" in text
    dashboard.add_window(fleet_window("quiet"))  # heard from again
    assert not any(stale for _, stale, _ in dashboard.rows())


def test_fleet_keeps_the_latest_stamped_window_of_a_thing(clock: FakeClock) -> None:
    dashboard = FleetDashboard(clock=clock)
    dashboard.add_window(fleet_window("cam", errors=0, wall=1.7e9 + 100))
    dashboard.add_window(fleet_window("cam", errors=20, wall=1.7e9))  # a spooled one, replayed late
    ((figures, _, _),) = dashboard.rows()
    assert figures.errors == 0
    dashboard.add_window(fleet_window("cam", errors=4, wall=1.7e9 + 110))
    ((figures, _, _),) = dashboard.rows()
    assert figures.errors == 4
    assert dashboard.windows_received == 3


def test_frame_shows_captures_counters_and_what_was_lost(clock: FakeClock) -> None:
    agg = WindowAggregator("cam-1", window_s=10, clock=clock)
    dashboard = Dashboard(clock=clock)
    agg.add(TimingBatch("cam-1", [], capture={"chosen": 7, "spooled": 6, "uploaded": 4, "busy": 1}))
    agg.add(TimingBatch("cam-1", [], capture={"dropped_size": 2, "upload_failures": 3}))
    clock.advance(10)
    dashboard.add_window(agg.poll()[0])
    text = frame(dashboard)
    assert "capture chosen 7  spooled 6  uploaded 4" in text
    assert "busy 1  dropped (size) 2  upload failures 3" in text
    assert "dropped (age)" not in text  # nothing lost that way: not shown
    agg.add(TimingBatch("cam-1", []))
    clock.advance(10)
    dashboard.add_window(agg.poll()[0])
    assert "capture" not in frame(dashboard)  # capture off: no line


def test_frame_shows_each_sources_frames_and_outages(clock: FakeClock) -> None:
    agg = WindowAggregator("cam-1", window_s=10, clock=clock)
    dashboard = Dashboard(clock=clock)
    agg.add(TimingBatch("cam-1", [], sources={"gate": {"served": 95, "dropped": 5}}))
    agg.add(TimingBatch("cam-1", [], sources={"dock": {"served": 40, "reconnects": 2, "outage_ms": 10400}}))
    clock.advance(10)
    dashboard.add_window(agg.poll()[0])
    text = frame(dashboard)
    assert "source dock  served 40  dropped 0  reconnects 2  outage 10.4 s" in text
    assert "source gate  served 95  dropped 5" in text
    assert "source gate  served 95  dropped 5  reconnects" not in text  # no outage: not shown
    agg.add(TimingBatch("cam-1", []))
    clock.advance(10)
    dashboard.add_window(agg.poll()[0])
    assert "source " not in frame(dashboard)  # no frame source in the window: no line
