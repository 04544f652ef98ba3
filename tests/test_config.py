"""The one configuration reader: keys, coercion from either nucleus's typing, refusals, live updates."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import pytest

from edgeinfer import config
from edgeinfer.config import ConfigError, recipe_key
from edgeinfer.errors import EdgeinferError
from edgeinfer.transport import MemoryBus

C = "com.example.Thing"


@dataclass
class Inner:
    device_id: int = 0
    names: list[str] = field(default_factory=list)

    def check(self) -> list[tuple[str, str]]:
        return [] if self.device_id < 8 else [("deviceId", "must be below 8")]


@dataclass
class Example:
    max_batch_size: int = 8
    rate_hz: float = 1.0
    enabled: bool = True
    name: str = "x"
    enable_tensor_rt: bool = field(default=False, metadata=recipe_key("enableTensorRT"))
    topics: list[str] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    rows: list[Inner] = field(default_factory=list)
    inner: Inner = field(default_factory=Inner)
    opaque: dict[str, Any] = field(default_factory=dict)

    def check(self) -> list[tuple[str, str]]:
        return [] if self.max_batch_size >= 1 else [("maxBatchSize", "must be at least 1")]


def read(doc: Any) -> Example:
    return config.read(Example, doc, component=C)


def test_keys_are_derived_in_one_place() -> None:
    assert config.camel("max_queue_delay_us") == "maxQueueDelayUs"
    keys = list(config.to_recipe(Example()))
    assert keys[:5] == ["maxBatchSize", "rateHz", "enabled", "name", "enableTensorRT"]
    assert config.key_for(Example, "enable_tensor_rt") == "enableTensorRT"
    assert config.to_recipe(Example(rows=[Inner(1)]))["rows"] == [{"deviceId": 1, "names": []}]
    assert read(config.to_recipe(Example())) == Example()
    assert read(None) == Example()


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ({"maxBatchSize": "8"}, {"max_batch_size": 8}),
        ({"maxBatchSize": 4.0}, {"max_batch_size": 4}),
        ({"maxBatchSize": " 16 "}, {"max_batch_size": 16}),
        ({"maxBatchSize": "1e3"}, {"max_batch_size": 1000}),
        ({"rateHz": "0.5"}, {"rate_hz": 0.5}),
        ({"rateHz": 2}, {"rate_hz": 2.0}),
        ({"enabled": "true"}, {"enabled": True}),
        ({"enabled": "False"}, {"enabled": False}),
        ({"enableTensorRT": "true"}, {"enable_tensor_rt": True}),
        ({"name": "y"}, {"name": "y"}),
        ({"topics": '["a", "b"]'}, {"topics": ["a", "b"]}),
        ({"topics": ""}, {"topics": []}),
        ({"topics": ["12", 13]}, {"topics": ["12", "13"]}),
        ({"versions": '{"numpy": "2.4.6"}'}, {"versions": {"numpy": "2.4.6"}}),
        ({"topics": '[\\"a\\",\\"b\\"]'}, {"topics": ["a", "b"]}),  # nucleus lite's escaped JSON
        ({"rows": '[{\\"deviceId\\":\\"3\\"}]'}, {"rows": [Inner(3)]}),
        ({"inner": {"deviceId": "2", "names": ["n"]}}, {"inner": Inner(2, ["n"])}),
        ({"inner": '{"deviceId": 1}'}, {"inner": Inner(1)}),
        ({"opaque": {"anything": [1, {"x": None}]}}, {"opaque": {"anything": [1, {"x": None}]}}),
    ],
)
def test_coercion_accepts_either_nucleus(doc: dict[str, Any], expected: dict[str, Any]) -> None:
    got = read(doc)
    for name, value in expected.items():
        assert getattr(got, name) == value


@pytest.mark.parametrize(
    ("doc", "line"),
    [
        ({"maxBatchSize": "many"}, "maxBatchSize: must be an integer, got 'many'"),
        ({"maxBatchSize": 1.5}, "maxBatchSize: must be an integer, got 1.5"),
        ({"maxBatchSize": True}, "maxBatchSize: must be an integer, got True"),
        ({"maxBatchSize": "inf"}, "maxBatchSize: must be an integer, got 'inf'"),
        ({"rateHz": "nan"}, "rateHz: must be a number, got 'nan'"),
        ({"enabled": "yes"}, "enabled: must be true or false, got 'yes'"),
        ({"enabled": 1}, "enabled: must be true or false, got 1"),
        ({"name": 1.5}, "name: must be a string, got 1.5"),
        ({"name": ["x"]}, "name: must be a string, got ['x']"),
        ({"topics": "a,b"}, "topics: must be a list, got 'a,b'"),
        ({"topics": "[not json"}, "topics: must be a list, got '[not json'"),
        ({"topics": [["a"]]}, "topics[0]: must be a string, got ['a']"),
        ({"versions": ["x"]}, "versions: must be a map, got ['x']"),
        ({"inner": "fast"}, "inner: must be a map, got 'fast'"),
        ({"inner": {"deviceId": "x"}}, "inner.deviceId: must be an integer, got 'x'"),
        ({"inner": {"deviceId": 9}}, "inner.deviceId: must be below 8"),
        ({"rows": [{"deviceId": 9}]}, "rows[0].deviceId: must be below 8"),
        ({"maxBatchSize": 0}, "maxBatchSize: must be at least 1"),
    ],
)
def test_nonsense_is_one_config_error_line(doc: dict[str, Any], line: str) -> None:
    with pytest.raises(ConfigError) as err:
        read(doc)
    assert str(err.value) == f"configuration of {C}: {line}"
    assert isinstance(err.value, EdgeinferError)
    assert err.value.reasons == line
    assert err.value.path == line.split(":", maxsplit=1)[0]


def test_every_refused_key_is_named_at_once() -> None:
    with pytest.raises(ConfigError) as err:
        read({"maxBatchSize": 0, "inner": {"deviceId": 9}, "enabled": "maybe"})
    # a value that does not read skips its own level's check (maxBatchSize >= 1), not a nested one's
    assert err.value.problems == [
        ("inner.deviceId", "must be below 8"),
        ("enabled", "must be true or false, got 'maybe'"),
    ]
    with pytest.raises(ConfigError) as err:
        read({"maxBatchSize": 0, "inner": {"deviceId": 9}})
    assert err.value.problems == [
        ("inner.deviceId", "must be below 8"),
        ("maxBatchSize", "must be at least 1"),
    ]
    assert "\n" not in str(err.value)


def test_unknown_keys_are_warned_by_name_and_component(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "edgeinfer.config")
    got = read({"maxBatchSise": 4, "inner": {"devceId": 1}, "accessControl": {"x": {}}})
    assert got == Example()
    assert [r.getMessage() for r in caplog.records] == [
        f"{C}: unknown configuration key maxBatchSise (ignored)",
        f"{C}: unknown configuration key inner.devceId (ignored)",
    ]


def test_overrides_for_local_runs() -> None:
    over = config.parse_overrides(["maxBatchSize=4", "inner.deviceId=2", 'topics=["t"]', "name=a=b"])
    assert over == {"maxBatchSize": "4", "inner": {"deviceId": "2"}, "topics": '["t"]', "name": "a=b"}
    doc = config.merge({"maxBatchSize": 8, "inner": {"names": ["n"]}}, over)
    assert read(doc) == Example(max_batch_size=4, name="a=b", topics=["t"], inner=Inner(2, ["n"]))
    for bad in ("maxBatchSize", "=4"):
        with pytest.raises(ConfigError, match="-o expects KEY=VALUE"):
            config.parse_overrides([bad])
    with pytest.raises(ConfigError, match="inner is set as a value and as a map"):
        config.parse_overrides(["inner=1", "inner.deviceId=2"])
    assert str(ConfigError("a message of its own")) == "a message of its own"


def test_subscribe_validates_where_the_nucleus_serves_it(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[list[str]] = []
    validate = config.validator(read)
    classic = MemoryBus(config={"maxBatchSize": 8})
    subs = config.subscribe(classic, C, seen.append, validate)
    assert len(subs) == 2
    assert classic.propose_configuration({"maxBatchSize": "x"}) == "maxBatchSize: must be an integer, got 'x'"
    assert classic.propose_configuration({"maxBatchSize": "4"}) is None
    assert seen == [["maxBatchSize"]]
    assert "validation is off" not in caplog.text


def test_subscribe_without_validation_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[list[str]] = []
    lite = MemoryBus(config={"maxBatchSize": "8"}, validation=False)  # answers like nucleus lite
    subs = config.subscribe(lite, C, seen.append, config.validator(read))
    assert len(subs) == 1
    off = [r for r in caplog.records if "live configuration validation is off" in r.getMessage()]
    assert len(off) == 1
    assert off[0].levelname == "WARNING"
    assert off[0].getMessage().startswith(f"{C}: ")
    assert lite.propose_configuration({"maxBatchSize": "x"}) is None  # applied: nothing validates
    assert seen == [["maxBatchSize"]]
