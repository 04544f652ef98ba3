"""The fleet's figures: one row per window, model identity when a window carries it, worst first."""

from __future__ import annotations

import random

from edgeinfer.messages import ErrorCode, TimingBatch
from edgeinfer.telemetry.fleet import ThingFigures, figures_of, model_label, worst_first
from edgeinfer.telemetry.window import WindowAggregator
from tests.helpers.clock import FakeClock
from tests.helpers.telemetry import make_record


def row(thing: str, requests: int = 100, errors: int = 0, p99: float | None = 10.0) -> ThingFigures:
    return ThingFigures(thing, requests, errors, 0, requests / 10, None if p99 is None else p99 / 2, p99)


def test_model_label_reads_the_identity_a_window_may_carry() -> None:
    assert model_label({"thing": "a"}) is None  # windows today: no model identity
    assert model_label({"model": {"name": "effnet", "version": "1.2.0"}}) == "effnet 1.2.0"
    two = {"models": [{"name": "effnet", "version": "1.2.0"}, {"name": "yolo", "version": "3"}]}
    assert model_label(two) == "effnet 1.2.0, yolo 3"
    assert model_label({"models": []}) is None
    assert model_label({"models": ["not an object"], "model": "nor this"}) is None
    assert model_label({"model": {"name": "effnet"}}) == "effnet"


def test_figures_of_a_window(clock: FakeClock) -> None:
    rng = random.Random(5)
    agg = WindowAggregator("cam-1", window_s=10, clock=clock)
    records = [make_record(rng) for _ in range(45)] + [make_record(rng, offloaded=True) for _ in range(5)]
    records += [make_record(rng, status="error", code=ErrorCode.OVERLOADED) for _ in range(10)]
    agg.add(TimingBatch("cam-1", records))
    clock.advance(10)
    (window,) = agg.poll()
    figures = figures_of(window, "effnet 1.2.0")
    assert (figures.thing, figures.requests, figures.errors, figures.offloaded) == ("cam-1", 60, 10, 5)
    assert figures.error_share == 10 / 60
    assert figures.offload_share == 5 / 60
    assert figures.throughput_rps == 6.0
    assert figures.p99_ms == window.latency_ms["total"].p99
    assert figures.p50_ms == window.latency_ms["total"].p50
    assert figures.model == "effnet 1.2.0"


def test_a_window_without_an_ok_request_has_no_latency(clock: FakeClock) -> None:
    rng = random.Random(6)
    agg = WindowAggregator("cam-1", window_s=10, clock=clock)
    agg.add(TimingBatch("cam-1", [make_record(rng, status="error", code=ErrorCode.INTERNAL)]))
    clock.advance(10)
    (window,) = agg.poll()
    figures = figures_of(window)
    assert (figures.p50_ms, figures.p99_ms, figures.error_share) == (None, None, 1.0)
    clock.advance(10)
    (empty,) = agg.poll()
    assert figures_of(empty).error_share == 0.0


def test_worst_first_is_stale_then_error_share_then_p99_then_name() -> None:
    rows = [
        (row("fine"), False),
        (row("slow", p99=90.0), False),
        (row("failing", errors=5), False),
        (row("failing-more", requests=50, errors=5), False),  # same errors, a larger share
        (row("silent", p99=None), True),
        (row("no-latency", errors=0, p99=None), False),
        (row("also-fine"), False),
    ]
    rows.sort(key=lambda r: worst_first(*r))
    order = [figures.thing for figures, _ in rows]
    assert order == ["silent", "failing-more", "failing", "slow", "also-fine", "fine", "no-latency"]
