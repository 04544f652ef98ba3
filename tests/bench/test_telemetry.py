"""`edgeinfer bench telemetry` runs its per-record part and writes its JSON (figures not asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgeinfer.cli import main


def test_bench_per_record_part_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "results" / "telemetry.json"
    code = main(
        ["bench", "telemetry", "--no-runtime", "--records", "640", "--repeats", "1", "--json", str(out)]
    )
    assert code == 0
    doc = json.loads(out.read_text())
    pr = doc["per_record"]
    assert pr["records"] == 640
    for key in ("raw_json_decode_us_per_record", "telemetry_aggregate_us_per_record", "window_close_ms"):
        assert pr[key] > 0
    assert doc["saturated"] is None
    assert doc["estimate"]["service_time_source"].startswith("assumed")
    assert isinstance(doc["pass"], bool)
    assert "bench telemetry" in capsys.readouterr().out


def test_bench_refuses_silly_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "telemetry", "--no-runtime", "--records", "3"]) == 2
    assert "--records" in capsys.readouterr().err
