"""`edgeinfer bench compare`: the pairing arithmetic, and a short real run on the simulated core."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgeinfer.cli import main
from edgeinfer_bench.compare import summarize


def test_summarize_counts_the_rounds_b_is_ahead_in() -> None:
    rounds = [
        {"saturated_rps": (150.0, 180.0), "p50_ms": (10.0, 9.0)},
        {"saturated_rps": (170.0, 160.0), "p50_ms": (9.0, 9.5)},
        {"saturated_rps": (140.0, 190.0), "p50_ms": (11.0, 10.0)},
    ]
    out = summarize(rounds)
    sat, p50 = out["saturated_rps"], out["p50_ms"]
    assert sat["median_a"] == 150.0
    assert sat["median_b"] == 180.0
    assert sat["b_over_a"] == pytest.approx(1.2)
    assert sat["b_ahead"] == 2  # higher is better
    assert p50["b_ahead"] == 2  # lower is better
    assert p50["rounds"] == 3


def test_bad_configuration_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "compare", "[1]", "{}"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "JSON object" in err[0]


@pytest.mark.e2e
def test_short_run_on_a_tiny_model(tiny_store: Path, tmp_path: Path) -> None:
    out_file = tmp_path / "compare.json"
    rc = main(
        [
            "bench", "compare", '{"cpu": {"lanes": 1}}', "{}",
            "--model-dir", str(tiny_store), "--rounds", "2", "--requests", "3", "--saturate", "16",
            "--rate", "20", "--duration", "0.5", "--json", str(out_file),
        ]
    )  # fmt: skip
    assert rc == 0
    doc = json.loads(out_file.read_text())
    assert doc["a"] == {"cpu": {"lanes": 1}}
    for key in ("saturated_rps", "p50_ms", "open_p50_ms", "open_p99_ms", "open_p99_over_p50"):
        pairs = doc["figures"][key]["pairs"]
        assert len(pairs) == 2  # A then B, then B then A: both orders measured, each into its own side
        assert all(a > 0 and b > 0 for a, b in pairs)
