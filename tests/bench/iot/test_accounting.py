"""edgeinfer_bench.iot.accounting: each request counted once, late and expired answers placed, the targets."""

from __future__ import annotations

import pytest

from edgeinfer.messages import ErrorCode, Result, error_result
from edgeinfer_bench.iot.accounting import summarize, targets
from edgeinfer_bench.iot.processes import PROCESSES


def test_summarize_counts_each_request_once_and_places_late_answers() -> None:
    sent = [("a", 100.0), ("b", 100.0), ("c", 100.0), ("d", 100.0), ("e", 100.0)]
    ok = Result("a", "ok", "")
    answers = {
        "a": [(100.05, ok)],  # ok in time
        "b": [(100.2, Result("b", "ok", "")), (100.3, Result("b", "ok", ""))],  # ok late, and a duplicate
        "c": [(100.01, error_result("c", ErrorCode.DEADLINE_EXCEEDED, "x", timestamp=""))],
        "e": [(200.0, ok)],  # after the 30 s window: lost
    }
    out = summarize(sent, answers, load_end=101.0, deadline_ms=100.0)
    assert out["sent"] == 5
    assert out["answered"] == 3
    assert out["lost"] == 2
    assert out["answered_after_window"] == 1
    assert out["duplicates"] == 1
    assert not out["exactly_once"]
    assert out["ok_in_time"] == 1
    assert out["ok_late"] == 1
    assert out["codes"] == {"DEADLINE_EXCEEDED": 1}
    assert out["last_answer_after_load_s"] == pytest.approx(-0.8)
    assert summarize([], {}, load_end=0.0, deadline_ms=100.0)["ok_p50_ms"] is None


def test_with_expiry_an_unanswered_request_is_lost_only_where_a_later_one_proves_it_was_delivered() -> None:
    sent = [("a", 100.0), ("b", 100.5), ("c", 103.0), ("d", 103.3), ("e", 104.0)]
    ok = Result("x", "ok", "")
    answers = {"a": [(100.2, ok)], "d": [(103.6, ok)]}
    out = summarize(sent, answers, load_end=104.0, deadline_ms=100.0, expiry_s=1)
    # b: the next answer (d) came 3.1 s after b was sent, past its expiry; e: nothing answered after
    # it; c: d, sent after c, was answered 0.6 s after c was sent, so c reached the device in time
    assert (out["unanswered"], out["expired_in_broker"], out["lost"]) == (3, 2, 1)
    assert out["expiry_s"] == 1
    assert not out["exactly_once"]
    assert summarize(sent, answers, 104.0, 100.0, expiry_s=5)["expired_in_broker"] == 1  # only e
    plain = summarize(sent, answers, load_end=104.0, deadline_ms=100.0)
    assert (plain["unanswered"], plain["expired_in_broker"], plain["lost"]) == (3, None, 3)


def test_targets_follow_the_done_means() -> None:
    rss = {name: {"rss_peak_mb": 100.0, "rss_last_mb": 90.0, "cpu_cores": 0.5} for name in PROCESSES}
    load = {
        "label": "flood",
        "sent": 1000,
        "exactly_once": True,
        "fresh_request_ok_after_s": 6.0,
        "ok_late": 10,
        "processes": rss,
    }
    assert targets([load], rss_limit_mb=1024) == {
        "flood_exactly_once_within_30s": True,
        "flood_fresh_request_ok_within_5s": False,
        "flood_ok_late_at_most_1pct": True,
        "flood_device_rss_peak_under_1024mb": True,
        "flood_broker_rss_peak_under_1024mb": True,
    }
    # never recovered, one ok-late answer too many, memory over the limit
    worse = targets([{**load, "fresh_request_ok_after_s": None, "ok_late": 11}], rss_limit_mb=50)
    assert worse == {
        "flood_exactly_once_within_30s": True,
        "flood_fresh_request_ok_within_5s": False,
        "flood_ok_late_at_most_1pct": False,
        "flood_device_rss_peak_under_50mb": False,
        "flood_broker_rss_peak_under_50mb": False,
    }
    # with expiry the broker may discard by the sender's instruction: the target says so in its name
    expiring = targets([{**load, "expiry_s": 1}], rss_limit_mb=1024)
    assert expiring["flood_exactly_once_or_expired_within_30s"] is True
    assert "flood_exactly_once_within_30s" not in expiring
