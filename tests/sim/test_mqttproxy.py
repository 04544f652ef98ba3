"""The IoTCoreMessage events the simulated nucleus writes, against the awsiotsdk model's own."""

from __future__ import annotations

import json

import pytest
from awsiot.greengrasscoreipc import model

from edgeinfer.sim.mqttproxy import iot_core_message_json
from edgeinfer.transport.base import Message, MqttProperties
from edgeinfer.transport.ipc import _sdk_properties as sdk_properties

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
