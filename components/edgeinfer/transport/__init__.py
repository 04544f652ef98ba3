"""All I/O behind one seam (see `base`). Import the protocol and helpers from here."""

from edgeinfer.transport.base import (
    Bus,
    ConfigUpdateHandler,
    ConfigValidator,
    Message,
    MessageHandler,
    MqttProperties,
    PublishDone,
    PubSub,
    Subscription,
    Target,
    TransportError,
    UnauthorizedError,
    topic_matches,
)
from edgeinfer.transport.memory import MemoryBus

__all__ = [
    "Bus",
    "ConfigUpdateHandler",
    "ConfigValidator",
    "MemoryBus",
    "Message",
    "MessageHandler",
    "MqttProperties",
    "PubSub",
    "PublishDone",
    "Subscription",
    "Target",
    "TransportError",
    "UnauthorizedError",
    "topic_matches",
]
