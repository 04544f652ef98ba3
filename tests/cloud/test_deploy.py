"""`edgeinfer deploy`: every greengrassv2 call through botocore's Stubber (parameters validated)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from botocore.stub import Stubber

from edgeinfer import __version__, cli
from edgeinfer.bundle.build import dependency_order, load_recipes
from edgeinfer_cloud import aws_cli
from edgeinfer_cloud.deploy import (
    AbortCriterion,
    DeployError,
    Deployment,
    Following,
    JobConfig,
    component_spec,
    deploy,
    parse_abort,
    parse_config_merge,
    parse_target,
)
from tests.cloud.aws_fixtures import (
    NOW,
    ROOT,
    Capture,
    expect_core_devices,
    expect_create_deployment,
    expect_effective,
)

THING_ARN = "arn:aws:iot:eu-central-1:111122223333:thing/line-7-camera"
GROUP_ARN = "arn:aws:iot:eu-central-1:111122223333:thinggroup/factory-a"
DEPLOYMENT = "a1b2c3d4-5678-90ab-cdef-EXAMPLE11111"
COMPONENTS = {
    "com.edgeinfer.ModelStore": __version__,
    "com.edgeinfer.RuntimeInstaller": __version__,
    "com.edgeinfer.InferenceRuntime": __version__,
    "com.edgeinfer.Telemetry": __version__,
}


def bundle(
    arn: str, merges: dict[str, dict[str, Any]] | None = None, *, job: JobConfig | None = None
) -> Deployment:
    """The deployment of COMPONENTS (with `merges`) to `arn`."""
    return Deployment(
        parse_target(arn), component_spec(COMPONENTS, merges), iot_job_configuration=job or JobConfig()
    )


def no_sleep(seconds: float) -> None:
    """Following's poll interval, spent at once."""


def effective(stub: Stubber, device: str, status: str, reason: str = "") -> None:
    expect_effective(stub, device, status, deployment=(DEPLOYMENT, "edgeinfer", THING_ARN), reason=reason)


def test_deploy_sends_versions_and_config_merges(gg: tuple[Any, Stubber]) -> None:
    client, stub = gg
    merges = parse_config_merge(['com.edgeinfer.InferenceRuntime={"maxBatchSize": 4}'], list(COMPONENTS))
    expected: dict[str, dict[str, Any]] = {
        name: {"componentVersion": version} for name, version in COMPONENTS.items()
    }
    expected["com.edgeinfer.InferenceRuntime"]["configurationUpdate"] = {"merge": '{"maxBatchSize":4}'}
    expect_create_deployment(stub, THING_ARN, expected, DEPLOYMENT)
    report = deploy(client, bundle(THING_ARN, merges))
    assert report.deployment_id == DEPLOYMENT
    assert report.statuses == {}


def test_wait_follows_a_thing_until_it_succeeds(gg: tuple[Any, Stubber]) -> None:
    client, stub = gg
    expect_create_deployment(stub, THING_ARN, Capture(), DEPLOYMENT)
    effective(stub, "line-7-camera", "QUEUED")
    effective(stub, "line-7-camera", "IN_PROGRESS")
    effective(stub, "line-7-camera", "SUCCEEDED")
    lines: list[str] = []
    report = deploy(
        client, bundle(THING_ARN), wait=True, following=Following(say=lines.append, sleep=no_sleep)
    )
    assert report.statuses == {"line-7-camera": "SUCCEEDED"}
    assert [line.strip() for line in lines[1:]] == [
        "line-7-camera: QUEUED",
        "line-7-camera: IN_PROGRESS",
        "line-7-camera: SUCCEEDED",
    ]


def test_wait_on_a_group_reports_the_failed_device(gg: tuple[Any, Stubber]) -> None:
    client, stub = gg
    expect_create_deployment(stub, GROUP_ARN, Capture(), DEPLOYMENT)
    expect_core_devices(stub, GROUP_ARN, ["cam-1", "cam-2"])
    effective(stub, "cam-1", "SUCCEEDED")
    effective(stub, "cam-2", "FAILED", "com.edgeinfer.RuntimeInstaller errored during install")
    with pytest.raises(DeployError, match=r"cam-2: FAILED \(com\.edgeinfer\.RuntimeInstaller errored") as err:
        deploy(client, bundle(GROUP_ARN), wait=True, following=Following(sleep=no_sleep))
    assert "cam-1" not in str(err.value)


def test_wait_follows_every_page_of_devices_and_deployments(gg: tuple[Any, Stubber]) -> None:
    client, stub = gg
    expect_create_deployment(stub, GROUP_ARN, Capture(), DEPLOYMENT)
    for page, (name, token) in enumerate((("cam-1", "p2"), ("cam-2", None))):
        response: dict[str, Any] = {
            "coreDevices": [
                {"coreDeviceThingName": name, "status": "HEALTHY", "lastStatusUpdateTimestamp": NOW}
            ]
        }
        params: dict[str, Any] = {"thingGroupArn": GROUP_ARN}
        if token:
            response["nextToken"] = token
        if page:
            params["nextToken"] = "p2"
        stub.add_response("list_core_devices", response, expected_params=params)
    other = {
        "deploymentId": "an-older-one",
        "deploymentName": "old",
        "targetArn": GROUP_ARN,
        "coreDeviceExecutionStatus": "FAILED",
        "creationTimestamp": NOW,
        "modifiedTimestamp": NOW,
    }
    stub.add_response(
        "list_effective_deployments",
        {"effectiveDeployments": [other], "nextToken": "e2"},
        expected_params={"coreDeviceThingName": "cam-1"},
    )
    stub.add_response(
        "list_effective_deployments",
        {"effectiveDeployments": []},
        expected_params={"coreDeviceThingName": "cam-1", "nextToken": "e2"},
    )
    effective(stub, "cam-2", "SUCCEEDED")
    effective(stub, "cam-1", "SUCCEEDED")
    report = deploy(client, bundle(GROUP_ARN), wait=True, following=Following(sleep=no_sleep))
    assert report.statuses == {"cam-1": "SUCCEEDED", "cam-2": "SUCCEEDED"}


def test_wait_times_out_with_the_last_state(gg: tuple[Any, Stubber]) -> None:
    client, stub = gg
    expect_create_deployment(stub, THING_ARN, Capture(), DEPLOYMENT)
    effective(stub, "line-7-camera", "IN_PROGRESS")
    ticks = iter([0.0, 10.0])
    with pytest.raises(DeployError, match=r"not finished after 5 s \(line-7-camera: IN_PROGRESS\)"):
        deploy(
            client,
            bundle(THING_ARN),
            wait=True,
            following=Following(timeout_s=5, clock=lambda: next(ticks), sleep=no_sleep),
        )


@pytest.mark.parametrize(
    ("item", "match"),
    [
        ("com.edgeinfer.Nope={}", "not in the bundle"),
        ("com.edgeinfer.Telemetry={not json", "not valid JSON"),
        ("com.edgeinfer.Telemetry=[1]", "must be an object"),
        ("just-text", "COMPONENT=JSON"),
    ],
)
def test_bad_config_merge_is_one_line(item: str, match: str) -> None:
    with pytest.raises(DeployError, match=match):
        parse_config_merge([item], list(COMPONENTS))


@pytest.mark.parametrize("arn", ["line-7-camera", "arn:aws:iot:eu-central-1:111122223333:policy/x", ""])
def test_bad_target_is_refused(arn: str) -> None:
    with pytest.raises(DeployError, match="thing or thing group ARN"):
        parse_target(arn)


def test_cli_deploys_the_bundle_versions(
    gg: tuple[Any, Stubber], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    client, stub = gg
    recipes = load_recipes(ROOT)
    versions = {name: recipes[name].version for name in dependency_order(recipes)}
    captured = Capture()
    expect_create_deployment(stub, THING_ARN, captured, DEPLOYMENT)

    class Session:
        def client(self, name: str) -> Any:
            assert name == "greengrassv2"
            return client

    monkeypatch.setattr(aws_cli, "_session", lambda profile, region: Session())
    code = cli.main(
        [
            "deploy",
            "--target",
            THING_ARN,
            "--project",
            str(ROOT),
            "--config-merge",
            'com.edgeinfer.RuntimeInstaller={"enableTensorRT": true}',
        ]
    )
    assert code == 0
    sent = captured.values[0]
    assert {name: spec["componentVersion"] for name, spec in sent.items()} == versions
    assert json.loads(sent["com.edgeinfer.RuntimeInstaller"]["configurationUpdate"]["merge"]) == {
        "enableTensorRT": True
    }
    assert DEPLOYMENT in capsys.readouterr().out


def test_cli_bad_target_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert cli.main(["deploy", "--target", "not-an-arn", "--project", str(ROOT)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("edgeinfer: error: --target must be")
    assert err.count("\n") == 1


def test_cli_access_denied_is_one_line(
    gg: tuple[Any, Stubber], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    client, stub = gg
    stub.add_client_error(
        "create_deployment",
        service_error_code="AccessDeniedException",
        service_message="User is not authorized to perform greengrass:CreateDeployment",
        http_status_code=403,
    )

    class Session:
        def client(self, name: str) -> Any:
            return client

    monkeypatch.setattr(aws_cli, "_session", lambda profile, region: Session())
    assert cli.main(["deploy", "--target", THING_ARN, "--project", str(ROOT)]) == 2
    err = capsys.readouterr().err
    assert err == (
        "edgeinfer: error: CreateDeployment failed: AccessDeniedException: "
        "User is not authorized to perform greengrass:CreateDeployment\n"
    )


def test_cli_deploy_without_credentials_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for key in [k for k in __import__("os").environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    assert cli.main(["deploy", "--target", THING_ARN, "--project", str(ROOT)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("edgeinfer: error: no AWS credentials found")
    assert err.count("\n") == 1


DEFAULT_JOB = {
    "jobExecutionsRolloutConfig": {
        "maximumPerMinute": 50,
        "exponentialRate": {
            "baseRatePerMinute": 5,
            "incrementFactor": 2.0,
            "rateIncreaseCriteria": {"numberOfSucceededThings": 5},
        },
    },
    "abortConfig": {
        "criteriaList": [
            {
                "failureType": "ALL",
                "action": "CANCEL",
                "thresholdPercentage": 10.0,
                "minNumberOfExecutedThings": 5,
            }
        ]
    },
    "timeoutConfig": {"inProgressTimeoutInMinutes": 60},
}


def test_deploy_sends_the_default_job_configuration_and_rollback(gg: tuple[Any, Stubber]) -> None:
    client, stub = gg
    policies = Capture()
    stub.add_response(
        "create_deployment",
        {"deploymentId": DEPLOYMENT},
        expected_params={
            "targetArn": GROUP_ARN,
            "deploymentName": "edgeinfer-factory-a",
            "components": Capture(),
            "iotJobConfiguration": DEFAULT_JOB,
            "deploymentPolicies": policies,
            "clientToken": Capture(),
        },
    )
    deploy(client, bundle(GROUP_ARN))
    assert policies.values[0]["failureHandlingPolicy"] == "ROLLBACK"


def test_deploy_sends_a_job_configuration_as_given(gg: tuple[Any, Stubber]) -> None:
    client, stub = gg
    job = JobConfig(
        max_per_minute=200,
        start_per_minute=20,
        increment_factor=1.5,
        increase_after=50,
        abort=(AbortCriterion("FAILED", 5.0, 20), AbortCriterion("TIMED_OUT", 12.5, 20)),
        timeout_minutes=10080,
    )
    job.check()
    expect_create_deployment(
        stub,
        GROUP_ARN,
        Capture(),
        DEPLOYMENT,
        {
            "jobExecutionsRolloutConfig": {
                "maximumPerMinute": 200,
                "exponentialRate": {
                    "baseRatePerMinute": 20,
                    "incrementFactor": 1.5,
                    "rateIncreaseCriteria": {"numberOfSucceededThings": 50},
                },
            },
            "abortConfig": {
                "criteriaList": [
                    {
                        "failureType": "FAILED",
                        "action": "CANCEL",
                        "thresholdPercentage": 5.0,
                        "minNumberOfExecutedThings": 20,
                    },
                    {
                        "failureType": "TIMED_OUT",
                        "action": "CANCEL",
                        "thresholdPercentage": 12.5,
                        "minNumberOfExecutedThings": 20,
                    },
                ]
            },
            "timeoutConfig": {"inProgressTimeoutInMinutes": 10080},
        },
    )
    deploy(client, bundle(GROUP_ARN, job=job))


def test_no_abort_leaves_the_abort_config_out(gg: tuple[Any, Stubber]) -> None:
    client, stub = gg
    job = JobConfig(abort=parse_abort(["none"], 5))
    expected = {k: v for k, v in DEFAULT_JOB.items() if k != "abortConfig"}
    expect_create_deployment(stub, THING_ARN, Capture(), DEPLOYMENT, expected)
    deploy(client, bundle(THING_ARN, job=job))


def test_parse_abort_reads_each_type() -> None:
    assert parse_abort(["all=10", "REJECTED=2.555"], 3) == (
        AbortCriterion("ALL", 10.0, 3),
        AbortCriterion("REJECTED", 2.56, 3),
    )


@pytest.mark.parametrize(
    ("job", "match"),
    [
        (JobConfig(max_per_minute=0), "--rollout-max must be between 1 and 1000"),
        (JobConfig(start_per_minute=60), "--rollout-start must be between 1 and 50"),
        (JobConfig(increment_factor=6), "--rollout-factor must be between 1 and 5"),
        (JobConfig(increase_after=0), "--rollout-step must be at least 1"),
        (JobConfig(timeout_minutes=20000), "--job-timeout must be between 1 and 10080"),
        (JobConfig(abort=(AbortCriterion("ALL", 0.0),)), "--abort ALL must be between"),
        (JobConfig(abort=(AbortCriterion("ALL", 10, 0),)), "--abort-min-things must be at least 1"),
    ],
)
def test_bad_job_configuration_is_one_line(job: JobConfig, match: str) -> None:
    with pytest.raises(DeployError, match=match):
        job.check()


@pytest.mark.parametrize("item", ["SOMETIMES=5", "ALL", "ALL=lots"])
def test_bad_abort_is_refused(item: str) -> None:
    with pytest.raises(DeployError, match="--abort"):
        parse_abort([item], 5)


def test_cli_takes_the_rollout_options(gg: tuple[Any, Stubber], monkeypatch: pytest.MonkeyPatch) -> None:
    client, stub = gg
    job = Capture()
    expect_create_deployment(stub, GROUP_ARN, Capture(), DEPLOYMENT, job)

    class Session:
        def client(self, name: str) -> Any:
            return client

    monkeypatch.setattr(aws_cli, "_session", lambda profile, region: Session())
    argv = ["deploy", "--target", GROUP_ARN, "--project", str(ROOT), "--rollout-max", "100"]
    argv += ["--rollout-start", "10", "--rollout-factor", "3", "--rollout-step", "25", "--job-timeout", "30"]
    argv += ["--abort", "FAILED=5", "--abort", "TIMED_OUT=20", "--abort-min-things", "10"]
    assert cli.main(argv) == 0
    sent = job.values[0]
    assert sent["jobExecutionsRolloutConfig"] == {
        "maximumPerMinute": 100,
        "exponentialRate": {
            "baseRatePerMinute": 10,
            "incrementFactor": 3.0,
            "rateIncreaseCriteria": {"numberOfSucceededThings": 25},
        },
    }
    assert [(c["failureType"], c["thresholdPercentage"]) for c in sent["abortConfig"]["criteriaList"]] == [
        ("FAILED", 5.0),
        ("TIMED_OUT", 20.0),
    ]
    assert {c["minNumberOfExecutedThings"] for c in sent["abortConfig"]["criteriaList"]} == {10}
    assert sent["timeoutConfig"] == {"inProgressTimeoutInMinutes": 30}


def test_cli_refuses_a_rollout_the_service_would_refuse(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["deploy", "--target", GROUP_ARN, "--project", str(ROOT), "--rollout-start", "80"]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == "edgeinfer: error: --rollout-start must be between 1 and 50, got 80\n"
