"""UpdateConfiguration and configuration-update events as each nucleus does them."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from awsiot.greengrasscoreipc.model import InvalidArgumentsError

from edgeinfer.sim import Simulator
from edgeinfer.sim.configuration import changed_paths
from tests.helpers.sim import Device

A = "com.example.A"
CONFIG = {"limits": {"max": 4, "names": ["x"]}, "flag": True}


class Events:
    def __init__(self) -> None:
        self.paths: list[list[str]] = []
        self.cond = threading.Condition()

    def __call__(self, event: Any) -> None:
        with self.cond:
            self.paths.append(list(event.configuration_update_event.key_path))
            self.cond.notify_all()

    def settle(self, n: int) -> list[list[str]]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.paths) >= n, 10), self.paths
        time.sleep(0.2)  # and no more than that
        return sorted(self.paths)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def test_changed_paths_per_node_and_per_leaf() -> None:
    old = {"a": 1, "b": {"c": 2}}
    new = {"a": 2, "d": {"e": 1, "f": {"g": 2}}}
    assert sorted(changed_paths(old, new, [])) == [["a"], ["b"], ["d"]]
    assert sorted(changed_paths(old, new, [], per_leaf=True)) == [
        ["a"],
        ["b", "c"],
        ["d", "e"],
        ["d", "f", "g"],
    ]


@pytest.mark.parametrize("nucleus", ["classic", "lite"])
def test_a_merge_of_several_values(
    simulator: Callable[..., Simulator], device: Device, ipc_clients: Any, nucleus: str
) -> None:
    device.add(A, config=CONFIG, platform={"os": "linux", "runtime": "*"})
    sim = simulator(device.recipes, device.artifacts, nucleus=nucleus)
    a = ipc_clients(sim, A)
    events = Events()
    a.subscribe_to_configuration_update(on_stream_event=events)
    a.update_configuration(
        key_path=[], timestamp=_now(), value_to_merge={"new": {"x": 1, "y": 2}, "flag": False}
    )
    got = events.settle(2 if nucleus == "classic" else 3)
    if nucleus == "classic":  # one event per changed node, the new subtree once
        assert got == [["flag"], ["new"]]
    else:  # one per leaf
        assert got == [["flag"], ["new", "x"], ["new", "y"]]
    assert sim.configuration(A)["new"] == {"x": 1, "y": 2}


@pytest.mark.classic_only("nucleus lite replaces a leaf UpdateConfiguration names (test_nucleus_lite.py)")
def test_update_of_a_leaf_keypath(
    simulator: Callable[..., Simulator], device: Device, ipc_clients: Any
) -> None:
    device.add(A, config=CONFIG)
    sim = simulator(device.recipes, device.artifacts)  # classic
    a = ipc_clients(sim, A)
    with pytest.raises(InvalidArgumentsError) as leaf:
        a.update_configuration(key_path=["limits", "max"], timestamp=_now(), value_to_merge={"max": 5})
    assert "leaf" in leaf.value.message
    with pytest.raises(InvalidArgumentsError) as inner:
        a.update_configuration(key_path=[], timestamp=_now(), value_to_merge={"limits": 3})
    assert "inner node" in inner.value.message
    with pytest.raises(InvalidArgumentsError) as acl:
        a.update_configuration(key_path=["accessControl"], timestamp=_now(), value_to_merge={"x": 1})
    assert acl.value.message == "Config update is not allowed for following fields [accessControl]"
    a.update_configuration(key_path=["limits"], timestamp=_now(), value_to_merge={"max": 5})
    assert sim.configuration(A)["limits"] == {"max": 5, "names": ["x"]}
    assert sim.configuration(A)["flag"] is True  # YAML defaults keep their type on classic
