"""`edgeinfer bench iot` (edgeinfer_bench.iot itself): short real runs on the tiny model (slow)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from edgeinfer.cli import main
from edgeinfer_bench.iot.processes import PROCESSES


def short_run(tmp_path: Path, *options: str) -> dict[str, Any]:
    """`edgeinfer bench iot` for one second a load, then a flood of 100, on the tiny model: its report."""
    pytest.importorskip("onnx")
    from tests.helpers.tiny_store import write_tiny_store

    store = write_tiny_store(tmp_path / "store")
    out = tmp_path / "iot.json"
    argv = ["bench", "iot", "--store", str(store), "--seconds", "1", "--flood", "100", *options]
    assert main([*argv, "--gap", "0.2", "--recovery-timeout", "20", "--json", str(out)]) == 0
    report: dict[str, Any] = json.loads(out.read_text())
    return report


@pytest.mark.slow
def test_a_short_run_answers_every_request_exactly_once(tmp_path: Path) -> None:
    report = short_run(tmp_path, "--rates", "20,50")
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
    report = short_run(tmp_path, "--rates", "20", "--expiry-s", "1")
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
