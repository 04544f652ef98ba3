"""`watch`'s rendering without a terminal: a frame rendered to a string."""

from __future__ import annotations

import io
import random

from rich.console import Console

from edgeinfer.messages import ErrorCode, Latency, Result, TimingBatch, error_result
from edgeinfer.telemetry.dashboard import Dashboard, sparkline
from edgeinfer.telemetry.window import WindowAggregator
from tests.helpers.clock import FakeClock
from tests.helpers.telemetry import make_record


def frame(dashboard: Dashboard, width: int = 140) -> str:
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
