"""The IPC server with the real awsiotsdk client: operations, authorization, connect, unsupported ops."""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from awsiot.eventstreamrpc import AccessDeniedError
from awsiot.greengrasscoreipc import connect
from awsiot.greengrasscoreipc.model import (
    QOS,
    BinaryMessage,
    InvalidArgumentsError,
    JsonMessage,
    PublishMessage,
    ReceiveMode,
    ResourceNotFoundError,
    ServiceError,
    UnauthorizedError,
)

from edgeinfer.sim import Simulator
from tests.helpers.sim import Device

A = "com.example.A"
B = "com.example.B"
NOBODY = "com.example.Nobody"


class Events:
    def __init__(self) -> None:
        self.items: list[Any] = []
        self.cond = threading.Condition()

    def __call__(self, event: Any) -> None:
        with self.cond:
            self.items.append(event)
            self.cond.notify_all()

    def wait(self, n: int, timeout: float = 10.0) -> list[Any]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.items) >= n, timeout), self.items
            return list(self.items)


@pytest.fixture
def sim(simulator: Callable[..., Simulator], device: Device) -> Simulator:
    device.add(
        A,
        config={"limits": {"max": 4, "names": ["x"]}, "flag": True},
        access={
            "aws.greengrass.ipc.pubsub": {
                "pub": {"operations": ["aws.greengrass#PublishToTopic"], "resources": ["data/*", "self/t"]},
                "sub": {
                    "operations": ["aws.greengrass#SubscribeToTopic"],
                    "resources": ["data/+/v", "self/t"],
                },
            },
            "aws.greengrass.ipc.mqttproxy": {
                "pub": {
                    "operations": ["aws.greengrass#PublishToIoTCore"],
                    "resources": ["dev/{iot:thingName}/#"],
                },
                "sub": {"operations": ["aws.greengrass#SubscribeToIoTCore"], "resources": ["cmd/+/go"]},
            },
        },
    )
    device.add(B, access={"aws.greengrass.ipc.pubsub": {"all": {"operations": ["*"], "resources": ["*"]}}})
    device.add(NOBODY)
    return simulator(device.recipes, device.artifacts, thing="ipc-t")


def test_pubsub_wildcards_receive_modes_and_binary_json(sim: Simulator, ipc_clients: Any) -> None:
    a, b = ipc_clients(sim, A), ipc_clients(sim, B)
    plus, hashes, others_only = Events(), Events(), Events()
    a.subscribe_to_topic(topic="data/+/v", on_stream_event=plus)
    b.subscribe_to_topic(topic="data/#", on_stream_event=hashes)
    a.subscribe_to_topic(topic="self/t", on_stream_event=others_only)
    a2 = Events()
    a.subscribe_to_topic(
        topic="self/t", receive_mode=ReceiveMode.RECEIVE_MESSAGES_FROM_OTHERS, on_stream_event=a2
    )
    a.publish_to_topic(
        topic="data/1/v", publish_message=PublishMessage(json_message=JsonMessage(message={"k": 1}))
    )
    b.publish_to_topic(
        topic="data/1/2/v", publish_message=PublishMessage(binary_message=BinaryMessage(message=b"\x01"))
    )
    a.publish_to_topic(
        topic="self/t", publish_message=PublishMessage(binary_message=BinaryMessage(message=b"me"))
    )
    b.publish_to_topic(
        topic="self/t", publish_message=PublishMessage(binary_message=BinaryMessage(message=b"b"))
    )

    got = plus.wait(1)[0]
    assert got.json_message.message == {"k": 1}
    assert got.json_message.context.topic == "data/1/v"
    topics = [
        e.json_message.context.topic if e.json_message else e.binary_message.context.topic
        for e in hashes.wait(2)
    ]
    assert topics == ["data/1/v", "data/1/2/v"]
    assert [e.binary_message.message for e in others_only.wait(2)] == [b"me", b"b"]  # own messages too
    assert [e.binary_message.message for e in a2.wait(1)] == [b"b"]
    time.sleep(0.2)
    assert len(plus.items) == 1


@pytest.mark.classic_only("nucleus lite sends UnauthorizedError without a message (test_nucleus_lite.py)")
def test_every_authorization_refusal(sim: Simulator, ipc_clients: Any) -> None:
    a, nobody = ipc_clients(sim, A), ipc_clients(sim, NOBODY)
    bin_msg = PublishMessage(binary_message=BinaryMessage(message=b"x"))
    refusals: list[Callable[[], Any]] = [
        lambda: a.publish_to_topic(topic="other/t", publish_message=bin_msg),
        lambda: a.subscribe_to_topic(topic="data/#", on_stream_event=print),  # only data/+/v is granted
        lambda: a.subscribe_to_topic(topic="data/1/v/x", on_stream_event=print),
        lambda: a.subscribe_to_topic(topic="data/x", on_stream_event=print),  # publish-only grant
        lambda: a.publish_to_iot_core(topic_name="dev/other-thing/x", qos=QOS.AT_MOST_ONCE, payload=b"x"),
        lambda: a.subscribe_to_iot_core(
            topic_name="dev/ipc-t/x", qos=QOS.AT_MOST_ONCE, on_stream_event=print
        ),
        lambda: nobody.publish_to_topic(topic="data/x", publish_message=bin_msg),
        lambda: nobody.subscribe_to_topic(topic="self/t", on_stream_event=print),
        lambda: nobody.publish_to_iot_core(topic_name="dev/ipc-t/x", qos=QOS.AT_MOST_ONCE, payload=b"x"),
        lambda: nobody.subscribe_to_iot_core(
            topic_name="cmd/1/go", qos=QOS.AT_MOST_ONCE, on_stream_event=print
        ),
    ]
    for call in refusals:
        with pytest.raises(UnauthorizedError) as info:
            call()
        assert "is not authorized to perform" in info.value.message
    # and what is granted works: {iot:thingName}, MQTT wildcards and * in resources
    a.publish_to_topic(topic="data/anything/at/all", publish_message=bin_msg)
    a.publish_to_iot_core(topic_name="dev/ipc-t/deep/x", qos=QOS.AT_LEAST_ONCE, payload=b"x")
    a.subscribe_to_iot_core(topic_name="cmd/7/go", qos=QOS.AT_LEAST_ONCE, on_stream_event=print)
    a.subscribe_to_topic(topic="data/+/v", on_stream_event=print)


def test_bad_token_is_refused_at_connect(sim: Simulator) -> None:
    with pytest.raises(AccessDeniedError):
        connect(ipc_socket=sim.socket_path, authtoken="forged-token", timeout=5)
    # a good token still works afterwards
    env = sim.ipc_env(B)
    client = connect(ipc_socket=sim.socket_path, authtoken=env["SVCUID"], timeout=5)
    client.close()


@pytest.mark.classic_only("nucleus lite's ServiceError has no message (test_lite_limits.py)")
def test_operations_without_a_handler_get_the_nucleus_service_error(sim: Simulator, ipc_clients: Any) -> None:
    a = ipc_clients(sim, A)
    with pytest.raises(ServiceError) as secret:
        a.get_secret_value(secret_id="db-password")
    assert secret.value.message == "Operation aws.greengrass#GetSecretValue is not supported by Greengrass"
    with pytest.raises(ServiceError) as listing:
        a.list_components()
    assert listing.value.message == "Operation aws.greengrass#ListComponents is not supported by Greengrass"
    assert a.get_configuration(key_path=["flag"]).value == {"flag": True}  # connection still fine


@pytest.mark.classic_only("nucleus lite stores YAML defaults as strings (test_nucleus_lite.py)")
def test_configuration_operations(sim: Simulator, ipc_clients: Any) -> None:
    a, b = ipc_clients(sim, A), ipc_clients(sim, B)
    assert a.get_configuration(key_path=["limits", "max"]).value == {"max": 4}
    assert a.get_configuration(key_path=["limits"]).value == {"max": 4, "names": ["x"]}
    whole = b.get_configuration(component_name=A).value
    assert whole["flag"] is True
    assert "accessControl" in whole
    with pytest.raises(ResourceNotFoundError):
        a.get_configuration(key_path=["limits", "nope"])
    with pytest.raises(ResourceNotFoundError):
        a.get_configuration(component_name="com.example.Ghost")

    mine, theirs, filtered = Events(), Events(), Events()
    a.subscribe_to_configuration_update(on_stream_event=mine)
    b.subscribe_to_configuration_update(component_name=A, on_stream_event=theirs)
    a.subscribe_to_configuration_update(key_path=["flag"], on_stream_event=filtered)
    now = dt.datetime.now(dt.timezone.utc)
    a.update_configuration(key_path=["limits"], timestamp=now, value_to_merge={"max": 8, "new": "v"})
    paths = sorted(e.configuration_update_event.key_path for e in mine.wait(2))
    assert paths == [["limits", "max"], ["limits", "new"]]
    assert theirs.wait(2)[0].configuration_update_event.component_name == A
    assert a.get_configuration(key_path=["limits", "max"]).value == {"max": 8}
    with pytest.raises(InvalidArgumentsError) as info:
        a.update_configuration(key_path=[], timestamp=now, value_to_merge={"limits": 1})
    assert "inner node" in info.value.message
    with pytest.raises(InvalidArgumentsError):
        a.update_configuration(key_path=["flag"], timestamp=now, value_to_merge={"x": 1})
    a.update_configuration(key_path=[], timestamp=now, value_to_merge={"flag": False})
    assert [e.configuration_update_event.key_path for e in filtered.wait(1)] == [["flag"]]
    assert len(filtered.items) == 1


@pytest.mark.classic_only("nucleus lite refuses the validation operations (test_nucleus_lite.py)")
def test_validity_report_without_a_pending_validation(sim: Simulator, ipc_clients: Any) -> None:
    from awsiot.greengrasscoreipc.model import ConfigurationValidityReport

    a = ipc_clients(sim, A)
    with pytest.raises(InvalidArgumentsError) as info:
        a.send_configuration_validity_report(
            configuration_validity_report=ConfigurationValidityReport(status="ACCEPTED", deployment_id="nope")
        )
    assert "never made" in info.value.message


@pytest.mark.classic_only("nucleus lite refuses the validation operations (test_nucleus_lite.py)")
def test_validation_rejects_then_accepts_a_deployment(sim: Simulator, ipc_clients: Any) -> None:
    from awsiot.greengrasscoreipc.model import ConfigurationValidityReport

    a = ipc_clients(sim, A)

    def on_validate(event: Any) -> None:
        proposal = event.validate_configuration_update_event
        ok = proposal.configuration["limits"]["max"] < 100
        a.send_configuration_validity_report(
            configuration_validity_report=ConfigurationValidityReport(
                status="ACCEPTED" if ok else "REJECTED",
                deployment_id=proposal.deployment_id,
                message=None if ok else "max too large",
            )
        )

    a.subscribe_to_validate_configuration_updates(on_stream_event=on_validate)
    with pytest.raises(Exception, match="max too large"):
        sim.update_configuration(A, merge={"limits": {"max": 1000}})
    sim.update_configuration(A, merge={"limits": {"max": 50}})
    assert sim.configuration(A)["limits"] == {"max": 50, "names": ["x"]}
    sim.update_configuration(A, reset=["/limits/max"])
    assert sim.configuration(A)["limits"]["max"] == 4


def test_update_state_from_the_component(sim: Simulator, ipc_clients: Any) -> None:
    b = ipc_clients(sim, B)
    assert sim.reports(B) == []
    b.update_state(state="RUNNING")
    assert sim.wait_for_state(B, "RUNNING", timeout=5) == "RUNNING"
    sim.wait_for_report(B, "RUNNING", timeout=5)
    assert sim.reports(B) == ["RUNNING"]
    with pytest.raises(InvalidArgumentsError):
        b.update_state(state="SLEEPING")


def test_pipelined_iot_core_publishes_keep_their_order(sim: Simulator, ipc_clients: Any) -> None:
    a = ipc_clients(sim, A)
    inbox = sim.cloud_client().subscribe("dev/ipc-t/seq")
    futures = [
        a.publish_to_iot_core_async(
            topic_name="dev/ipc-t/seq", qos=QOS.AT_LEAST_ONCE, payload=str(i).encode()
        )
        for i in range(200)
    ]
    for future in futures:
        future.result(10)
    assert [int(m.payload) for m in inbox.wait_for(200)] == list(range(200))


@pytest.mark.parametrize("message", [b"", b"\x00\xff binary", bytes(range(256)) * 400])
@pytest.mark.parametrize("topic", ["a/b", 'odd "topic"/\u00e9'])
def test_binary_event_payload_is_what_the_sdk_model_writes(message: bytes, topic: str) -> None:
    from awsiot.greengrasscoreipc import model

    from edgeinfer.sim.pubsub import binary_event_payload

    event = model.SubscriptionResponseMessage(
        binary_message=model.BinaryMessage(message=message, context=model.MessageContext(topic=topic))
    )
    spliced = json.loads(binary_event_payload(topic, message))
    assert spliced == event._to_payload()
    decoded = model.SubscriptionResponseMessage._from_payload(spliced)
    assert decoded.binary_message.message == message
    assert decoded.binary_message.context.topic == topic
