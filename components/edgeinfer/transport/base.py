"""The one seam through which components do I/O: pub/sub, IoT Core, configuration and state.

Core logic (batcher, handlers, telemetry windows, the router) is written against these protocols and
tested with `MemoryBus`; the real implementations (`ipc.GreengrassIpcBus` over the Greengrass IPC
socket, `mqtt.MqttPubSub` over MQTT 5) are tested against the real nucleus protocol and broker.
Handlers are called on a transport thread: they must return quickly and never raise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

Target = Literal["local", "iot"]
"""`local`: Greengrass local pub/sub. `iot`: AWS IoT Core (MQTT), or the broker that stands in for it."""


@dataclass(frozen=True)
class MqttProperties:
    """MQTT 5 publish properties, as IoT Core carries them and the nucleus hands them over IPC
    (awsiotsdk's `MQTTMessage` / `PublishToIoTCoreRequest` have the same fields).

    `message_expiry_s` on a received message is what is left of the sender's interval (the broker
    counts down the time it held the message); on a publish, the interval to give it.
    """

    content_type: str | None = None
    correlation_data: bytes | None = None
    response_topic: str | None = None
    user_properties: tuple[tuple[str, str], ...] = ()
    message_expiry_s: int | None = None
    payload_format: Literal["bytes", "utf8"] | None = None

    def user(self, key: str) -> str | None:
        """The first user property named `key`, if any."""
        for name, value in self.user_properties:
            if name == key:
                return value
        return None


@dataclass(frozen=True)
class Message:
    topic: str
    payload: bytes
    target: Target = "local"
    properties: MqttProperties | None = None  # IoT Core messages only (MQTT 5)


class TransportError(Exception):
    """An I/O operation failed (not connected, refused, timed out). The message says which and why."""


class UnauthorizedError(TransportError):
    """The nucleus refused the operation: the component's accessControl does not grant it."""


@runtime_checkable
class Subscription(Protocol):
    def close(self) -> None: ...


MessageHandler = Callable[[Message], None]
PublishDone = Callable[["TransportError | None"], None]
"""Called once the nucleus has taken a `publish_nowait` (None) or refused it (the error)."""
ConfigUpdateHandler = Callable[[list[str]], None]
ConfigValidator = Callable[[dict[str, Any]], "str | None"]
"""Returns None to accept the proposed configuration, or the reason for refusing it."""


class PubSub(Protocol):
    """Publish and subscribe, the part every side (device and cloud) needs.

    `subscribe(..., inline=True)` runs the handler on the transport's I/O thread instead of handing it
    to a callback thread: the lowest latency for a hot path, but such a handler must not call any
    blocking method of the transport (the I/O thread would wait on itself).
    """

    def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        target: Target = "local",
        qos: int = 0,
        properties: MqttProperties | None = None,
    ) -> None: ...

    def subscribe(
        self,
        topic: str,
        handler: MessageHandler,
        *,
        target: Target = "local",
        qos: int = 0,
        inline: bool = False,
    ) -> Subscription: ...

    def close(self) -> None: ...


class Bus(PubSub, Protocol):
    """What a Greengrass component sees of its nucleus.

    `publish_nowait` sends without waiting for the nucleus (safe in an inline handler); `on_done`, on
    a transport thread, learns the outcome. It raises `TransportError` at once when the message
    cannot even be sent. `properties` (MQTT 5) travel on IoT Core publishes; local pub/sub has none.
    """

    def publish_nowait(
        self,
        topic: str,
        payload: bytes,
        *,
        target: Target = "local",
        qos: int = 0,
        on_done: PublishDone | None = None,
        properties: MqttProperties | None = None,
    ) -> None: ...

    def get_configuration(self, key_path: Sequence[str] = (), component: str | None = None) -> Any: ...

    def update_configuration(self, key_path: Sequence[str], value: Any) -> None: ...

    def on_configuration_update(self, handler: ConfigUpdateHandler) -> Subscription: ...

    def on_validate_configuration(self, validator: ConfigValidator) -> Subscription: ...

    def update_state(self, state: Literal["RUNNING", "ERRORED"]) -> None: ...


def topic_matches(topic_filter: str, topic: str) -> bool:
    """MQTT filter matching with `+` (one level) and `#` (the rest, including the parent level)."""
    if topic_filter == topic:
        return True
    f_parts = topic_filter.split("/")
    t_parts = topic.split("/")
    for i, part in enumerate(f_parts):
        if part == "#":
            return i == len(f_parts) - 1
        if i >= len(t_parts):
            return False
        if part != "+" and part != t_parts[i]:
            return False
    return len(f_parts) == len(t_parts)
