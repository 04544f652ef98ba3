"""`edgeinfer bench models` end to end on tiny stores: every round loads one of the two others while
the pinned model is asked, and the figures come out side by side."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from edgeinfer.errors import EdgeinferError
from edgeinfer.model.manifest import Manifest
from edgeinfer_bench import models
from tests.helpers.tiny_store import write_tiny_store


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    models.register_bench(parser.add_subparsers())
    return parser.parse_args(["models", *argv])


def test_a_short_run_measures_both_sides_and_loads_every_round(tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    store = write_tiny_store(tmp_path / "pinned")
    other = write_tiny_store(tmp_path / "other")
    manifest = Manifest.load(other)
    manifest.name = "other"
    manifest.save(other)
    out_file = tmp_path / "models.json"
    args = parse(
        "--store", str(store), "--detector", str(other), "--rounds", "2", "--rate", "40",
        "--steady-s", "0.5", "--max-batch-size", "2", "--json", str(out_file),
    )  # fmt: skip
    assert args.func(args) == 0
    out = json.loads(out_file.read_text())
    assert out["others"] == ["other", f"{Manifest.load(store).name}-copy"]
    assert len(out["load_s"]) == 2
    assert all(s > 0 for s in out["load_s"])
    assert out["result"]["steady"]["n"] > 0
    assert out["result"]["loading"]["n"] > 0
    assert out["background"] == {"pace": 2.0, "nice": 19, "every_size": True}
    assert isinstance(out["target"]["met"], bool)


def test_against_measures_two_settings_in_turns_in_one_run(tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    store = write_tiny_store(tmp_path / "pinned")
    other = write_tiny_store(tmp_path / "other")
    manifest = Manifest.load(other)
    manifest.name = "other"
    manifest.save(other)
    out_file = tmp_path / "models.json"
    args = parse(
        "--store", str(store), "--detector", str(other), "--rounds", "2", "--rate", "40",
        "--steady-s", "0.3", "--max-batch-size", "2", "--against", "plain", "--json", str(out_file),
    )  # fmt: skip
    assert args.func(args) == 0
    out = json.loads(out_file.read_text())
    assert sorted(out["modes"]) == ["default", "plain"]
    assert out["modes"]["plain"]["background"] == "plain"
    assert out["result"] == out["modes"]["default"]["result"]
    for mode in out["modes"].values():
        assert len(mode["load_s"]) == 2  # one load of each other model
        assert mode["result"]["loading"]["n"] > 0


@pytest.mark.parametrize("text", ["fast", '{"speed": 2}', "[1]"])
def test_an_unknown_background_is_one_line(text: str) -> None:
    with pytest.raises(EdgeinferError, match="--background"):
        models.background_settings(text)
