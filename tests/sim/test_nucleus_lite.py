"""`nucleus="lite"`: recipes, variables, lifecycles, configuration and IPC as nucleus lite treats them."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from awsiot.greengrasscoreipc.model import ResourceNotFoundError, ServiceError, UnauthorizedError

from edgeinfer.sim import RecipeError, Simulator
from tests.helpers.sim import Device
from tests.helpers.wait import eventually

LITE = {"os": "linux", "runtime": "*"}


def _lite(device: Device, name: str, lifecycle: dict[str, Any], **kwargs: Any) -> None:
    """A component with a manifest both nuclei read (Platform.runtime "*")."""
    device.add(name, lifecycle=lifecycle, platform=LITE, **kwargs)


def test_a_manifest_without_a_runtime_is_not_seen(
    simulator: Callable[..., Simulator], device: Device
) -> None:
    device.add("com.example.Old", lifecycle={"run": "sleep 30"}, platform={"os": "linux"})  # no runtime
    with pytest.raises(RecipeError, match=r"Old-1\.0\.0\.yaml: Manifests: No lifecycle was found for linux"):
        simulator(device.recipes, device.artifacts, nucleus="lite")
    sim = simulator(device.recipes, device.artifacts, nucleus="classic")  # classic ignores the key
    assert sim.wait_for_state("com.example.Old", "RUNNING") == "RUNNING"


def test_lifecycle_keys_in_lower_case_only_and_no_artifacts_only_finish(
    simulator: Callable[..., Simulator], device: Device
) -> None:
    _lite(device, "com.example.Upper", {"Install": "echo never", "run": "echo ran; sleep 30"})
    _lite(device, "com.example.Store", {})
    sim = simulator(device.recipes, device.artifacts, nucleus="lite")
    assert sim.wait_for_state("com.example.Upper", "RUNNING") == "RUNNING"
    log = sim.logs("com.example.Upper")
    assert "ran" in log
    assert "never" not in log
    assert "lifecycle.Install" not in log
    # The store's refusal need not come before the other component runs: wait for it, then leave
    # room for a wrong FINISHED to show.
    eventually(
        lambda: (
            sim.state("com.example.Store") == "INSTALLED"
            and "a lifecycle with no phase is not supported" in sim.logs("com.example.Store")
        ),
        30,
        "the store INSTALLED with its refusal logged",
    )
    time.sleep(0.5)
    assert sim.state("com.example.Store") == "INSTALLED"  # never FINISHED


def test_a_hard_dependency_on_an_install_only_component_never_starts(
    simulator: Callable[..., Simulator], device: Device
) -> None:
    _lite(device, "com.example.Installer", {"install": "true"})
    _lite(
        device,
        "com.example.App",
        {"run": "sleep 30"},
        deps={"com.example.Installer": {"DependencyType": "HARD"}},
    )
    _lite(
        device,
        "com.example.Soft",
        {"run": "sleep 30"},
        deps={"com.example.Installer": {"DependencyType": "SOFT"}},
    )
    sim = simulator(device.recipes, device.artifacts, nucleus="lite")
    assert sim.wait_for_state("com.example.Soft", "RUNNING") == "RUNNING"
    assert sim.state("com.example.Installer") == "FINISHED"
    assert sim.state("com.example.App") == "NEW"
    assert "systemd BindsTo=" in sim.logs("com.example.App")


def test_variables_as_lite_writes_them(simulator: Callable[..., Simulator], device: Device) -> None:
    config = {"allow": [{"archs": ["x86_64"], "n": 8}], "flag": True, "n": 8}
    _lite(
        device,
        "com.example.Vars",
        {
            "run": "echo list={configuration:/allow} n={configuration:/n}; echo work={work:path}; "
            "echo sock=${AWS_GG_NUCLEUS_DOMAIN_SOCKET_FILEPATH:-none}; sleep 30"
        },
        config=config,
    )
    _lite(device, "com.example.Missing", {"run": "echo {configuration:/nope}"})
    _lite(
        device,
        "com.example.Cross",
        {"run": "echo {com.example.Vars:work:path}"},
        deps={"com.example.Vars": {"DependencyType": "SOFT"}},
    )
    sim = simulator(device.recipes, device.artifacts, nucleus="lite", max_errors=1)
    assert sim.wait_for_state("com.example.Vars", "RUNNING") == "RUNNING"
    assert sim.wait_for_state("com.example.Missing", "BROKEN") == "BROKEN"
    assert sim.wait_for_state("com.example.Cross", "BROKEN") == "BROKEN"
    log = sim.logs("com.example.Vars")
    assert 'list=[{"archs":["x86_64"],"n":"8"}] n=8' in log  # sh drops the backslashes lite wrote
    assert f"work={sim.root}/work/com.example.Vars/" in log
    assert "sock=none" in log  # lite sets only ..._FOR_COMPONENT
    assert "{configuration:/nope}: no such configuration value" in sim.logs("com.example.Missing")
    assert "variables of another component are not supported" in sim.logs("com.example.Cross")
    # YAML defaults are stored as strings
    assert sim.configuration("com.example.Vars")["n"] == "8"
    assert sim.configuration("com.example.Vars")["allow"] == [{"archs": ["x86_64"], "n": "8"}]
    assert sim.configuration("com.example.Vars")["flag"] == "true"


def test_ipc_as_lite_answers_it(
    simulator: Callable[..., Simulator], device: Device, ipc_clients: Any
) -> None:
    _lite(device, "com.example.A", {"run": "sleep 30"}, config={"limits": {"max": 4}})
    sim = simulator(device.recipes, device.artifacts, nucleus="lite")
    a = ipc_clients(sim, "com.example.A")
    for call in (
        lambda: a.subscribe_to_validate_configuration_updates(on_stream_event=print),
        lambda: a.subscribe_to_component_updates(on_stream_event=print),
        lambda: a.pause_component(component_name="com.example.A"),
    ):
        with pytest.raises(ServiceError):
            call()
    with pytest.raises(ResourceNotFoundError) as missing:
        a.get_configuration(key_path=["nope"])
    assert missing.value.message == ""
    with pytest.raises(UnauthorizedError) as refused:
        a.publish_to_topic(topic="x", publish_message=_binary())
    assert refused.value.message == ""
    # a leaf keyPath is accepted and the leaf replaced; values written over IPC keep their type
    now = _now()
    a.update_configuration(key_path=["limits", "max"], timestamp=now, value_to_merge=9)  # type: ignore[arg-type]
    assert sim.configuration("com.example.A")["limits"] == {"max": 9}


def _binary() -> Any:
    from awsiot.greengrasscoreipc.model import BinaryMessage, PublishMessage

    return PublishMessage(binary_message=BinaryMessage(message=b"x"))


def _now() -> Any:
    import datetime as dt

    return dt.datetime.now(dt.timezone.utc)


def test_platform_regexes_are_literal_on_lite(simulator: Callable[..., Simulator], device: Device) -> None:
    device.add(
        "com.example.Re",
        lifecycle={"run": "sleep 30"},
        platform={"os": "linux", "architecture": "/.*/", "runtime": "*"},
    )
    with pytest.raises(RecipeError, match=r"Re-1\.0\.0\.yaml: Manifests: no manifest matches this platform"):
        simulator(device.recipes, device.artifacts, nucleus="lite")
    sim = simulator(device.recipes, device.artifacts, nucleus="classic")
    assert sim.wait_for_state("com.example.Re", "RUNNING") == "RUNNING"
