"""Configuration: camelCase recipe keys, coercion, validation reasons, the recipe's defaults."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jsonschema
import yaml

from edgeinfer.runtime.config import (
    RuntimeConfig,
    camel,
    default_recipe_configuration,
    diff_keys,
    engine_keys_changed,
)
from tests.helpers import PROJECT

ROOT = PROJECT
RECIPE = ROOT / "recipes" / "com.edgeinfer.InferenceRuntime.yaml"
SCHEMA = Path("/work/shared/schemas/greengrass-recipe.schema.json")


def test_camel() -> None:
    assert camel("max_queue_delay_us") == "maxQueueDelayUs"
    assert camel("trt_fp16_enable") == "trtFp16Enable"


def test_round_trip_and_aliases() -> None:
    doc = default_recipe_configuration()
    doc["executionProviders"] = ["cuda", "cpu"]
    doc["maxBatchSize"] = 4.0  # JSON numbers may come as floats
    doc["tensorrt"]["trtFp16Enable"] = "false"
    doc["accessControl"] = {"ignored": True}
    cfg, problems = RuntimeConfig.from_recipe(doc)
    assert problems == []
    assert cfg.execution_providers == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert cfg.max_batch_size == 4
    assert cfg.tensorrt.trt_fp16_enable is False


def test_invalid_values_give_reasons_and_a_usable_config() -> None:
    cfg, problems = RuntimeConfig.from_recipe(
        {
            "maxBatchSize": 0,
            "maxQueueDelayUs": "soon",
            "executionProviders": ["warp-drive"],
            "source": {"kind": "video"},
            "cuda": "fast",
            "cpu": {"decodeNice": 25, "fullSessionMaxContention": 1.5, "laneMaxBatchSize": -1},
        }
    )
    text = " | ".join(problems)
    assert "maxBatchSize must be from 1 to 256" in text
    assert "maxQueueDelayUs must be an integer" in text
    assert "unknown provider 'warp-drive'" in text
    assert "source.uri is required" in text
    assert "cuda must be an object" in text
    assert "cpu.decodeNice must be from 0 to 19" in text
    assert "cpu.fullSessionMaxContention must be from 0 (never) to 1 (always)" in text
    assert "cpu.laneMaxBatchSize must be from 0 (the lane's share of maxBatchSize) to 1024" in text
    assert cfg.max_queue_delay_us == RuntimeConfig().max_queue_delay_us


def test_live_cpu_keys_need_no_new_engine() -> None:
    a = RuntimeConfig()
    live = dataclasses.replace(
        a.cpu, full_session_max_contention=0.5, decode_nice=5, opencv_threads=2, lane_max_batch_size=2
    )
    b = dataclasses.replace(a, cpu=live)
    assert diff_keys(a, b) == {"cpu"}
    assert engine_keys_changed(a, b) == set()  # the batcher, decode pool and process take them
    c = dataclasses.replace(b, cpu=dataclasses.replace(live, lanes=1))
    assert engine_keys_changed(a, c) == {"cpu"}  # a session option: a new engine
    assert engine_keys_changed(a, dataclasses.replace(a, max_batch_size=4)) == {"max_batch_size"}
    assert engine_keys_changed(a, dataclasses.replace(a, max_queue_delay_us=1)) == set()


def test_diff_keys() -> None:
    a, b = RuntimeConfig(), RuntimeConfig(max_queue_delay_us=1)
    b.tensorrt.trt_fp16_enable = False
    assert diff_keys(a, b) == {"max_queue_delay_us", "tensorrt"}


def test_recipe_matches_defaults_and_schema() -> None:
    recipe = yaml.safe_load(RECIPE.read_text())
    lowered = _lower_keys(recipe)
    jsonschema.validate(lowered, _schema())
    default = recipe["ComponentConfiguration"]["DefaultConfiguration"]
    _cfg, problems = RuntimeConfig.from_recipe(default)
    assert problems == []
    ours = default_recipe_configuration()
    for key, value in ours.items():
        assert default[key] == value, key
    deps = recipe["ComponentDependencies"]
    assert deps["com.edgeinfer.ModelStore"]["DependencyType"] == "HARD"
    assert deps["com.edgeinfer.RuntimeInstaller"]["DependencyType"] == "HARD"
    platforms = {m["Platform"]["architecture"] for m in recipe["Manifests"]}
    assert platforms == {"amd64", "aarch64"}
    acl = default["accessControl"]
    resources = {r for policies in acl.values() for policy in policies.values() for r in policy["resources"]}
    assert all("{iot:thingName}" in r or r == "edgeinfer/local/timings" for r in resources)


def _schema() -> dict[str, object]:
    import json

    return dict(json.loads(SCHEMA.read_text()))


def _lower_keys(node: object, depth: int = 0) -> object:
    # The schema spells recipe keys in lower case (Greengrass reads them case-insensitively), but the
    # configuration values below DefaultConfiguration keep their case.
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            lk = k.lower()
            out[lk] = v if lk in ("defaultconfiguration", "setenv") else _lower_keys(v, depth + 1)
        return out
    if isinstance(node, list):
        return [_lower_keys(v, depth + 1) for v in node]
    return node
