"""Windows: percentiles match the raw timings, counters add up, windows close on the injected clock."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgeinfer.messages import ErrorCode, Latency, TelemetryWindow, TimingBatch, TimingRecord
from edgeinfer.telemetry.histogram import RELATIVE_PRECISION
from edgeinfer.telemetry.window import STAGES, WindowAggregator
from tests.helpers.clock import FakeClock
from tests.helpers.telemetry import make_record


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def within(got: float, want: float) -> bool:
    return abs(got - want) <= RELATIVE_PRECISION * abs(want) + 0.001


def test_no_window_before_its_end(clock: FakeClock) -> None:
    agg = WindowAggregator("dev", window_s=10, clock=clock)
    clock.advance(9.99)
    assert agg.poll() == []
    clock.advance(0.01)
    (window,) = agg.poll()
    assert window.seq == 0
    assert window.window_s == 10
    assert window.count == 0
    assert agg.poll() == []


def test_percentiles_match_raw_timings_through_the_wire(clock: FakeClock) -> None:
    rng = random.Random(11)
    agg = WindowAggregator("dev", window_s=10, clock=clock)
    raw: list[TimingRecord] = []
    for _ in range(40):
        records = [make_record(rng) for _ in range(50)]
        # what the telemetry component sees is the JSON the runtime published
        batch = TimingBatch.parse(TimingBatch("dev", records, executions=[8] * 6 + [2]).to_json())
        raw += batch.records
        assert agg.add_payload(TimingBatch("dev", records, executions=[8] * 6 + [2]).to_json())
        clock.advance(0.2)
    clock.advance(2.0)
    (window,) = agg.poll()
    assert window.count == len(raw) == 2000
    assert window.throughput_rps == pytest.approx(200.0)
    for stage in STAGES:
        values = [getattr(r.latency_ms, stage) for r in raw]
        q = window.latency_ms[stage]
        for name, quantile in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
            assert within(getattr(q, name), nearest_rank(values, quantile)), (stage, name)
        assert q.max == max(values)
    assert window.batch == {
        "executions": 280,
        "inferences": 2000,
        "mean_size": pytest.approx(2000 / 280, abs=1e-3),
    }
    depths = [r.queue_depth for r in raw]
    assert window.queue_depth["max"] == max(depths)
    assert window.queue_depth["mean"] == pytest.approx(sum(depths) / len(depths), abs=1e-3)
    assert window.provider == "CPUExecutionProvider"


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(min_value=0, max_value=5000, allow_nan=False),
            st.floats(min_value=0, max_value=5000, allow_nan=False),
        ),
        min_size=1,
        max_size=200,
    )
)
def test_any_timings_match_within_precision(pairs: list[tuple[float, float]]) -> None:
    clock = FakeClock()
    agg = WindowAggregator("dev", window_s=1, clock=clock)
    records = [TimingRecord(None, "ok", Latency(queue=q, inference=i, total=q + i)) for q, i in pairs]
    batch = TimingBatch.parse(TimingBatch("dev", records).to_json())
    agg.add(batch)
    clock.advance(1)
    (window,) = agg.poll()
    for stage in ("queue", "inference", "total"):
        values = [getattr(r.latency_ms, stage) for r in batch.records]
        for name, quantile in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
            assert within(getattr(window.latency_ms[stage], name), nearest_rank(values, quantile))
        assert window.latency_ms[stage].max == max(values)


def test_counters_errors_flags_and_dropped(clock: FakeClock) -> None:
    rng = random.Random(5)
    agg = WindowAggregator("dev", window_s=10, clock=clock)
    records = (
        [make_record(rng) for _ in range(10)]
        + [make_record(rng, status="error", code=ErrorCode.BAD_IMAGE) for _ in range(3)]
        + [make_record(rng, status="error", code=ErrorCode.DEADLINE_EXCEEDED)]
        + [make_record(rng, status="error")]  # no code: counted as INTERNAL
        + [make_record(rng, offloaded=True, provider="cloud") for _ in range(4)]
        + [make_record(rng, cascaded=True, offloaded=True) for _ in range(2)]
        + [make_record(rng, dropped=True) for _ in range(7)]
    )
    agg.add(TimingBatch("dev", records, executions=[4, 4, 0, 2]))
    clock.advance(10)
    (window,) = agg.poll()
    assert window.count == 10 + 3 + 1 + 1 + 4 + 2
    assert window.errors == {"BAD_IMAGE": 3, "DEADLINE_EXCEEDED": 1, "INTERNAL": 1}
    assert window.offloaded == 6
    assert window.cascaded == 2
    assert window.dropped == 7
    assert window.batch["executions"] == 3  # an empty execution is no execution
    assert window.batch["inferences"] == 10
    assert window.provider == "CPUExecutionProvider"


def test_windows_are_independent_and_seq_continues(clock: FakeClock) -> None:
    rng = random.Random(2)
    agg = WindowAggregator("dev", window_s=5, clock=clock, first_seq=41)
    seqs = []
    for n in range(4):
        agg.add(TimingBatch("dev", [make_record(rng) for _ in range(n)]))
        clock.advance(5)
        (window,) = agg.poll()
        assert window.count == n
        seqs.append(window.seq)
    assert seqs == [41, 42, 43, 44]


def test_a_stalled_loop_skips_ahead_instead_of_bursting(clock: FakeClock) -> None:
    agg = WindowAggregator("dev", window_s=10, clock=clock)
    agg.add(TimingBatch("dev", [make_record(random.Random(1)) for _ in range(19)]))
    clock.advance(95)
    (stalled,) = agg.poll()
    assert stalled.window_s == 95  # it spans the stall, so throughput is not overstated
    assert stalled.throughput_rps == pytest.approx(0.2)
    assert agg.poll() == []
    clock.advance(10)
    (window,) = agg.poll()
    assert window.seq == 1


def test_window_length_change_applies_from_the_next_window(clock: FakeClock) -> None:
    agg = WindowAggregator("dev", window_s=10, clock=clock)
    agg.set_window(2)
    clock.advance(10)
    assert agg.poll()[0].window_s == 10
    clock.advance(2)
    assert agg.poll()[0].window_s == 2
    with pytest.raises(ValueError, match="positive"):
        agg.set_window(0)


def test_system_figures_are_attached_and_failures_tolerated(clock: FakeClock) -> None:
    agg = WindowAggregator("dev", window_s=1, clock=clock, system=lambda: {"cpu_percent": 12.5})
    clock.advance(1)
    assert agg.poll()[0].system == {"cpu_percent": 12.5}

    def broken() -> dict[str, float]:
        raise OSError("no /proc")

    agg = WindowAggregator("dev", window_s=1, clock=clock, system=broken)
    clock.advance(1)
    assert agg.poll()[0].system == {}


def test_malformed_payloads_are_counted_not_raised(clock: FakeClock) -> None:
    agg = WindowAggregator("dev", clock=clock)
    assert not agg.add_payload(b"not json")
    assert not agg.add_payload(b'{"records": 3}')
    assert not agg.add_payload(b'{"records": [{"latency_ms": {"total": "x"}}]}')
    assert agg.bad_messages == 3


def test_window_round_trips_through_the_contract(clock: FakeClock) -> None:
    rng = random.Random(9)
    agg = WindowAggregator("dev", window_s=10, clock=clock, wall=lambda: 1.8e9)
    agg.add(TimingBatch("dev", [make_record(rng) for _ in range(100)], executions=[8] * 12 + [4]))
    clock.advance(10)
    (window,) = agg.poll()
    again = TelemetryWindow.from_dict(TelemetryWindow.from_dict(window.to_dict()).to_dict())
    assert again.to_dict() == window.to_dict()
    assert window.timestamp.endswith("Z")


def test_flush_closes_a_short_window(clock: FakeClock) -> None:
    agg = WindowAggregator("dev", window_s=10, clock=clock)
    agg.add(TimingBatch("dev", [make_record(random.Random(1))]))
    clock.advance(2.5)
    window = agg.flush()
    assert window.count == 1
    assert window.window_s == 2.5
    assert window.throughput_rps == pytest.approx(0.4)
