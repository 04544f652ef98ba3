"""GreengrassIpcBus against the simulated core: the real awsiotsdk IPC client, the real IPC server."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from awsiot.greengrasscoreipc import connect
from awsiot.greengrasscoreipc.clientv2 import GreengrassCoreIPCClientV2
from awsiot.greengrasscoreipc.model import JsonMessage, PublishMessage

from edgeinfer.sim import Simulator
from edgeinfer.transport import Message, TransportError, UnauthorizedError
from edgeinfer.transport.ipc import GreengrassIpcBus
from tests.helpers.wait import wait_for

APP = "com.example.App"
PEER = "com.example.Peer"
SOCK = "AWS_GG_NUCLEUS_DOMAIN_SOCKET_FILEPATH_FOR_COMPONENT"


def _recipe(name: str, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "RecipeFormatVersion": "2020-01-25",
        "ComponentName": name,
        "ComponentVersion": "1.0.0",
        "ComponentConfiguration": {"DefaultConfiguration": config},
        "Manifests": [{"Platform": {"os": "*"}, "Lifecycle": {}}],
    }


@pytest.fixture
def sim(simulator: Callable[..., Simulator], tmp_path: Path) -> Simulator:
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    app_access = {
        "aws.greengrass.ipc.pubsub": {
            "rw": {"operations": ["*"], "resources": ["app/*", "peer/+/json"]},
            "pub-only": {"operations": ["aws.greengrass#PublishToTopic"], "resources": ["out/#"]},
        },
        "aws.greengrass.ipc.mqttproxy": {
            "iot": {"operations": ["*"], "resources": ["things/{iot:thingName}/#"]},
        },
    }
    app_config = {
        "threshold": 0.5,
        "model": {"name": "lite0", "batch": {"max": 8}},
        "accessControl": app_access,
    }
    (recipes / "app.yaml").write_text(yaml.safe_dump(_recipe(APP, app_config)))
    peer_access = {"aws.greengrass.ipc.pubsub": {"p": {"operations": ["*"], "resources": ["*"]}}}
    (recipes / "peer.yaml").write_text(yaml.safe_dump(_recipe(PEER, {"accessControl": peer_access})))
    return simulator(recipes, thing="ipc-thing")


@pytest.fixture
def bus_for(sim: Simulator) -> Iterator[Callable[[str], GreengrassIpcBus]]:
    buses: list[GreengrassIpcBus] = []

    def make(component: str) -> GreengrassIpcBus:
        env = sim.ipc_env(component)
        bus = GreengrassIpcBus.connect(env[SOCK], env["SVCUID"])
        buses.append(bus)
        return bus

    yield make
    for bus in buses:
        bus.close()


class Collector:
    def __init__(self) -> None:
        self.items: list[Any] = []
        self.cond = threading.Condition()
        self.threads: set[str] = set()

    def __call__(self, item: Any) -> None:
        with self.cond:
            self.items.append(item)
            self.threads.add(threading.current_thread().name)
            self.cond.notify_all()

    def wait(self, n: int, timeout: float = 10.0) -> list[Any]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.items) >= n, timeout), f"got {self.items}"
            return list(self.items)


def test_local_pubsub_round_trip_with_wildcards_and_own_messages(bus_for: Any, sim: Simulator) -> None:
    bus = bus_for(APP)
    got = Collector()
    sub = bus.subscribe("app/+", got)
    everything = Collector()
    bus.subscribe("app/#", everything)
    bus.publish("app/a", b"\x00binary\xff")
    bus.publish("app/a/deeper", b"only #")
    assert got.wait(1) == [Message("app/a", b"\x00binary\xff", "local")]
    assert [m.topic for m in everything.wait(2)] == ["app/a", "app/a/deeper"]
    sub.close()
    # Closing a stream is not waited for: wait until the nucleus has dropped the subscription.
    assert sim._nucleus is not None
    pubsub = sim._nucleus.pubsub
    assert wait_for(lambda: not any(s.topic_filter == "app/+" for s in pubsub.subs))
    bus.publish("app/b", b"after close")
    time.sleep(0.3)
    assert len(got.items) == 1


def test_json_from_another_component_arrives_as_json_bytes(bus_for: Any, sim: Simulator) -> None:
    bus = bus_for(APP)
    got = Collector()
    bus.subscribe("peer/+/json", got)
    env = sim.ipc_env(PEER)
    raw = connect(ipc_socket=env[SOCK], authtoken=env["SVCUID"])
    peer = GreengrassCoreIPCClientV2(client=raw)
    try:
        peer.publish_to_topic(
            topic="peer/1/json",
            publish_message=PublishMessage(json_message=JsonMessage(message={"x": [1, 2]})),
        )
        message = got.wait(1)[0]
    finally:
        peer.close()
    assert message.topic == "peer/1/json"
    assert json.loads(message.payload) == {"x": [1, 2]}
    assert all(name.startswith("ipc-handler") for name in got.threads)


def test_iot_core_both_ways(bus_for: Any, sim: Simulator) -> None:
    bus = bus_for(APP)
    cloud = sim.cloud_client()
    inbox = cloud.subscribe("things/ipc-thing/up")
    got = Collector()
    bus.subscribe("things/ipc-thing/down/+", got, target="iot", qos=1)
    bus.publish("things/ipc-thing/up", b"hello cloud", target="iot", qos=1)
    assert inbox.wait_for(1)[0].payload == b"hello cloud"
    cloud.publish("things/ipc-thing/down/1", b"hello device", qos=1)
    assert got.wait(1) == [Message("things/ipc-thing/down/1", b"hello device", "iot")]


def test_configuration_reads_updates_and_events(bus_for: Any, sim: Simulator) -> None:
    bus = bus_for(APP)
    assert bus.get_configuration(["threshold"]) == 0.5
    assert bus.get_configuration(["model"]) == {"name": "lite0", "batch": {"max": 8}}
    assert bus.get_configuration(["model", "batch", "max"]) == 8
    assert bus.get_configuration()["threshold"] == 0.5
    assert "accessControl" in bus_for(PEER).get_configuration(component=APP)
    with pytest.raises(TransportError, match="not found"):
        bus.get_configuration(["nope"])
    events = Collector()
    bus.on_configuration_update(events)
    bus.update_configuration(["model", "batch", "max"], 16)
    assert events.wait(1) == [["model", "batch", "max"]]
    assert bus.get_configuration(["model", "batch", "max"]) == 16
    assert sim.configuration(APP)["model"]["batch"]["max"] == 16


def test_configuration_validation_from_a_deployment(bus_for: Any, sim: Simulator) -> None:
    bus = bus_for(APP)
    seen = Collector()

    def validator(proposed: dict[str, Any]) -> str | None:
        seen(proposed)
        return None if proposed["threshold"] <= 1 else "threshold must be <= 1"

    bus.on_validate_configuration(validator)
    events = Collector()
    bus.on_configuration_update(events)
    with pytest.raises(Exception, match="threshold must be <= 1"):
        sim.update_configuration(APP, merge={"threshold": 5})
    assert bus.get_configuration(["threshold"]) == 0.5
    sim.update_configuration(APP, merge={"threshold": 0.9})
    assert bus.get_configuration(["threshold"]) == 0.9
    assert events.wait(1) == [["threshold"]]
    assert [p["threshold"] for p in seen.items] == [5, 0.9]


def test_update_state_and_refusals(bus_for: Any, sim: Simulator) -> None:
    bus = bus_for(APP)
    bus.update_state("RUNNING")
    assert sim.state(APP) == "RUNNING"
    with pytest.raises(UnauthorizedError, match="not authorized"):
        bus.publish("secret/topic", b"x")
    with pytest.raises(UnauthorizedError):
        bus.subscribe("out/x", lambda m: None)  # publish-only grant
    bus.publish("out/x", b"allowed")
    with pytest.raises(UnauthorizedError):
        bus.publish("things/other-thing/up", b"x", target="iot")
    with pytest.raises(UnauthorizedError):
        bus.subscribe("things/+/up", lambda m: None, target="iot")


def test_bad_token_and_no_environment(sim: Simulator, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UnauthorizedError, match="bad token"):
        GreengrassIpcBus.connect(sim.socket_path, "not-a-token")
    monkeypatch.delenv("SVCUID", raising=False)
    monkeypatch.delenv("AWS_GG_NUCLEUS_DOMAIN_SOCKET_FILEPATH_FOR_COMPONENT", raising=False)
    with pytest.raises(TransportError, match="not running under Greengrass"):
        GreengrassIpcBus.connect()


def test_iot_outage_spools_qos1_refuses_qos0_and_subscriptions_come_back(
    bus_for: Any, sim: Simulator
) -> None:
    bus = bus_for(APP)
    cloud = sim.cloud_client()
    inbox = cloud.subscribe("things/ipc-thing/up")
    got = Collector()
    bus.subscribe("things/ipc-thing/down", got, target="iot", qos=1)
    with sim.iot_outage():  # as the classic nucleus's spooler does
        with pytest.raises(TransportError, match=r"Device is offline\. Dropping QoS 0 message"):
            bus.publish("things/ipc-thing/up", b"lost", target="iot", qos=0)
        bus.publish("things/ipc-thing/up", b"spooled", target="iot", qos=1)
        cloud.publish("things/ipc-thing/down", b"while away", qos=1)
    bus.publish("things/ipc-thing/up", b"back", target="iot", qos=1)
    assert [m.payload for m in inbox.wait_for(2)] == [b"spooled", b"back"]
    cloud.publish("things/ipc-thing/down", b"after", qos=1)
    assert [m.payload for m in got.wait(1)] == [b"after"]


def test_inline_handlers_run_on_the_event_loop_thread_and_may_publish_nowait(
    bus_for: Any, sim: Simulator
) -> None:
    bus = bus_for(APP)
    echoed = Collector()
    bus.subscribe("app/echo", echoed, inline=True)
    outcomes = Collector()

    def echo(message: Message) -> None:  # an inline handler answers without waiting on the bus
        bus.publish_nowait("app/echo", message.payload, on_done=outcomes)

    bus.subscribe("app/ask", echo, inline=True)
    iot = Collector()
    bus.subscribe("things/ipc-thing/down/+", iot, target="iot", qos=1, inline=True)
    bus.publish("app/ask", b"ping")
    assert echoed.wait(1) == [Message("app/echo", b"ping", "local")]
    assert outcomes.wait(1) == [None]
    sim.cloud_client().publish("things/ipc-thing/down/1", b"hello device", qos=1)
    assert iot.wait(1) == [Message("things/ipc-thing/down/1", b"hello device", "iot")]
    assert not any(name.startswith("ipc-handler") for name in echoed.threads | iot.threads)


def test_publish_nowait_reports_the_nucleus_refusal(bus_for: Any) -> None:
    bus = bus_for(APP)
    outcomes = Collector()
    bus.publish_nowait("out/allowed", b"x", on_done=outcomes)
    bus.publish_nowait("not/granted", b"x", on_done=outcomes)
    ok, refused = outcomes.wait(2)
    assert ok is None
    assert isinstance(refused, UnauthorizedError)
    assert "not/granted" in str(refused)


def test_mqtt5_properties_through_the_nucleus_both_ways(bus_for: Any, sim: Simulator) -> None:
    """As awsiotsdk's MQTTMessage / PublishToIoTCoreRequest carry them, inline and not."""
    from edgeinfer.transport import MqttProperties

    bus = bus_for(APP)
    cloud = sim.cloud_client()
    props = MqttProperties(
        content_type="image/jpeg",
        correlation_data=b"\x00\x01c",
        response_topic="things/ipc-thing/up/reply",
        user_properties=(("id", "r1"), ("top_k", "2")),
        message_expiry_s=60,
    )
    for inline in (False, True):
        got = Collector()
        sub = bus.subscribe("things/ipc-thing/raw", got, target="iot", qos=1, inline=inline)
        cloud.publish("things/ipc-thing/raw", b"\xff\xd8raw", qos=1, properties=props)
        (msg,) = got.wait(1)
        sub.close()
        assert msg.payload == b"\xff\xd8raw"
        assert msg.properties is not None
        assert msg.properties.content_type == "image/jpeg"
        assert msg.properties.correlation_data == b"\x00\x01c"
        assert msg.properties.response_topic == "things/ipc-thing/up/reply"
        assert msg.properties.user_properties == (("id", "r1"), ("top_k", "2"))
        assert msg.properties.message_expiry_s is not None
        assert 0 < msg.properties.message_expiry_s <= 60
    inbox = cloud.subscribe("things/ipc-thing/up/reply")
    answer = MqttProperties(
        content_type="application/json", correlation_data=b"\x00\x01c", payload_format="utf8"
    )
    done = Collector()
    bus.publish_nowait(
        "things/ipc-thing/up/reply", b"{}", target="iot", qos=1, properties=answer, on_done=done
    )
    assert done.wait(1) == [None]
    (reply,) = inbox.wait_for(1)
    assert reply.properties is not None
    assert reply.properties.correlation_data == b"\x00\x01c"
    assert reply.properties.content_type == "application/json"
    assert reply.properties.payload_format == "utf8"
