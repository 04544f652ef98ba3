"""The runtime's reader: one message off the bus → the request it carries, or a refusal, as data.

`read_message` is pure (no threads, no bus, no clock): from the MQTT 5 envelope and the payload it
finds the request (JSON, or on IoT Core the image itself with its parameters in user properties),
where its answer goes (`ReplyTarget`: the topic, the bus it came from, the MQTT 5 correlation data to
echo), what its deadline counts from, and the runtime's configured defaults for what it left out
(`topK`, `maxDetections`, `scoreThreshold`). A message that cannot be served comes back as a `Refusal`:
the error code, the message, the request id when it had one, and where to answer.

A JSON request's image stays base64 (`Inbound.head`) until the request is taken on, so what is
answered on the cheap fields (a deadline that passed upstream, a full queue) costs no decode.

A request's `image_url` outside the runtime's `imageUrls` is refused BAD_REQUEST here; an allowed one
is fetched only once the request is taken on (`edgeinfer.runtime.image_url`, on a decode worker).

Reply topics are checked once each: MQTT 5's response topic before the payload is read (a malformed
request is answered there when it is allowed), and `reply_to`; a request without `reply_to` takes the
response topic as its own. One that is not allowed is answered BAD_REQUEST on the default topic.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from edgeinfer.messages import (
    RAW_IMAGE_TYPES,
    ErrorCode,
    MessageError,
    Request,
    RequestHead,
    read_raw_request,
    read_request,
    result_topic,
)
from edgeinfer.runtime.config import RuntimeConfig
from edgeinfer.runtime.image_url import url_allowed
from edgeinfer.transport import Message, MqttProperties, Target
from edgeinfer.transport.base import topic_matches

__all__ = ["Inbound", "Refusal", "ReplyTarget", "model_refusal", "read_message", "reply_allowed"]


@dataclass(frozen=True)
class ReplyTarget:
    """Where a request's one answer goes."""

    topic: str
    bus: Target = "local"
    properties: MqttProperties | None = None  # MQTT 5: the request's correlation data, echoed


@dataclass(frozen=True)
class Refusal:
    """A message the runtime answers with an error before any work is spent on it."""

    code: ErrorCode
    message: str
    request_id: str | None
    reply: ReplyTarget


@dataclass
class Inbound:
    """A request read off the bus, its configured defaults applied."""

    request: Request
    reply: ReplyTarget
    head: RequestHead | None = None  # set while the image's base64 waits to be decoded
    expiry_s: float | None = None  # what is left of its MQTT 5 message expiry (IoT Core)
    default_deadline_ms: float = 0.0  # `defaultDeadlineMs` (0: none) for a request that sets none

    def deadline(self, arrived: float, wall_now: float) -> float | None:
        """The deadline on the clock `arrived` was read from (`wall_now`: the wall clock then): the
        earliest of `deadline_ms` (from `sent_at` when given, else from arrival; the default when it
        has none), `deadline_at`, and what is left of its message expiry."""
        req = self.request
        ends: list[float] = []
        expires = req.expires_at()
        if expires is not None:
            ends.append(arrived + (expires - wall_now))
        deadline_ms = req.deadline_ms or self.default_deadline_ms or None
        if deadline_ms and req.sent_at is None:
            ends.append(arrived + deadline_ms / 1000)
        elif deadline_ms and req.deadline_ms is None and req.sent_at is not None:
            # The configured default counts from the sending too, as a request's own would.
            ends.append(arrived + (req.sent_at + deadline_ms / 1000 - wall_now))
        if self.expiry_s is not None:
            ends.append(arrived + self.expiry_s)
        return min(ends, default=None)


def reply_allowed(topic: str, cfg: RuntimeConfig, thing: str) -> bool:
    """The default result topic, or one `replyToTopics` allows."""
    if topic == result_topic(thing):
        return True
    return any(topic_matches(f.replace("{thing}", thing), topic) for f in cfg.reply_to_topics)


def model_refusal(model: str | None, served: Sequence[str]) -> str:
    """Why a request naming `model` is refused here: the model, and every one this runtime serves."""
    return f"unknown model {model!r}: this runtime serves {', '.join(repr(name) for name in served)}"


def read_message(msg: Message, cfg: RuntimeConfig, thing: str) -> Inbound | Refusal:
    """The request `msg` carries, or why it is refused (see the module's docstring)."""
    props = msg.properties if msg.target == "iot" else None
    default = ReplyTarget(result_topic(thing), msg.target, _reply_properties(props))
    asked = props.response_topic if props is not None else None
    response = None if asked is None or not reply_allowed(asked, cfg, thing) else asked
    try:
        head = _read_payload(msg, props, cfg)
    except MessageError as exc:
        where = default if response is None else dataclasses.replace(default, topic=response)
        return Refusal(exc.code, exc.message, exc.request_id, where)
    req = head.request
    _apply_defaults(req, head.given, cfg)
    if req.reply_to is not None and not reply_allowed(req.reply_to, cfg, thing):
        why = f"'reply_to' {req.reply_to!r} is not a topic this component may publish to"
        return Refusal(ErrorCode.BAD_REQUEST, why, req.id, default)
    if req.image_url is not None and not url_allowed(req.image_url, cfg.image_urls):
        why = (
            f"image_url is not allowed: {req.image_url.split('?', 1)[0]!r} starts with no prefix in imageUrls"
        )
        return Refusal(ErrorCode.BAD_REQUEST, why, req.id, default)
    if req.reply_to is None and asked is not None:
        if response is None:
            why = f"response topic {asked!r} is not a topic this component may publish to"
            return Refusal(ErrorCode.BAD_REQUEST, why, req.id, default)
        req.reply_to = response
    return Inbound(
        request=req,
        reply=dataclasses.replace(default, topic=req.reply_to or default.topic),
        head=head if head.image_b64 is not None else None,
        expiry_s=props.message_expiry_s if props is not None else None,
        default_deadline_ms=cfg.default_deadline_ms,
    )


def _reply_properties(props: MqttProperties | None) -> MqttProperties | None:
    """MQTT 5 request/response: the answer goes back with the request's correlation data."""
    if props is None or props.correlation_data is None:
        return None
    return MqttProperties(
        content_type="application/json", correlation_data=props.correlation_data, payload_format="utf8"
    )


def _read_payload(msg: Message, props: MqttProperties | None, cfg: RuntimeConfig) -> RequestHead:
    """Everything but a JSON request's image base64. Raises `MessageError`."""
    if props is not None and (props.content_type or "").lower() in RAW_IMAGE_TYPES:
        return read_raw_request(
            msg.payload,
            dict(props.user_properties),
            correlation_data=props.correlation_data,
            max_bytes=cfg.max_payload_bytes,
        )
    return read_request(msg.payload, max_bytes=cfg.max_payload_bytes, allow_image_path=msg.target == "local")


def _apply_defaults(req: Request, given: frozenset[str], cfg: RuntimeConfig) -> None:
    """The runtime's configured defaults, where the request left the key out."""
    if "top_k" not in given:
        req.top_k = cfg.top_k
    if req.max_detections is None and cfg.max_detections:
        req.max_detections = cfg.max_detections
    if req.score_threshold is None and cfg.score_threshold:
        req.score_threshold = cfg.score_threshold
