"""`edgeinfer bench sim`'s IoT Core part: a tiny real flood through mosquitto, `sim up` and a sink."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeinfer.cli import main
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


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--iot-size", "4", "--iot-size must be 8 to 131072"),
        ("--iot-size", "140000", "IoT Core's message limit"),
        ("--iot-messages", "-1", "--iot-messages must be 0"),
        ("--iot-delay-ms", "-5", "--iot-delay-ms must be 0 or more"),
    ],
)
def test_bad_iot_options_are_one_line_errors_before_anything_starts(
    option: str, value: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "sim", option, value]) != 0
    err = capsys.readouterr().err.strip()
    assert says in err
    assert len(err.splitlines()) == 1
