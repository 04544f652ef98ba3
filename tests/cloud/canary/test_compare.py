"""The canary's judgement: figures from windows, limits, and the reasons it gives."""

from __future__ import annotations

import pytest

from edgeinfer_cloud.canary.compare import Figures, Limit, Thresholds, Window, compare, summarize


def figures(**kwargs: float | int | None) -> Figures:
    base: dict[str, float | int | None] = {
        "things": 3,
        "windows": 9,
        "requests": 400,
        "error_share": 0.01,
        "overloaded_share": 0.0,
        "deadline_share": 0.0,
        "p99_ms": 180.0,
        "low_confidence_share": None,
    }
    return Figures(**{**base, **kwargs})  # type: ignore[arg-type]


def test_summarize_separates_load_from_errors_and_weights_p99_by_ok_requests() -> None:
    windows = [
        Window("a", 100, {"INTERNAL": 2, "OVERLOADED": 8}, 100.0, (5, 90)),
        Window("a", 50, {"DEADLINE_EXCEEDED": 10}, 400.0),
        Window("b", 10, {"INTERNAL": 10}, None),  # no ok request: no latency
    ]
    f = summarize(windows)
    assert (f.things, f.windows, f.requests) == (2, 3, 160)
    assert f.error_share == pytest.approx(12 / 160)
    assert f.overloaded_share == pytest.approx(8 / 160)
    assert f.deadline_share == pytest.approx(10 / 160)
    assert f.p99_ms == pytest.approx((100 * 90 + 400 * 40) / 130)
    assert f.low_confidence_share == pytest.approx(5 / 90)


def test_summarize_nothing() -> None:
    f = summarize([])
    assert (f.requests, f.error_share, f.p99_ms, f.low_confidence_share) == (0, 0.0, None, None)


def test_a_canary_like_the_fleet_is_promoted_and_every_figure_noted() -> None:
    verdict = compare(figures(p99_ms=190.0, error_share=0.012), figures())
    assert verdict.promote
    assert verdict.reasons == ()
    assert "p99 190 ms against the fleet's 180 ms" in verdict.notes
    assert "low-confidence share: not compared (the canary's windows do not carry it)" in verdict.notes


def test_a_slow_canary_is_rolled_back_saying_how_slow() -> None:
    verdict = compare(figures(p99_ms=412.0), figures())
    assert not verdict.promote
    assert verdict.reasons == ("p99 412 ms is 2.3x the fleet's 180 ms",)


@pytest.mark.parametrize(
    ("canary", "reason"),
    [
        (figures(error_share=0.06), "error share 6.0% is 6.0x the fleet's 1.0%"),
        (figures(overloaded_share=0.05), "OVERLOADED share 5.0% is above the fleet's 0.0%"),
        (figures(deadline_share=0.1), "DEADLINE_EXCEEDED share 10.0% is above the fleet's 0.0%"),
    ],
)
def test_each_share_rolls_back_on_its_own(canary: Figures, reason: str) -> None:
    assert compare(canary, figures()).reasons == (reason,)


def test_model_quality_is_compared_where_both_sides_carry_it() -> None:
    verdict = compare(figures(low_confidence_share=0.30), figures(low_confidence_share=0.10))
    assert verdict.reasons == ("low-confidence share 30.0% is 3.0x the fleet's 10.0%",)


def test_a_small_difference_over_a_tiny_fleet_figure_is_not_a_failure() -> None:
    # 3x the fleet's error share, but only 0.4 points above it: under the margin
    assert compare(figures(error_share=0.006), figures(error_share=0.002)).promote
    # twice as slow, but 4 ms: under the p99 margin
    assert compare(figures(p99_ms=8.0), figures(p99_ms=4.0)).promote


def test_thresholds_are_the_callers() -> None:
    strict = Thresholds(p99_ms=Limit(1.05, 1.0))
    assert not compare(figures(p99_ms=195.0), figures(), strict).promote


def test_too_little_traffic_is_not_promoted() -> None:
    verdict = compare(figures(requests=5, windows=1), figures(requests=0, windows=0))
    assert not verdict.promote
    assert verdict.reasons == (
        "too little to judge: 5 requests from the canary in 1 windows (at least 20 needed)",
        "too little to judge: 0 requests from the fleet in 0 windows (at least 20 needed)",
    )
