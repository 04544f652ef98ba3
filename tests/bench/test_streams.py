"""`edgeinfer bench streams`: its arguments, and one short run of one stream each way."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from edgeinfer.cli import main
from edgeinfer_bench.rtsp import available
from edgeinfer_bench.streams import run_streams

pytestmark = pytest.mark.devtool  # the installed command line


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--streams", "2,x"], "--streams"),
        (["--streams", "0"], "--streams"),
        (["--seconds", "0"], "--seconds"),
    ],
)
def test_bad_arguments_are_one_line_and_nonzero(
    args: list[str], names: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "streams", *args]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert names in err


@pytest.mark.slow
def test_one_stream_each_way_is_kept_up_with(model_store: Path) -> None:
    why = available()
    if why is not None:
        pytest.skip(why)
    args = argparse.Namespace(streams="1", fps=5.0, seconds=2.0, model_dir=str(model_store), json=None)
    out = run_streams(args)
    (row,) = out["rows"]
    assert row["streams"] == 1
    assert {"raw", "runtime"} <= set(row)
    assert out["target"] == 0.85
