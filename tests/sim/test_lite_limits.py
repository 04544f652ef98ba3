"""`nucleus="lite"`: where nucleus lite fails, the simulated core fails the same way (DESIGN, "What the
real nuclei do"): recipe limits, local-deployment unpacking, the run-unit wait, the 5,000-byte IoT Core
delivery limit, the 10,000-byte IPC limit, MQTT 5 properties, message-less errors, the missing
variable, systemd's PATH."""

from __future__ import annotations

import json
import time
import zipfile
from collections.abc import Callable
from io import BytesIO
from typing import Any

import pytest
from awsiot.greengrasscoreipc.model import QOS, BinaryMessage, PublishMessage, ServiceError

from edgeinfer.greengrass.nuclei import SYSTEMD_DEFAULT_PATH
from edgeinfer.sim import RecipeError, SimError, Simulator
from edgeinfer.transport.base import MqttProperties
from tests.helpers.sim import ALLOW_ALL, Device
from tests.helpers.wait import eventually

LITE = {"os": "linux", "runtime": "*"}
Factory = Callable[..., Simulator]


def _lite(device: Device, name: str, lifecycle: dict[str, Any], **kwargs: Any) -> None:
    device.add(name, lifecycle=lifecycle, platform=LITE, **kwargs)


def test_a_recipe_over_the_budget_fails_the_deployment_before_anything_runs(
    simulator: Factory, device: Device
) -> None:
    _lite(device, "com.example.Big", {"run": "sleep 30"}, config={"many": list(range(300))})
    with pytest.raises(
        RecipeError, match=r"deployment FAILED: Failed to do dependency resolution: .*Big.* counts "
    ):
        simulator(device.recipes, device.artifacts, nucleus="lite")
    sim = simulator(device.recipes, device.artifacts, nucleus="classic")
    assert sim.wait_for_state("com.example.Big", "RUNNING") == "RUNNING"


def test_a_recipe_nested_too_deep_fails_the_deployment(simulator: Factory, device: Device) -> None:
    deep: Any = "x"
    for _ in range(14):
        deep = {"n": deep}
    _lite(device, "com.example.Deep", {"run": "sleep 30"}, config={"deep": deep})
    with pytest.raises(RecipeError, match=r"nests \d+ levels deep, over the 15"):
        simulator(device.recipes, device.artifacts, nucleus="lite")


def _zip() -> bytes:
    buf = BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("house/a.txt", "a")
    return buf.getvalue()


@pytest.mark.parametrize("nucleus", ["classic", "lite"])
def test_a_local_deployment_unpacks_zip_artifacts_on_classic_only(
    simulator: Factory, device: Device, nucleus: str
) -> None:
    _lite(
        device,
        "com.example.Zip",
        {"run": "sleep 30"},
        files={"house.zip": _zip()},
        artifacts=[{"URI": "s3://bucket/com.example.Zip/house.zip", "Unarchive": "ZIP"}],
    )
    sim = simulator(device.recipes, device.artifacts, nucleus=nucleus)
    sim.wait_for_state("com.example.Zip", "RUNNING")
    unz = sim.root / "packages" / "artifacts-unarchived" / "com.example.Zip" / "1.0.0"
    assert unz.is_dir()
    unpacked = sorted(p.relative_to(unz).as_posix() for p in unz.rglob("*.txt"))
    assert unpacked == (["house/house/a.txt"] if nucleus == "classic" else [])


def test_lite_reports_the_deployment_failed_after_the_run_unit_wait(
    simulator: Factory, device: Device
) -> None:
    _lite(device, "com.example.Store", {"install": "true"})
    _lite(device, "com.example.App", {"run": "sleep 30"})
    sim = simulator(device.recipes, device.artifacts, nucleus="lite", run_unit_wait=1.5)
    assert sim.deployment().status == "IN_PROGRESS"
    status = sim.wait_for_deployment(30)
    assert status.status == "FAILED"
    assert "ggl.com.example.Store.service" in status.reason
    assert sim.state("com.example.App") == "RUNNING"  # the components keep running
    assert json.loads((sim.root / "status.json").read_text())["deployment"]["status"] == "FAILED"
    classic = simulator(device.recipes, device.artifacts, nucleus="classic", thing="classic-wait")
    assert classic.wait_for_deployment(30).status == "SUCCEEDED"


def test_iot_core_messages_over_5000_bytes_are_never_delivered_on_lite(
    simulator: Factory, device: Device, ipc_clients: Any
) -> None:
    device.add("com.example.A", access=ALLOW_ALL, lifecycle={"run": "sleep 30"}, platform=LITE)
    sim = simulator(device.recipes, device.artifacts, nucleus="lite", thing="lite-drop")
    a = ipc_clients(sim, "com.example.A")
    got: list[int] = []
    a.subscribe_to_iot_core(
        topic_name="lite/down",
        qos=QOS.AT_LEAST_ONCE,
        on_stream_event=lambda e: got.append(len(e.message.payload)),
    )
    cloud = sim.cloud_client()
    cloud.publish("lite/down", b"s" * 4000)
    cloud.publish("lite/down", b"b" * 8038)  # the request the real lite never answered
    cloud.publish("lite/down", b"t" * 100)
    eventually(lambda: got == [4000, 100], 10, "the small ones delivered")
    assert sim.dropped_iot_messages() == 1
    eventually(
        lambda: json.loads((sim.root / "status.json").read_text())["iot_dropped_oversize"] == 1,
        10,
        "in status",
    )


def test_mqtt5_properties_are_dropped_both_ways_on_lite(
    simulator: Factory, device: Device, ipc_clients: Any
) -> None:
    device.add("com.example.A", access=ALLOW_ALL, lifecycle={"run": "sleep 30"}, platform=LITE)
    sim = simulator(device.recipes, device.artifacts, nucleus="lite", thing="lite-props")
    a = ipc_clients(sim, "com.example.A")
    events: list[Any] = []
    a.subscribe_to_iot_core(topic_name="props/down", qos=QOS.AT_LEAST_ONCE, on_stream_event=events.append)
    cloud = sim.cloud_client()
    up = cloud.subscribe("props/up")
    props = MqttProperties(
        correlation_data=b"r1", response_topic="props/reply", user_properties=(("id", "r1"),)
    )
    cloud.publish("props/down", b"x", properties=props)
    eventually(lambda: len(events) == 1, 10, "delivered")
    message = events[0].message
    assert (message.correlation_data, message.response_topic, message.user_properties) == (None, None, None)
    a.publish_to_iot_core(
        topic_name="props/up", qos=QOS.AT_LEAST_ONCE, payload=b"y", correlation_data=b"r2", response_topic="t"
    )
    (received,) = up.wait_for(1, 10)
    assert received.properties is None or received.properties.correlation_data is None


def test_an_ipc_message_over_10000_bytes_closes_the_whole_connection_on_lite(
    simulator: Factory, device: Device, ipc_clients: Any
) -> None:
    device.add("com.example.A", access=ALLOW_ALL, lifecycle={"run": "sleep 30"}, platform=LITE)
    device.add("com.example.B", access=ALLOW_ALL, lifecycle={"run": "sleep 30"}, platform=LITE)
    sim = simulator(device.recipes, device.artifacts, nucleus="lite", thing="lite-ipc")
    a, b = ipc_clients(sim, "com.example.A"), ipc_clients(sim, "com.example.B")
    got: list[int] = []
    a.subscribe_to_topic(topic="t", on_stream_event=lambda e: got.append(1))
    b.publish_to_topic(topic="t", publish_message=PublishMessage(binary_message=BinaryMessage(message=b"s")))
    eventually(lambda: got == [1], 10, "a small message delivered")
    with pytest.raises(Exception):  # noqa: B017, PT011 - the client sees its connection go, in its own words
        a.publish_to_topic(
            topic="x", publish_message=PublishMessage(binary_message=BinaryMessage(message=b"L" * 11_000))
        )
    eventually(lambda: "IPC connection closed by the nucleus" in sim.logs("com.example.A"), 10, "closed")
    b.publish_to_topic(topic="t", publish_message=PublishMessage(binary_message=BinaryMessage(message=b"s")))
    time.sleep(0.5)
    assert got == [1]  # its subscription went with the connection
    # PublishToIoTCore over the limit: the same (classic refuses only past 128 KB, with a ServiceError)
    with pytest.raises(Exception):  # noqa: B017, PT011
        b.publish_to_iot_core(topic_name="up", qos=QOS.AT_LEAST_ONCE, payload=b"L" * 20_000)
    eventually(lambda: "IPC connection closed by the nucleus" in sim.logs("com.example.B"), 10, "closed")


def test_an_unsupported_operation_is_a_service_error_without_a_message_on_lite(
    simulator: Factory, device: Device, ipc_clients: Any
) -> None:
    device.add("com.example.A", access=ALLOW_ALL, lifecycle={"run": "sleep 30"}, platform=LITE)
    for nucleus in ("classic", "lite"):
        sim = simulator(device.recipes, device.artifacts, nucleus=nucleus, thing=f"unsupported-{nucleus}")
        a = ipc_clients(sim, "com.example.A")
        with pytest.raises(ServiceError) as refused:
            a.get_thing_shadow(thing_name="t", shadow_name="")  # no shadow manager on either
        assert bool(refused.value.message) == (nucleus == "classic"), refused.value.message
        if nucleus == "lite":  # one it refuses though the classic nucleus serves it
            with pytest.raises(ServiceError) as refused:
                a.subscribe_to_component_updates(on_stream_event=print)
            assert refused.value.message in (None, "")
        sim.stop()


def test_a_missing_variable_fails_three_times_then_broken_and_later_deployments_fail(
    simulator: Factory, device: Device
) -> None:
    _lite(device, "com.example.Missing", {"run": "echo {configuration:/nope}"})
    _lite(device, "com.example.Ok", {"run": "sleep 30"}, config={"n": 1})
    sim = simulator(device.recipes, device.artifacts, nucleus="lite", max_errors=3)
    assert sim.wait_for_state("com.example.Missing", "BROKEN", 30) == "BROKEN"
    assert sim.history("com.example.Missing").count("ERRORED") == 3
    assert sim.wait_for_deployment(10).status == "FAILED"
    with pytest.raises(SimError, match=r"deployment FAILED: com\.example\.Missing BROKEN"):
        sim.update_configuration("com.example.Ok", {"n": 2})
    assert sim.configuration("com.example.Ok")["n"] == 2  # applied all the same


def test_components_get_systemds_default_path_on_lite(simulator: Factory, device: Device) -> None:
    _lite(device, "com.example.Path", {"run": "echo PATH=$PATH; sleep 30"})
    sim = simulator(device.recipes, device.artifacts, nucleus="lite")
    sim.wait_for_state("com.example.Path", "RUNNING")
    eventually(lambda: f"PATH={SYSTEMD_DEFAULT_PATH}\n" in sim.logs("com.example.Path"), 10, "PATH logged")


def test_the_tests_local_client_keeps_to_lites_ipc_limit(simulator: Factory, device: Device) -> None:
    _lite(device, "com.example.A", {"run": "sleep 30"})
    sim = simulator(device.recipes, device.artifacts, nucleus="lite", thing="lite-local")
    inbox = sim.local_client().subscribe("big")
    sim.local_client().publish("big", b"s" * 7000)  # base64 in the frame's JSON: ~9,500 bytes
    assert len(inbox.wait_for(1, 10)) == 1
    with pytest.raises(SimError, match=r"over the 10000 bytes nucleus lite carries in one IPC message"):
        sim.local_client().publish("big", b"L" * 7600)
    with pytest.raises(SimError, match="closes the sender's whole IPC connection"):
        sim.local_client().publish("big", {"image": "x" * 10_000})
