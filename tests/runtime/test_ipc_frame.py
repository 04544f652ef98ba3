"""The runtime's reckoning of an IPC frame's size is never below the frame the SDK would send."""

from __future__ import annotations

import json

import pytest
from awsiot.greengrasscoreipc import model

from edgeinfer.runtime.ipc_frame import framed_size
from edgeinfer.sim import eventstream as es
from edgeinfer.sim.pubsub import message_frame_size
from edgeinfer.transport import MqttProperties

TOPIC = "edgeinfer/a-rather-long-thing-name-for-a-device/result/app-ü"


def iot_core_frame_size(topic: str, payload: bytes, props: MqttProperties) -> int:
    request = model.PublishToIoTCoreRequest(
        topic_name=topic,
        qos=model.QOS.AT_LEAST_ONCE,
        payload=payload,
        correlation_data=props.correlation_data,
        response_topic=props.response_topic,
        content_type=props.content_type,
        payload_format=model.PayloadFormat.UTF8,
        message_expiry_interval_seconds=3600,
        retain=False,
        user_properties=[model.UserProperty(key=k, value=v) for k, v in props.user_properties],
    )
    headers = {
        ":message-type": es.APPLICATION_MESSAGE,
        ":message-flags": 0,
        ":stream-id": 1,
        "operation": "aws.greengrass#PublishToIoTCore",
        "service-model-type": request._model_name(),
        ":content-type": "application/json",
    }
    return len(es.encode(headers, json.dumps(request._to_payload()).encode()))


@pytest.mark.parametrize("n", [0, 1, 2, 3, 100, 7_000, 100_000])
def test_a_local_publish_is_reckoned_at_least_its_frame(n: int) -> None:
    payload = bytes(range(256)) * (n // 256) + bytes(n % 256)
    actual = message_frame_size(TOPIC, "binary", payload)
    assert actual <= framed_size(TOPIC, n) <= actual + 1100  # from above, not far above


@pytest.mark.parametrize("n", [0, 5_000])
def test_an_iot_core_publish_is_reckoned_at_least_its_frame(n: int) -> None:
    props = MqttProperties(
        content_type="application/json",
        correlation_data=bytes(300),
        response_topic="clients/abc/response",
        user_properties=(("id", "r-1"), ("top_k", "5")),
        payload_format="utf8",
    )
    assert iot_core_frame_size(TOPIC, bytes(n), props) <= framed_size(TOPIC, n, props)
