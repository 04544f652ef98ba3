"""`edgeinfer capture list | pull` end to end on moto's server, and the loop closed: the pulled folder
calibrates and gates `edgeinfer model build`, whose report names it."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import pytest

from edgeinfer.cli import main
from edgeinfer.errors import EdgeinferError
from edgeinfer.model.field import FieldSet
from edgeinfer.model.manifest import Manifest
from tests.cloud.capture.conftest import BUCKET, DAY, Cloud
from tests.model.conftest import make_tiny_classifier


def _run(args: list[str], cloud: Cloud, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["capture", *args, "--bucket", BUCKET, "--s3-endpoint", cloud.endpoint])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip()


def _one_line(err: str) -> str:
    err = err.strip()
    assert "\n" not in err, err
    assert "Traceback" not in err, err
    assert err.startswith("edgeinfer: error: "), err
    return err


@pytest.fixture
def fleet(cloud: Cloud) -> Cloud:
    cloud.group("cams", ["cam-a", "cam-b", "cam-idle"])
    for i in range(8):
        cloud.capture(["cam-a", "cam-b"][i % 2], "tiny", "1.0.0", DAY + 60 * i, seed=i)
    cloud.capture("cam-a", "tiny", "2.0.0", DAY + 86400 * 3, seed=99)  # three days on, a new version
    cloud.capture("cam-a", "other", "1.0.0", DAY, seed=100)
    return cloud


def test_list_counts_records_per_thing_model_and_version(
    fleet: Cloud, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(["list", "--group", "cams", "--model", "tiny"], fleet, capsys)
    assert code == 0
    lines = out.splitlines()
    assert [line.split()[:4] for line in lines[:3]] == [
        ["cam-a", "tiny", "1.0.0", "4"],
        ["cam-a", "tiny", "2.0.0", "1"],
        ["cam-b", "tiny", "1.0.0", "4"],
    ]
    assert lines[3].startswith("9 record(s), ")
    assert "from 2 of 3 thing(s)" in lines[3]

    code, out, _ = _run(
        ["list", "--group", "cams", "--model", "tiny", "--until", "2026-01-02", "--json"], fleet, capsys
    )
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) == 8
    assert {r["version"] for r in rows} == {"1.0.0"}
    code, out, _ = _run(
        ["list", "--thing", "cam-a", "--model", "tiny", "--since", "2026-01-03"], fleet, capsys
    )
    assert out.splitlines()[-1].startswith("1 record(s)")


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["--group", "nope", "--model", "tiny"], "ListThingsInThingGroup failed: ResourceNotFoundException"),
        (
            ["--thing", "cam-a", "--model", "tiny", "--since", "last week"],
            "--since: not a date or an ISO time",
        ),
        (
            ["--thing", "cam-a", "--model", "tiny", "--since", "2026-01-05", "--until", "2026-01-01"],
            "is not before --until",
        ),
        (["--thing", "cam-a", "--model", "tiny", "--recursive"], "--recursive goes with --group"),
    ],
)
def test_bad_queries_are_one_line_and_non_zero(
    fleet: Cloud, capsys: pytest.CaptureFixture[str], args: list[str], expect: str
) -> None:
    code, _, err = _run(["list", *args], fleet, capsys)
    assert code != 0
    assert expect in _one_line(err)


def test_a_missing_bucket_and_an_empty_pull_are_one_line_and_non_zero(
    fleet: Cloud, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(["capture", "list", "--thing", "cam-a", "--model", "tiny", "--bucket", "no-such-bucket",
                 "--s3-endpoint", fleet.endpoint])  # fmt: skip
    assert code != 0
    assert "NoSuchBucket" in _one_line(capsys.readouterr().err)
    code, _, err = _run(
        ["pull", "--thing", "cam-idle", "--model", "tiny", "-o", str(tmp_path / "f")], fleet, capsys
    )
    assert code != 0
    assert "no captured records of tiny for 1 thing(s)" in _one_line(err)


@pytest.mark.parametrize("gate_on_field", [False, True])
def test_pull_then_build_calibrates_and_gates_on_the_field(
    fleet: Cloud, capsys: pytest.CaptureFixture[str], tmp_path: Path, gate_on_field: bool
) -> None:
    import onnx

    out = tmp_path / "field"
    query = ["--group", "cams", "--model", "tiny", "--version", "1.0.0", "--quiet", "-o", str(out)]
    code, said, _ = _run(["pull", *query], fleet, capsys)
    assert code == 0
    assert re.fullmatch(
        rf"8 record\(s\) in {out}: 16 file\(s\) downloaded \([\d.]+ KB\), 0 already there", said.strip()
    )
    code, said, _ = _run(["pull", *query], fleet, capsys)
    assert code == 0
    assert "0 file(s) downloaded (0 B), 16 already there" in said

    model = tmp_path / "tiny.onnx"
    onnx.save(make_tiny_classifier(), str(model))
    store = tmp_path / "store"
    validation = ["--validation", str(out)] if gate_on_field else []
    code = main(["model", "build", "--quiet", "--onnx", str(model), "--out", str(store),
                 "--calibration", str(out), *validation])  # fmt: skip
    said = capsys.readouterr().out
    assert code == 0, said
    manifest = Manifest.load(store)
    assert manifest.validation["passed"] is True  # at the gate's default thresholds
    [entry] = manifest.validation["field_sets"]
    assert (entry["folder"], entry["records"], entry["things"]) == (str(out), 8, ["cam-a", "cam-b"])
    assert entry["models"] == ["tiny 1.0.0"]
    role = "the gate's set, not held out" if gate_on_field else "calibration, not held out"
    assert f"field set ({role}): {out}, 8 records from cam-a, cam-b (tiny 1.0.0)" in said
    assert entry["agreement"]["int8-cpu"]["count"] == 8
    assert "int8-cpu       on the field's images: top-1" in said
    field_set = FieldSet.load(out)
    assert field_set is not None
    assert len(field_set.pulls) == 2


class _CutOff:
    """boto3's session, whose S3 reads time out after `left` objects, as a network does mid-pull."""

    def __init__(self, left: int) -> None:
        import boto3

        self.session: Any = boto3.Session()
        self.left = left

    def client(self, service: str, **kw: Any) -> Any:
        client = self.session.client(service, **kw)
        if service != "s3":
            return client
        real = client.get_object

        def get_object(**params: Any) -> Any:
            if self.left == 0:
                from botocore.exceptions import ReadTimeoutError

                raise ReadTimeoutError(endpoint_url="http://s3")
            self.left -= 1
            return real(**params)

        client.get_object = get_object
        return client


def test_a_pull_cut_off_says_so_in_one_line_and_the_next_finishes(
    fleet: Cloud, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from edgeinfer_cloud.capture.cli import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    out = tmp_path / "field"
    query = ["--group", "cams", "--model", "tiny", "--version", "1.0.0", "--quiet", "-o", str(out)]
    where = ["--bucket", BUCKET, "--s3-endpoint", fleet.endpoint, "--jobs", "1"]
    args = parser.parse_args(["capture", "pull", *query, *where])
    with pytest.raises(EdgeinferError, match=r"^pull stopped: Read timeout .*: run the same pull to finish$"):
        args.func(args, lambda profile, region: _CutOff(5))  # two records whole, the third's image
    field_set = FieldSet.load(out)
    assert field_set is not None
    assert len(field_set.records) == 2
    code, said, _ = _run(["pull", *query], fleet, capsys)
    assert code == 0
    assert "8 record(s)" in said
    assert "11 file(s) downloaded" in said
    assert "5 already there" in said
