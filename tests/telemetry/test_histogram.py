"""The histogram's quantiles match the exact nearest-rank quantiles within its stated precision."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgeinfer.telemetry.histogram import RELATIVE_PRECISION, Histogram

QS = (0.0, 0.01, 0.25, 0.5, 0.9, 0.99, 0.999, 1.0)


def exact(values: list[float], q: float) -> float:
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def assert_close(got: float, want: float, unit: float = 0.001) -> None:
    assert abs(got - want) <= RELATIVE_PRECISION * abs(want) + unit, (got, want)


def test_precision_is_stated_and_tight() -> None:
    assert RELATIVE_PRECISION <= 0.01


def test_empty_histogram_reports_zeros() -> None:
    hist = Histogram()
    assert hist.count == 0
    assert hist.quantile(0.99) == 0.0
    assert hist.max == 0.0
    assert hist.mean == 0.0


@pytest.mark.parametrize(
    "draw",
    [
        lambda r: r.lognormvariate(1.0, 0.8),  # a latency-like long tail
        lambda r: r.expovariate(1 / 30.0),
        lambda r: r.uniform(0.0, 0.2),  # sub-millisecond: the exact linear range
        lambda r: 5000 * r.random() ** 4,  # wide dynamic range
    ],
)
def test_generated_latencies_match_exact_quantiles(draw) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(7)
    values = [draw(rng) for _ in range(20_000)]
    hist = Histogram()
    hist.record_many(values)
    for q in QS:
        assert_close(hist.quantile(q), exact(values, q))
    assert hist.max == max(values)
    assert hist.min == min(values)
    assert hist.mean == pytest.approx(sum(values) / len(values))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False),
        min_size=1,
        max_size=300,
    ),
    st.floats(min_value=0.0, max_value=1.0),
)
def test_any_data_any_quantile_within_precision(values: list[float], q: float) -> None:
    hist = Histogram()
    hist.record_many(values)
    assert_close(hist.quantile(q), exact(values, q))
    assert hist.max == max(values)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.floats(min_value=0.0, max_value=1e4, allow_nan=False), min_size=1, max_size=200),
    st.lists(st.floats(min_value=0.0, max_value=1e4, allow_nan=False), min_size=1, max_size=200),
)
def test_merge_equals_recording_everything(a: list[float], b: list[float]) -> None:
    left, right, both = Histogram(), Histogram(), Histogram()
    left.record_many(a)
    right.record_many(b)
    both.record_many(a + b)
    left.merge(right)
    assert left.count == both.count
    assert left.quantiles(QS) == both.quantiles(QS)
    assert left.max == both.max
    assert list(left.buckets()) == list(both.buckets())


def test_quantiles_are_monotonic_and_bounded() -> None:
    rng = random.Random(3)
    hist = Histogram()
    hist.record_many(rng.lognormvariate(2, 1) for _ in range(5000))
    got = hist.quantiles(QS)
    assert got == sorted(got)
    assert got[0] == hist.min
    assert got[-1] == hist.max


def test_bad_values_do_not_poison_the_histogram() -> None:
    hist = Histogram()
    hist.record(float("nan"))
    hist.record(float("inf"))
    hist.record(-3.0)  # a clock step backwards: counts as zero
    hist.record(2.5)
    assert hist.count == 2
    assert hist.min == 0.0
    assert hist.max == 2.5


def test_round_trip_through_dict() -> None:
    hist = Histogram()
    hist.record_many([0.1, 1.0, 10.0, 100.0, 1000.0])
    again = Histogram.from_dict(hist.to_dict())
    assert again.quantiles(QS) == hist.quantiles(QS)
    assert again.count == hist.count


def test_merge_refuses_other_units() -> None:
    with pytest.raises(ValueError, match="units"):
        Histogram(0.001).merge(Histogram(0.01))


def test_memory_is_bounded_by_buckets_not_samples() -> None:
    hist = Histogram()
    rng = random.Random(1)
    for _ in range(50_000):
        hist.record(rng.uniform(1.0, 100.0))
    assert len(list(hist.buckets())) < 1000
