"""SubscribeToIoTCore on the simulated nucleus: its events against the awsiotsdk model's own, and a
flood into a held subscriber."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from awsiot.greengrasscoreipc import connect, model
from awsiot.greengrasscoreipc.clientv2 import GreengrassCoreIPCClientV2
from awsiot.greengrasscoreipc.model import QOS

from edgeinfer.sim import Simulator
from edgeinfer.sim.mqttproxy import iot_core_message_json
from edgeinfer.transport.base import Message, MqttProperties
from edgeinfer.transport.ipc import _sdk_properties as sdk_properties
from edgeinfer.transport.mqtt import MqttPubSub
from tests.helpers.sim import ALLOW_ALL, Device
from tests.helpers.wait import wait_for

A = "com.example.A"

PROPS = MqttProperties(
    content_type="image/jpeg",
    correlation_data=b"\x00c-1",
    response_topic="a/reply",
    user_properties=(("id", "r1"), ("top_k", "3")),
    message_expiry_s=30,
    payload_format="bytes",
)


@pytest.mark.parametrize("props", [None, PROPS], ids=["plain", "mqtt5-properties"])
@pytest.mark.parametrize("payload", [b"", b"\xff\xd8" + bytes(range(256)) * 200], ids=["empty", "image"])
def test_the_event_is_what_the_sdk_model_writes(props: MqttProperties | None, payload: bytes) -> None:
    message = Message('edgeinfer/th"ing/ünïcode', payload, "iot", props)
    extra = sdk_properties(props) if props is not None else {}
    shape = model.IoTCoreMessage(
        message=model.MQTTMessage(topic_name=message.topic, payload=payload, **extra)
    )
    ours = json.loads(iot_core_message_json(message))
    assert ours == json.loads(json.dumps(shape._to_payload()))
    back = model.IoTCoreMessage._from_payload(ours).message
    assert back.payload == payload
    assert back.topic_name == message.topic


def test_a_flood_into_a_held_ipc_subscriber_stays_within_every_bound_and_arrives_once(
    simulator: Callable[..., Simulator], device: Device, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edgeinfer.sim import iot_bridge, mqttproxy

    monkeypatch.setattr(iot_bridge, "INBOX_MAX_MESSAGES", 32)
    monkeypatch.setattr(iot_bridge, "INBOX_MAX_BYTES", 256 * 1024)
    monkeypatch.setattr(mqttproxy, "HANDOFF_LIMIT", 16)
    device.add(A, access=ALLOW_ALL)
    sim = simulator(device.recipes, device.artifacts, thing="held")
    assert sim._nucleus is not None
    bridge, handoff = sim._nucleus.bridge, sim._nucleus.mqttproxy.handoff
    assert bridge is not None
    assert handoff is not None
    env = sim.ipc_env(A)
    raw = connect(
        ipc_socket=env["AWS_GG_NUCLEUS_DOMAIN_SOCKET_FILEPATH_FOR_COMPONENT"], authtoken=env["SVCUID"]
    )
    # Handler on the IPC client's own thread: held, it stops reading, and the nucleus waits.
    component = GreengrassCoreIPCClientV2(client=raw, executor=None)
    gate = threading.Event()
    got: list[int] = []

    def held(event: Any) -> None:
        got.append(int.from_bytes(event.message.payload[:4], "big"))
        gate.wait(60)

    # The cloud on its own event-loop thread: the held IPC client may share the default one.
    cloud = MqttPubSub.connect_tcp(*sim.broker, own_event_loop=True)
    flood, body = 3000, b"j" * 4092  # 12 MB: far above the IPC buffer, the hand-off and the inbox
    try:
        component.subscribe_to_iot_core(topic_name="held/down", qos=QOS.AT_LEAST_ONCE, on_stream_event=held)
        for i in range(flood):
            cloud.publish("held/down", i.to_bytes(4, "big") + body, qos=1, wait=False)
        assert wait_for(lambda: bridge.inbox_stats()["waits"] >= 1, timeout=60)
        assert wait_for(lambda: len(got) == 1)  # the buffers may fill before the handler is reached
        gate.set()
        assert wait_for(lambda: len(got) >= flood, timeout=120)
        time.sleep(0.3)  # room for a duplicate to show
        assert got == list(range(flood))
        stats = bridge.inbox_stats()
        assert stats["peak_messages"] <= 32
        assert stats["peak_bytes"] <= 256 * 1024
        assert handoff.peak <= 16
    finally:
        gate.set()
        cloud.close()
        component.close()
