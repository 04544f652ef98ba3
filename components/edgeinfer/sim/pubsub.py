"""Local publish/subscribe: PublishToTopic and SubscribeToTopic (the nucleus's `PubSubIPCEventStreamAgent`).

Subscribers receive their own publishes unless they subscribed with RECEIVE_MESSAGES_FROM_OTHERS;
tests subscribe with plain callbacks next to the components (no authorization). A publish is
answered once every subscriber's connection it was written to has room in its write buffer again
(`ipc_server.WRITE_BUFFER_HIGH`): a component publishing faster than a subscriber reads is held
back at its own connection, and the nucleus holds at most that buffer per subscriber.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from awsiot.greengrasscoreipc import model

from edgeinfer import codec
from edgeinfer.sim import eventstream as es
from edgeinfer.sim import ipc_server as ipc
from edgeinfer.sim.broker import Inbox
from edgeinfer.transport.base import Message, topic_matches

if TYPE_CHECKING:
    from edgeinfer.sim.core import Nucleus
    from edgeinfer.sim.simulator import Simulator

PUBSUB = "aws.greengrass.ipc.pubsub"
SLOW_SUBSCRIBER_S = 10.0


@dataclass(eq=False)
class LocalSub:
    topic_filter: str
    component: str | None
    from_others_only: bool
    stream: ipc.Stream | None = None
    callback: Callable[[Message], None] | None = None


def remove(items: list[Any], item: Any) -> None:
    with contextlib.suppress(ValueError):
        items.remove(item)


class LocalPubSub:
    def __init__(self, nucleus: Nucleus) -> None:
        self.nucleus = nucleus
        self.subs: list[LocalSub] = []

    def handlers(self) -> dict[str, Callable[..., Any]]:
        return {
            "aws.greengrass#PublishToTopic": self._publish_to_topic,
            "aws.greengrass#SubscribeToTopic": self._subscribe_to_topic,
        }

    def publish(self, topic: str, kind: str, value: Any, source: str | None) -> list[ipc.Connection]:
        """Deliver to every subscriber now; the subscribers' connections whose write buffers this
        left over their high-water mark (`_publish_to_topic` waits for those)."""
        matching = [s for s in self.subs if topic_matches(s.topic_filter, topic)]
        if not matching:
            return []
        if kind == "json":
            event = model.SubscriptionResponseMessage(
                json_message=model.JsonMessage(message=value, context=model.MessageContext(topic=topic))
            )
            raw = codec.dumps(value).encode() if any(s.callback for s in matching) else b""
            payload = codec.dumps(event._to_payload()).encode()
        else:
            raw = value
            payload = binary_event_payload(topic, value)
        message = Message(topic, raw, "local")
        full: list[ipc.Connection] = []
        for sub in matching:
            if sub.from_others_only and source is not None and sub.component == source:
                continue
            if sub.stream is not None:
                sub.stream.send_raw("aws.greengrass#SubscriptionResponseMessage", payload)
                if not sub.stream.conn.has_room() and sub.stream.conn not in full:
                    full.append(sub.stream.conn)
            elif sub.callback is not None:
                sub.callback(message)
        return full

    def add_callback(self, topic_filter: str, callback: Callable[[Message], None]) -> Callable[[], None]:
        sub = LocalSub(topic_filter, None, False, callback=callback)
        self.subs.append(sub)
        return lambda: remove(self.subs, sub)

    async def _publish_to_topic(self, conn: ipc.Connection, req: Any, stream: ipc.Stream) -> Any:
        topic = req.topic or ""
        if not topic:
            raise ipc.invalid("topic is required")
        if "+" in topic or "#" in topic:
            raise ipc.invalid(f"cannot publish to a topic filter with wildcards: {topic}")
        assert conn.component is not None
        self.nucleus.auth.authorize(conn.component, PUBSUB, "aws.greengrass#PublishToTopic", topic)
        msg = req.publish_message
        if msg is None or (msg.json_message is None and msg.binary_message is None):
            raise ipc.invalid("publishMessage needs a jsonMessage or a binaryMessage")
        if msg.json_message is not None:
            full = self.publish(topic, "json", msg.json_message.message, conn.component)
        else:
            full = self.publish(topic, "binary", msg.binary_message.message or b"", conn.component)
        # A subscriber that reads slower than this publisher sends: the publisher's answer (and with
        # it everything else on its connection, which is read one operation at a time) waits until
        # the subscriber's buffer has room, so the backlog stays in the publisher's own client and
        # socket instead of growing without end in the nucleus. Its own connection is never waited
        # for (a component that reads its own topic while it waits for this answer would wait forever),
        # and a subscriber that stopped reading holds its publishers back for SLOW_SUBSCRIBER_S at most.
        for other in full:
            if other is not conn:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(other.writable(), SLOW_SUBSCRIBER_S)
        return model.PublishToTopicResponse()

    async def _subscribe_to_topic(self, conn: ipc.Connection, req: Any, stream: ipc.Stream) -> Any:
        topic = req.topic or ""
        if not topic:
            raise ipc.invalid("topic is required")
        assert conn.component is not None
        self.nucleus.auth.authorize(conn.component, PUBSUB, "aws.greengrass#SubscribeToTopic", topic)
        sub = LocalSub(
            topic, conn.component, req.receive_mode == "RECEIVE_MESSAGES_FROM_OTHERS", stream=stream
        )
        self.subs.append(sub)
        stream.on_close.append(lambda: remove(self.subs, sub))
        return model.SubscribeToTopicResponse(topic_name=topic)


def binary_event_payload(topic: str, message: bytes) -> bytes:
    """A SubscriptionResponseMessage carrying a binary message, as the SDK's model classes write it.

    Spliced rather than built through `_to_payload` + `json.dumps`: for a 90 KB image those cost 1.2 ms
    of the nucleus's CPU per delivery, this ~10 µs (base64 needs no JSON escaping).
    """
    return b"".join(
        (
            b'{"binaryMessage":{"message":"',
            codec.b64encode(message),
            b'","context":',
            json.dumps({"topic": topic}).encode(),
            b"}}",
        )
    )


def message_frame_size(topic: str, kind: str, value: Any) -> int:
    """The larger of the IPC frames this message takes: the PublishToTopic a component's client sends
    for it, and the event a subscriber gets (which adds the topic as context)."""
    message = (
        model.PublishMessage(json_message=model.JsonMessage(message=value))
        if kind == "json"
        else model.PublishMessage(binary_message=model.BinaryMessage(message=value))
    )
    request = model.PublishToTopicRequest(topic=topic, publish_message=message)
    headers = {
        ":message-type": es.APPLICATION_MESSAGE,
        ":message-flags": 0,
        ":stream-id": 1,
        "operation": "aws.greengrass#PublishToTopic",
        "service-model-type": request._model_name(),
        ":content-type": "application/json",
    }
    sent = len(es.encode(headers, json.dumps(request._to_payload()).encode()))
    if kind == "json":
        context = model.MessageContext(topic=topic)
        shape = model.SubscriptionResponseMessage(
            json_message=model.JsonMessage(message=value, context=context)
        )
        event = codec.dumps(shape._to_payload()).encode()
    else:
        event = binary_event_payload(topic, value)
    event_headers = {
        ":message-type": es.APPLICATION_MESSAGE,
        ":message-flags": 0,
        ":stream-id": 1,
        ":content-type": "application/json",
        "service-model-type": "aws.greengrass#SubscriptionResponseMessage",
    }
    return max(sent, len(es.encode(event_headers, event)))


class LocalClient:
    """Local pub/sub as a test component sees it, straight on the simulator's router (no auth)."""

    def __init__(self, sim: Simulator) -> None:
        self._sim = sim

    def publish(self, topic: str, payload: bytes | str | dict[str, Any] | list[Any]) -> None:
        """bytes/str go out as a binaryMessage, dict/list as a jsonMessage. Over the nucleus's IPC
        message limit (nucleus lite: 10,000 bytes) SimError: a component sending it would have its
        whole IPC connection closed, and nobody would receive the message."""
        value: Any
        if isinstance(payload, (dict, list)):
            kind, value = "json", payload
        else:
            kind, value = "binary", payload.encode() if isinstance(payload, str) else bytes(payload)
        nucleus = self._sim._need()
        limit = nucleus.profile.ipc_max_message_bytes
        size = message_frame_size(topic, kind, value) if limit is not None else 0
        if limit is not None and size > limit:
            from edgeinfer.sim.simulator import SimError  # which imports this module

            raise SimError(
                f"a {size}-byte PublishToTopic, over the {limit} bytes nucleus {nucleus.profile.name} "
                "carries in one IPC message: it closes the sender's whole IPC connection"
            )
        self._sim._call(lambda: nucleus.publish_local(topic, kind, value, None))

    def subscribe(self, topic_filter: str) -> Inbox:
        inbox = Inbox(topic_filter, "local")
        nucleus = self._sim._need()
        remove = self._sim._call(lambda: nucleus.add_local_callback(topic_filter, inbox.put))
        inbox._closer = lambda: self._sim._call(remove)
        return inbox
