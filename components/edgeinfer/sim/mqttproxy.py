"""PublishToIoTCore and SubscribeToIoTCore (the nucleus's `MqttProxyIPCAgent`) over the IoT bridge.

MQTT 5 properties (content type, correlation data, response topic, user properties, expiry, payload
format) pass through both ways, converted by the same functions as the component side's IPC bus;
nucleus lite drops them both ways (its mqttproxy passes topic, payload and QoS only).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from awsiot.greengrasscoreipc import model

from edgeinfer import codec
from edgeinfer.sim import ipc_server as ipc
from edgeinfer.sim.iot_bridge import LoopHandoff, PublishRefusedError
from edgeinfer.transport.base import Message
from edgeinfer.transport.ipc import _properties as request_properties
from edgeinfer.transport.ipc import _sdk_properties as sdk_properties

if TYPE_CHECKING:
    from edgeinfer.sim.core import Nucleus

MQTTPROXY = "aws.greengrass.ipc.mqttproxy"
PUBLISH_TIMEOUT_S = 10.0
IOT_CORE_MESSAGE = model.IoTCoreMessage._model_name()
# Events handed to the event loop and not yet written to a subscriber: the count, and their bytes
# (an IoT Core message is at most 128 KB, a third more in base64).
HANDOFF_LIMIT = 1024
HANDOFF_MAX_BYTES = 16 * 1024 * 1024


class MqttProxy:
    def __init__(self, nucleus: Nucleus) -> None:
        self.nucleus = nucleus
        self.handoff: LoopHandoff | None = None

    def handlers(self) -> dict[str, Callable[..., Any]]:
        return {
            "aws.greengrass#PublishToIoTCore": self._publish,
            "aws.greengrass#SubscribeToIoTCore": self._subscribe,
        }

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.handoff = LoopHandoff(loop, HANDOFF_LIMIT, HANDOFF_MAX_BYTES)

    async def _publish(self, conn: ipc.Connection, req: Any, stream: ipc.Stream) -> Any:
        topic = req.topic_name or ""
        if not topic:
            raise ipc.invalid("topicName is required")
        assert conn.component is not None
        self.nucleus.auth.authorize(conn.component, MQTTPROXY, "aws.greengrass#PublishToIoTCore", topic)
        bridge = self.nucleus.bridge
        if bridge is None:
            raise ipc.service_error(f"Publish to topic {topic} failed with error IoT Core is not connected")
        payload = req.payload or b""
        if isinstance(payload, str):
            payload = payload.encode()
        qos = 1 if str(req.qos or "1") == "1" else 0
        try:
            properties = request_properties(req) if self.nucleus.profile.mqtt5_properties else None
            future = bridge.publish(topic, payload, qos, bool(req.retain), properties)
        except PublishRefusedError as exc:
            raise ipc.service_error(f"Publish to topic {topic} failed with error {exc}") from None
        # Classic answers once the spool holds the message, without waiting for IoT Core's PUBACK
        # (MqttProxyIPCAgent's handler: `mqttClient.publish(...).getNow(0)`); the future is done
        # then. Without a spooler (lite) it is done once the broker has the message.
        if not future.done():
            try:
                await asyncio.wait_for(asyncio.wrap_future(future), PUBLISH_TIMEOUT_S)
            except Exception as exc:
                raise ipc.service_error(f"Publish to topic {topic} failed with error {exc}") from exc
        return model.PublishToIoTCoreResponse()

    async def _subscribe(self, conn: ipc.Connection, req: Any, stream: ipc.Stream) -> Any:
        topic = req.topic_name or ""
        if not topic:
            raise ipc.invalid("topicName is required")
        assert conn.component is not None
        self.nucleus.auth.authorize(conn.component, MQTTPROXY, "aws.greengrass#SubscribeToIoTCore", topic)
        bridge, handoff = self.nucleus.bridge, self.handoff
        if bridge is None or handoff is None:
            raise ipc.service_error(f"Subscribe to topic {topic} failed with error IoT Core is not connected")

        keep_properties = self.nucleus.profile.mqtt5_properties

        def on_message(message: Message) -> None:  # the MQTT client's dispatcher thread
            if not keep_properties and message.properties is not None:
                message = dataclasses.replace(message, properties=None)
            frame = stream.event_frame(IOT_CORE_MESSAGE, iot_core_message_json(message))
            handoff.hold(stream.send_frame_when_writable, frame, size=len(frame))

        qos = 1 if str(req.qos or "1") == "1" else 0
        loop = asyncio.get_running_loop()
        try:
            remove = await loop.run_in_executor(None, bridge.subscribe, topic, on_message, qos)
        except Exception as exc:
            raise ipc.service_error(f"Subscribe to topic {topic} failed with error {exc}") from exc
        if stream.closed:
            remove()
        else:
            stream.on_close.append(lambda: _discard(loop.run_in_executor(None, remove)))
        return model.SubscribeToIoTCoreResponse()


def iot_core_message_json(message: Message) -> bytes:
    """The JSON of the `IoTCoreMessage` event for `message`, as the awsiotsdk model writes it
    (`json.dumps(model.IoTCoreMessage(...)._to_payload())`), built without running the JSON encoder
    over the base64 payload: that scan was a quarter of the nucleus's time per image-sized message."""
    payload = codec.b64encode(message.payload)
    if message.properties is None:
        head = '{"message": {"topicName": ' + json.dumps(message.topic)
    else:
        props = sdk_properties(message.properties)
        shape = model.IoTCoreMessage(message=model.MQTTMessage(topic_name=message.topic, **props))
        head = json.dumps(shape._to_payload())[:-2]  # without the closing braces of both objects
    return b"".join((head.encode(), b', "payload": "', payload, b'"}}'))


def _discard(_result: object) -> None:
    """Fire and forget."""
