"""The telemetry recipe: valid against the Greengrass schema, least-privilege access, matching config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from edgeinfer.messages import TIMINGS_TOPIC
from edgeinfer.telemetry.component import TelemetryConfig

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "com.edgeinfer.Telemetry.yaml"
SCHEMA = ROOT.parent / "shared" / "schemas" / "greengrass-recipe.schema.json"


def lower_keys(node: Any) -> Any:
    """Greengrass reads recipe keys case-insensitively; the schema spells them lower-case."""
    if isinstance(node, dict):
        return {str(k).lower(): lower_keys(v) for k, v in node.items()}
    if isinstance(node, list):
        return [lower_keys(v) for v in node]
    return node


@pytest.fixture(scope="module")
def recipe() -> dict[str, Any]:
    return dict(yaml.safe_load(RECIPE.read_text("utf-8")))


@pytest.mark.skipif(not SCHEMA.exists(), reason="the shared recipe schema is not present")
def test_recipe_is_valid(recipe: dict[str, Any]) -> None:
    schema = json.loads(SCHEMA.read_text("utf-8"))
    jsonschema.validate(lower_keys(recipe), schema)


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
    assert set(defaults) == set(TelemetryConfig.__dataclass_fields__)


def test_linux_manifests_run_the_installer_venv(recipe: dict[str, Any]) -> None:
    arches = {m["Platform"]["architecture"] for m in recipe["Manifests"]}
    assert arches == {"amd64", "aarch64"}
    for manifest in recipe["Manifests"]:
        assert manifest["Platform"]["os"] == "linux"
        run = manifest["Lifecycle"]["Run"]
        assert run == (
            "{kernel:rootPath}/work/com.edgeinfer.RuntimeInstaller/venv/bin/python -m edgeinfer.telemetry"
        )
    assert "com.edgeinfer.RuntimeInstaller" in recipe["ComponentDependencies"]
