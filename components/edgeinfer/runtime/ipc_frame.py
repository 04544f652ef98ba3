"""How large an IPC message the runtime's publish makes, reckoned cheaply and from above.

The bus sends a payload as a binary message: it travels base64 inside the frame's JSON (4 bytes for
every 3), beside the topic, the event-stream headers and framing, the JSON keys around it and, on a
PublishToIoTCore, the MQTT 5 properties. A subscriber's event is the same size give or take the
headers (the topic as context in place of the request's). Nucleus lite closes a component's whole
IPC connection on a message over its cap (`IPC_MAX_BYTES`), so what the runtime publishes is checked
against this before it goes.
"""

from __future__ import annotations

import json

from edgeinfer.transport import MqttProperties

__all__ = ["IPC_ENVELOPE_BYTES", "framed_size"]

# The headers, framing and JSON keys around a payload, with room to spare (what a frame holds beside
# the payload and the topic is a fraction of this).
IPC_ENVELOPE_BYTES = 1000


def _base64_len(n: int) -> int:
    return -(-n // 3) * 4


def _json_len(text: str) -> int:
    return len(json.dumps(text))


def framed_size(topic: str, payload_len: int, properties: MqttProperties | None = None) -> int:
    """At least the bytes of the IPC frame publishing a `payload_len`-byte payload on `topic`."""
    size = _base64_len(payload_len) + _json_len(topic) + IPC_ENVELOPE_BYTES
    if properties is not None:
        size += _base64_len(len(properties.correlation_data or b""))
        size += _json_len(properties.response_topic or "") + _json_len(properties.content_type or "")
        size += sum(_json_len(k) + _json_len(v) + 32 for k, v in properties.user_properties)
    return size
