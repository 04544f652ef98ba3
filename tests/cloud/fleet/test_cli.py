"""`edgeinfer cloud fleet-template`: the template to stdout or a file with the values given as its
defaults; a bad value is one line on stderr and a non-zero exit, before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from edgeinfer.cli import main


def test_it_writes_the_template_to_stdout_with_the_values_given_as_defaults(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(
        [
            "cloud",
            "fleet-template",
            "--instance-type",
            "g5.2xlarge",
            "--max-size",
            "8",
            "--target-busy-share",
            "75",
            "--connections-per-router",
            "12",
            "--fleet-name",
            "prod",
            "--subnets",
            "subnet-0123456789abcdef0, subnet-0fedcba9876543210",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    parameters = yaml.safe_load(out)["Parameters"]
    assert parameters["InstanceType"]["Default"] == "g5.2xlarge"
    assert parameters["MaxSize"]["Default"] == 8
    assert parameters["TargetBusyShare"]["Default"] == 75
    assert parameters["ConnectionsPerRouter"]["Default"] == 12
    assert parameters["FleetName"]["Default"] == "prod"
    assert parameters["Subnets"]["Default"] == "subnet-0123456789abcdef0,subnet-0fedcba9876543210"


def test_it_writes_a_file_and_says_what_deploy_still_needs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "fleet.yaml"
    assert main(["cloud", "fleet-template", "-o", str(out), "--vpc-id", "vpc-0123456789abcdef0"]) == 0
    assert yaml.safe_load(out.read_text())["Parameters"]["VpcId"]["Default"] == "vpc-0123456789abcdef0"
    err = capsys.readouterr().err
    assert f"wrote {out}" in err
    assert "IotEndpoint" in err
    assert "VpcId" not in err
    assert "CAPABILITY_IAM" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--instance-type", "t2.micro"], "--instance-type: 't2.micro' is not one of"),
        (["--min-size", "4", "--max-size", "2"], "--min-size <= --desired-capacity <= --max-size"),
        (["--target-busy-share", "0.6"], "--target-busy-share: 0.6 is out of range (5 to 95 (percent))"),
        (["--iot-endpoint", "example.com"], "--iot-endpoint: 'example.com' is not an AWS IoT data endpoint"),
    ],
)
def test_bad_input_is_one_line_and_a_non_zero_exit_writing_nothing(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "fleet.yaml"
    code = main(["cloud", "fleet-template", "-o", str(out), *argv])
    captured = capsys.readouterr()
    assert code != 0
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert captured.err.startswith("edgeinfer: error: ")
    assert message in captured.err
    assert not out.exists()


def test_help_teaches_the_metric_the_credentials_and_how_to_deploy(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["cloud", "fleet-template", "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    for needed in (
        "edgeinfer/router BusyShare",
        "Secrets Manager",
        "aws cloudformation deploy",
        "CAPABILITY_IAM",
        "--connections-per-router",
        "g5.xlarge",
        "template default: 60",
        "asked for at deploy",
    ):
        assert needed in text, needed
