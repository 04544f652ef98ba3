"""Shared pieces of the publish/deploy tests: a built bundle (fake model store), moto, Stubber helpers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Final

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from edgeinfer import __version__
from edgeinfer.bundle.build import Bundle, build_bundle
from edgeinfer_cloud.publish import Clients, component_arn
from tests.helpers import PROJECT as ROOT
from tests.helpers.model_store import write_model_store

REGION: Final = "eu-central-1"
BUCKET = "my-edge-artifacts"  # exactly what a user would type
NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


class Capture:
    """An expected parameter that matches anything and remembers what it saw."""

    def __init__(self) -> None:
        self.values: list[Any] = []

    def __eq__(self, other: object) -> bool:
        self.values.append(other)
        return True

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = None  # type: ignore[assignment]


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for key in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    with mock_aws():
        yield


@pytest.fixture
def bundle(tmp_path: Path) -> Bundle:
    artifacts = tmp_path / "artifacts"
    write_model_store(artifacts / "com.edgeinfer.ModelStore" / __version__)
    return build_bundle(ROOT, artifacts_dir=artifacts, out_dir=tmp_path / "greengrass-build")


@pytest.fixture
def clients(aws_env: None) -> Iterator[tuple[Clients, Stubber]]:
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
    gg = boto3.client("greengrassv2", region_name=REGION)
    with Stubber(gg) as stub:
        yield Clients(sts=boto3.client("sts", region_name=REGION), s3=s3, greengrassv2=gg), stub
        stub.assert_no_pending_responses()


def account(c: Clients) -> str:
    return str(c.sts.get_caller_identity()["Account"])


def expect_missing(stub: Stubber, arn: str) -> None:
    stub.add_client_error(
        "get_component",
        service_error_code="ResourceNotFoundException",
        service_message="not found",
        http_status_code=404,
        expected_params={"arn": arn, "recipeOutputFormat": "JSON"},
    )


def expect_existing(stub: Stubber, arn: str, recipe: dict[str, Any]) -> None:
    stub.add_response(
        "get_component",
        {"recipeOutputFormat": "JSON", "recipe": json.dumps(recipe).encode()},
        expected_params={"arn": arn, "recipeOutputFormat": "JSON"},
    )


def expect_create(stub: Stubber, arn: str, name: str, version: str, recipe: Capture) -> None:
    stub.add_response(
        "create_component_version",
        {
            "arn": arn,
            "componentName": name,
            "componentVersion": version,
            "creationTimestamp": NOW,
            "status": {"componentState": "REQUESTED", "message": "requested"},
        },
        expected_params={"inlineRecipe": recipe, "clientToken": Capture()},
    )
    stub.add_response(
        "describe_component",
        {
            "arn": arn,
            "componentName": name,
            "componentVersion": version,
            "status": {"componentState": "DEPLOYABLE"},
        },
        expected_params={"arn": arn},
    )


def expect_create_deployment(
    stub: Stubber, target: str, components: Any, deployment_id: str, job: Any = None
) -> Any:
    """CreateDeployment to `target` with `components` (and `job`, the iotJobConfiguration, when given),
    answered with `deployment_id`; returns what is matched against the job (a Capture when not given)."""
    job = Capture() if job is None else job
    stub.add_response(
        "create_deployment",
        {
            "deploymentId": deployment_id,
            "iotJobId": "job-1",
            "iotJobArn": "arn:aws:iot:eu-central-1:111122223333:job/job-1",
        },
        expected_params={
            "targetArn": target,
            "deploymentName": Capture(),
            "components": components,
            "iotJobConfiguration": job,
            "deploymentPolicies": Capture(),
            "clientToken": Capture(),
        },
    )
    return job


def expect_core_devices(stub: Stubber, group_arn: str, names: list[str], status: str = "HEALTHY") -> None:
    """ListCoreDevices of a thing group: `names`, each in `status`."""
    devices = [{"coreDeviceThingName": n, "status": status, "lastStatusUpdateTimestamp": NOW} for n in names]
    stub.add_response(
        "list_core_devices", {"coreDevices": devices}, expected_params={"thingGroupArn": group_arn}
    )


def expect_effective(
    stub: Stubber,
    device: str,
    status: str,
    *,
    deployment: tuple[str, str, str],
    reason: str = "",
) -> None:
    """ListEffectiveDeployments of `device`: the `deployment` (id, name, target ARN) in `status`."""
    deployment_id, name, target_arn = deployment
    entry = {
        "deploymentId": deployment_id,
        "deploymentName": name,
        "targetArn": target_arn,
        "coreDeviceExecutionStatus": status,
        "creationTimestamp": NOW,
        "modifiedTimestamp": NOW,
    }
    if reason:
        entry["reason"] = reason
    stub.add_response(
        "list_effective_deployments",
        {"effectiveDeployments": [entry]},
        expected_params={"coreDeviceThingName": device},
    )


def arns(c: Clients, bundle: Bundle) -> list[str]:
    acct = account(c)
    return [component_arn(REGION, acct, comp.name, comp.version) for comp in bundle.components]
