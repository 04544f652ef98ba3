"""The runtime's configuration: recipe keys, both nuclei's typing, refusals, the recipe's defaults."""

from __future__ import annotations

import dataclasses

import jsonschema
import pytest
import yaml

from edgeinfer.messages import IPC_MAX_BYTES
from edgeinfer.runtime.config import (
    ConfigError,
    CpuOptions,
    CudaOptions,
    RuntimeConfig,
    TensorrtOptions,
    camel,
    default_recipe_configuration,
    diff_keys,
    engine_keys_changed,
)
from tests.helpers import PROJECT
from tests.helpers.config import lite_typed

ROOT = PROJECT
RECIPE = ROOT / "recipes" / "com.edgeinfer.InferenceRuntime.yaml"
SCHEMA = ROOT / "components" / "edgeinfer" / "bundle" / "schemas" / "greengrass-recipe.schema.json"


def test_camel() -> None:
    assert camel("max_queue_delay_us") == "maxQueueDelayUs"
    assert camel("trt_fp16_enable") == "trtFp16Enable"


def test_round_trip_and_aliases() -> None:
    doc = default_recipe_configuration()
    doc["executionProviders"] = ["cuda", "cpu"]
    doc["maxBatchSize"] = 4.0  # JSON numbers may come as floats
    doc["tensorrt"] = {"trtFp16Enable": "false"}  # a merged key of a node whose default ships in code
    doc["accessControl"] = {"ignored": True}
    cfg = RuntimeConfig.from_recipe(doc)
    assert cfg.execution_providers == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert cfg.max_batch_size == 4
    assert cfg.tensorrt.trt_fp16_enable is False


def test_classic_and_lite_typing_give_the_same_config() -> None:
    doc = default_recipe_configuration()
    doc.update({"maxBatchSize": 4, "defaultDeadlineMs": 12.5, "imageFolders": ["/data"]})
    doc["tensorrt"] = {"trtFp16Enable": True}
    doc["source"] = {**doc["source"], "kind": "folder", "uri": "/data", "rateHz": 2}
    classic = RuntimeConfig.from_recipe(doc)
    lite = lite_typed(doc)
    assert lite["maxBatchSize"] == "4"
    assert lite["tensorrt"]["trtFp16Enable"] == "true"
    assert RuntimeConfig.from_recipe(lite) == classic
    # A list as nucleus lite interpolates it (JSON, quotes escaped) reads as the list.
    escaped = dict(lite, executionProviders='[\\"cuda\\",\\"cpu\\"]')
    assert RuntimeConfig.from_recipe(escaped).execution_providers == [
        "CUDAExecutionProvider",
        "CPUExecutionProvider",
    ]


def test_invalid_values_are_one_error_naming_every_key() -> None:
    with pytest.raises(ConfigError) as err:
        RuntimeConfig.from_recipe(
            {
                "maxBatchSize": 0,
                "maxQueueDelayUs": "soon",
                "executionProviders": ["warp-drive"],
                "source": {"kind": "video"},
                "cuda": "fast",
                "decodeNice": 25,
                "fullSessionMaxContention": 1.5,
                "laneMaxBatchSize": -1,
            }
        )
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith("configuration of com.edgeinfer.InferenceRuntime: ")
    assert "maxQueueDelayUs: must be an integer, got 'soon'" in text
    assert "cuda: must be a map, got 'fast'" in text
    assert "source.uri: is required for kind 'video'" in text
    # Range checks run once the types read: a second error names them.
    with pytest.raises(ConfigError) as err:
        RuntimeConfig.from_recipe(
            {
                "maxBatchSize": 0,
                "executionProviders": ["warp-drive"],
                "decodeNice": 25,
                "fullSessionMaxContention": 1.5,
                "laneMaxBatchSize": -1,
            }
        )
    text = str(err.value)
    assert "maxBatchSize: must be from 1 to 256" in text
    assert "executionProviders: unknown provider 'warp-drive'" in text
    assert "decodeNice: must be from 0 to 19" in text
    assert "fullSessionMaxContention: must be from 0 (never) to 1 (always)" in text
    assert "laneMaxBatchSize: must be from 0 (the lane's share of maxBatchSize) to 1024" in text
    assert err.value.path == "executionProviders"


def test_unknown_keys_are_warned_by_name(caplog: pytest.LogCaptureFixture) -> None:
    cfg = RuntimeConfig.from_recipe({"maxBatchSise": 4, "cpu": {"lanes": 2}, "accessControl": {}})
    assert cfg == RuntimeConfig()
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warned == [
        "com.edgeinfer.InferenceRuntime: unknown configuration key maxBatchSise (ignored)",
        "com.edgeinfer.InferenceRuntime: unknown configuration key cpu.lanes (ignored)",
    ]


def test_ort_option_classes_hold_only_ort_options() -> None:
    # The names ORT's provider options and session configuration use; the runtime's own knobs
    # (IO binding, padded CUDA batches, lanes, decode priority) are RuntimeConfig's.
    assert {f.name for f in dataclasses.fields(TensorrtOptions)} <= {
        "trt_fp16_enable",
        "trt_int8_enable",
        "trt_engine_cache_enable",
        "trt_timing_cache_enable",
        "trt_max_workspace_size",
        "trt_builder_optimization_level",
        "trt_cuda_graph_enable",
        "device_id",
    }
    assert {f.name for f in dataclasses.fields(CudaOptions)} == {
        "cudnn_conv_algo_search",
        "do_copy_in_default_stream",
        "device_id",
    }
    assert {f.name for f in dataclasses.fields(CpuOptions)} == {
        "intra_op_num_threads",
        "allow_spinning",
        "force_spinning_stop",
    }
    for cls in (TensorrtOptions, CudaOptions, CpuOptions):
        assert "https://onnxruntime.ai/docs/" in (cls.__doc__ or "")


def test_live_keys_need_no_new_engine() -> None:
    a = RuntimeConfig()
    b = dataclasses.replace(
        a, full_session_max_contention=0.5, decode_nice=5, opencv_threads=2, lane_max_batch_size=2
    )
    assert engine_keys_changed(a, b) == set()  # the batcher, decode pool and process take them
    assert engine_keys_changed(a, dataclasses.replace(b, lanes=1)) == {"lanes"}  # a session: new engine
    assert engine_keys_changed(a, dataclasses.replace(a, cuda_fixed_batch=False)) == {"cuda_fixed_batch"}
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
    RuntimeConfig.from_recipe(default)
    ours = default_recipe_configuration()
    for key, value in ours.items():
        assert default[key] == value, key
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


def test_models_read_on_either_nucleus_with_their_refusals() -> None:
    from edgeinfer.runtime.config import ModelEntry

    doc = default_recipe_configuration()
    assert doc["models"] == []
    assert doc["maxLoadedModels"] == 0
    doc.update(
        models=[{"dir": "/stores/a"}, {"component": "com.example.Detector", "pinned": True, "preload": True}],
        maxLoadedModels=2,
    )
    classic = RuntimeConfig.from_recipe(doc)
    assert classic.models == [
        ModelEntry(dir="/stores/a"),
        ModelEntry(component="com.example.Detector", pinned=True, preload=True),
    ]
    assert RuntimeConfig.from_recipe(lite_typed(doc)) == classic
    for models, more, reason in (
        ([{"dir": "/a", "component": "c"}], {}, "models[0]: give exactly one of dir and component"),
        ([{}], {}, "models[0]: give exactly one of dir and component"),
        ([{"dir": "relative"}], {}, "models[0].dir: 'relative' must be an absolute path"),
        (
            [{"dir": "/a"}, {"dir": "/b", "pinned": True}],
            {"maxLoadedModels": 1},
            "maxLoadedModels: is below the 2 models always loaded (the first and pinned)",
        ),
    ):
        with pytest.raises(ConfigError) as err:
            RuntimeConfig.from_recipe(dict(doc, models=models, **more))
        assert err.value.reasons == reason
    assert not engine_keys_changed(classic, dataclasses.replace(classic, models=[], max_loaded_models=0))


def test_the_ipc_message_cap_ships_in_code_is_live_and_refused_below_1000() -> None:
    assert RuntimeConfig().max_ipc_message_bytes == IPC_MAX_BYTES  # what both nuclei carry
    assert "maxIpcMessageBytes" not in default_recipe_configuration()  # lite's recipe size budget
    for doc in ({"maxIpcMessageBytes": 16_777_216}, lite_typed({"maxIpcMessageBytes": 16_777_216})):
        assert RuntimeConfig.from_recipe(doc).max_ipc_message_bytes == 16_777_216
    with pytest.raises(ConfigError) as err:
        RuntimeConfig.from_recipe({"maxIpcMessageBytes": 999})
    assert "maxIpcMessageBytes: must be at least 1000" in str(err.value)
    a = RuntimeConfig()
    assert engine_keys_changed(a, dataclasses.replace(a, max_ipc_message_bytes=20_000)) == set()
