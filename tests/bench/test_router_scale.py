"""`edgeinfer_bench.router_scale`: throughput follows the connections until the backend binds."""

from __future__ import annotations

import json
from pathlib import Path

from edgeinfer_bench.router_scale import main


def test_a_short_run_answers_everything_and_writes_its_table(tmp_path: Path) -> None:
    out = tmp_path / "router-scale.json"
    argv = ["--connections", "1,3", "--offloads", "12", "--pacing-scale", "0.2", "--json", str(out)]
    assert main([*argv, "--item-ms", "5", "--batch-ms", "5"]) == 0
    report = json.loads(out.read_text())
    rows = {row["connections"]: row for row in report["rows"]}
    assert set(rows) == {1, 3}
    assert all(row["ok"] == row["answered"] == 12 for row in rows.values())
    assert rows[3]["answers_per_s"] > rows[1]["answers_per_s"]  # the connections bind, not the backend
