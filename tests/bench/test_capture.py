"""`edgeinfer bench capture`'s parts that run without a simulated core: B's configuration reads as
the runtime reads it, the bucket is counted by whole records, bad arguments are one line."""

from __future__ import annotations

import urllib.request

import pytest

from edgeinfer.capture.config import CaptureConfig
from edgeinfer.cli import main
from edgeinfer_bench.capture import BUCKET, S3Server, _records, capture_config


def test_b_is_capture_on_with_a_random_share_and_a_confidence_band() -> None:
    cfg = CaptureConfig.from_recipe(capture_config("http://127.0.0.1:9", 0.1, 0.3, 0.6)["capture"])
    assert cfg.enabled
    assert cfg.endpoint == "http://127.0.0.1:9"
    settings = cfg.for_model("any-model")
    assert settings is not None
    assert [(s.kind, s.share, s.low, s.high) for s in settings.samplers] == [
        ("random", 0.1, 0.0, 1.0),
        ("confidence", 0.0, 0.3, 0.6),
    ]


@pytest.mark.devtool  # moto's S3 server
def test_the_bucket_is_counted_by_whole_records() -> None:
    server = S3Server()
    endpoint = server.endpoint
    try:
        for key in ("a/1.jpg", "a/1.json", "a/2.jpg"):  # record 2's document not there yet
            put = urllib.request.Request(f"{endpoint}/{BUCKET}/{key}", data=b"x", method="PUT")
            urllib.request.urlopen(put, timeout=30).close()
        assert _records(endpoint) == 1
    finally:
        server.stop()


@pytest.mark.devtool  # the installed command line
def test_bad_arguments_are_one_line_and_nonzero(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "capture", "--low", "0.7", "--high", "0.3"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--low" in err
