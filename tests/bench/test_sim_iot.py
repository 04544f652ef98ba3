"""`edgeinfer bench sim`'s IoT Core part: a tiny real flood through mosquitto, `sim up` and a sink."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeinfer_bench.sim_iot import flood


def test_a_tiny_flood_arrives_exactly_once_and_each_message_is_answered(tmp_path: Path) -> None:
    out = flood(tmp_path, 200, 4096, echo=True, timeout_s=60)
    assert (out["messages"], out["size"]) == (200, 4096)
    assert out["received"] == out["distinct"] == 200
    assert out["duplicates"] == 0
    assert out["answered"] == 200
    assert out["through_nucleus_per_s"] > 0
    assert out["nucleus_cpu_s_per_1000"] > 0
    assert out["nucleus_peak_rss_mb"] > 0
    base = out["mqtt_baseline"]
    assert base["received"] == base["distinct"] == 200
    assert base["duplicates"] == 0
    assert base["msgs_per_s"] > 0
    assert out["ratio_msgs_per_s_vs_mqtt"] == pytest.approx(
        out["through_nucleus_per_s"] / base["msgs_per_s"], rel=0.01
    )
