"""`edgeinfer bench iot`: its exactly-once bookkeeping, and one short real run on the tiny model (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgeinfer.cli import main
from edgeinfer.messages import ErrorCode, Result, error_result
from edgeinfer_bench.iot import PROCESSES, load_labels, summarize, targets


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


def test_each_load_has_its_own_label_for_its_request_ids() -> None:
    assert load_labels([100, 200, 100, 0.5], 2000) == [
        ("r100", 100),
        ("r200", 200),
        ("r100-2", 100),
        ("r0.5", 0.5),
        ("flood", 2000),
    ]
    assert load_labels([50], 0) == [("r50", 50)]


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


@pytest.mark.slow
def test_a_short_run_answers_every_request_exactly_once(tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    from tests.helpers.tiny_store import write_tiny_store

    store = write_tiny_store(tmp_path / "store")
    out = tmp_path / "iot.json"
    argv = ["bench", "iot", "--store", str(store), "--rates", "20,50", "--seconds", "1", "--flood", "100"]
    assert main([*argv, "--gap", "0.2", "--recovery-timeout", "20", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["scenario"] == "iot"
    assert [r["label"] for r in report["loads"]] == ["r20", "r50", "flood"]
    assert len(report["machine"]["loadavg_start"]) == 3
    for r in report["loads"]:
        assert r["sent"] > 0
        assert r["answered"] == r["sent"]
        assert r["lost"] == 0
        assert r["duplicates"] == 0
        assert r["exactly_once"]
        assert r["ok_in_time"] + r["ok_late"] + sum(r["codes"].values()) == r["sent"]
        assert r["probes"]["sent"] >= 1
        assert r["probes"]["ok_in_time"] >= 1
        assert r["probes"]["duplicates"] == 0
        for name in PROCESSES:
            assert r["processes"][name]["rss_peak_mb"] > 0
    assert report["never_answered"] == {"r20": 0, "r50": 0, "flood": 0}
    assert report["runtime_restarts"] == 0
    assert set(report["targets"]) >= {"r20_exactly_once_within_30s", "flood_fresh_request_ok_within_5s"}


@pytest.mark.slow
def test_a_short_run_with_message_expiry_answers_each_answered_request_once(tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    from tests.helpers.tiny_store import write_tiny_store

    store = write_tiny_store(tmp_path / "store")
    out = tmp_path / "iot.json"
    argv = ["bench", "iot", "--store", str(store), "--rates", "20", "--seconds", "1", "--flood", "100"]
    argv += ["--expiry-s", "1", "--gap", "0.2", "--recovery-timeout", "20", "--json", str(out)]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert report["message_expiry_s"] == 1
    assert "expired_in_broker" in report["target_values"]["lost_means"]
    for r in report["loads"]:
        assert r["expiry_s"] == 1
        assert r["sent"] > 0
        assert r["duplicates"] == 0
        assert r["probes"]["duplicates"] == 0
        assert isinstance(r["expired_in_broker"], int)
        assert isinstance(r["probes"]["expired_in_broker"], int)
        # every request is answered (once), answered late, or unanswered: expired or lost
        assert r["answered"] + r["answered_after_window"] + r["unanswered"] == r["sent"]
        assert r["unanswered"] == r["expired_in_broker"] + r["lost"] - r["answered_after_window"]
        assert r["ok_in_time"] + r["ok_late"] + sum(r["codes"].values()) == r["answered"]
        assert "publish_messages_dropped" in r["broker_sys_settled"]
    assert set(report["never_answered"]) == {"r20", "flood"}
    assert report["broker_sys_end"]["publish_messages_dropped"] == 0  # no queue limit was reached
    assert set(report["targets"]) >= {
        "r20_exactly_once_or_expired_within_30s",
        "flood_fresh_request_ok_within_5s",
    }
