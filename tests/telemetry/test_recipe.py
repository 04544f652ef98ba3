"""The telemetry recipe: valid against the Greengrass schema, least-privilege access, matching config."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from edgeinfer.bundle.build import validate_recipe
from edgeinfer.messages import TIMINGS_TOPIC
from edgeinfer.telemetry.component import TelemetryConfig
from tests.helpers import PROJECT

ROOT = PROJECT
RECIPE = ROOT / "recipes" / "com.edgeinfer.Telemetry.yaml"


@pytest.fixture(scope="module")
def recipe() -> dict[str, Any]:
    return dict(yaml.safe_load(RECIPE.read_text("utf-8")))


def test_recipe_is_valid(recipe: dict[str, Any]) -> None:
    # The GDK's recipe schema, as the bundle ships it (keys lower-cased as the GDK does).
    assert validate_recipe(recipe) == []


def test_access_control_grants_only_what_is_used(recipe: dict[str, Any]) -> None:
    access = recipe["ComponentConfiguration"]["DefaultConfiguration"]["accessControl"]
    assert set(access) == {"aws.greengrass.ipc.pubsub", "aws.greengrass.ipc.mqttproxy"}
    (local,) = access["aws.greengrass.ipc.pubsub"].values()
    assert local["operations"] == ["aws.greengrass#SubscribeToTopic"]
    assert local["resources"] == [TIMINGS_TOPIC]
    (iot,) = access["aws.greengrass.ipc.mqttproxy"].values()
    assert iot["operations"] == ["aws.greengrass#PublishToIoTCore"]
    assert iot["resources"] == ["edgeinfer/{iot:thingName}/telemetry"]


def test_default_configuration_matches_the_code(recipe: dict[str, Any]) -> None:
    defaults = dict(recipe["ComponentConfiguration"]["DefaultConfiguration"])
    defaults.pop("accessControl")
    assert TelemetryConfig.from_dict(defaults) == TelemetryConfig()
    assert defaults == TelemetryConfig().to_dict()


def test_linux_manifest_runs_the_installer_venv(recipe: dict[str, Any]) -> None:
    (manifest,) = recipe["Manifests"]
    assert manifest["Platform"] == {"os": "linux", "runtime": "*"}
    run = manifest["Lifecycle"]["run"]["Script"]
    assert run.splitlines()[0] == "installer='{kernel:rootPath}/work/com.edgeinfer.RuntimeInstaller'"
    assert run.splitlines()[-1] == 'exec "$installer/venv/bin/python" -m edgeinfer.telemetry'
    assert recipe["ComponentDependencies"]["com.edgeinfer.RuntimeInstaller"]["DependencyType"] == "SOFT"
