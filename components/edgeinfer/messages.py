"""The message contract: topics, requests, results, timing events and telemetry windows.

Every side (runtime, telemetry, cloud router, tests, tools) imports this module; nothing else defines
a wire shape. All payloads are UTF-8 JSON with snake_case keys and ISO-8601 UTC timestamps with `Z`
(docs/design.md, "The message contract"). Over 500 lines because the contract is one module by
design: every shape on the wire, and every way to misread one, is defined in one place.

Parsing never raises anything but `MessageError`, which carries the stable error code and, when the
payload had one, the request id, so that the caller can always answer with exactly one result.
"""

from __future__ import annotations

import binascii
import contextlib
import datetime as _dt
import enum
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, cast

from edgeinfer import codec
from edgeinfer.limits import IPC_MAX_BYTES

__all__ = [
    "DEFAULT_TOP_K",
    "IOT_CORE_MAX_BYTES",
    "IPC_MAX_BYTES",
    "RAW_IMAGE_TYPES",
    "TIMED_DETECTIONS",
    "TIMINGS_TOPIC",
    "Box",
    "Detection",
    "ErrorCode",
    "ErrorInfo",
    "Latency",
    "MessageError",
    "ModelQuality",
    "ModelRef",
    "ModelTable",
    "OffloadOrigin",
    "OffloadRequest",
    "Prediction",
    "Request",
    "RequestHead",
    "Result",
    "StageQuantiles",
    "TelemetryWindow",
    "TimedModel",
    "TimingBatch",
    "TimingRecord",
    "error_result",
    "fits_iot_core",
    "infer_topic",
    "is_thing_name",
    "iso_utc",
    "offload_result_topic",
    "offload_topic",
    "parse_iso_utc",
    "parse_raw_request",
    "parse_request",
    "read_raw_request",
    "read_request",
    "result_topic",
    "telemetry_topic",
]

# --------------------------------------------------------------------------------------------- topics

IOT_CORE_MAX_BYTES = 131072
"""IoT Core's hard limit per message (128 KB), and the nucleus's `mqtt.maxMessageSizeInBytes`, at
which it refuses a PublishToIoTCore before the network (see `fits_iot_core`)."""


def fits_iot_core(payload: bytes) -> bool:
    """Would the nucleus pass this payload on to IoT Core? Older classic nuclei refuse a payload of
    exactly `mqtt.maxMessageSizeInBytes` too (`>=` in `MqttClient.isValidPublishRequest`)."""
    return len(payload) < IOT_CORE_MAX_BYTES


RAW_IMAGE_TYPES = ("image/jpeg", "image/png")
"""MQTT 5 content types of a request whose payload is the image itself (see `parse_raw_request`)."""

TIMINGS_TOPIC = "edgeinfer/local/timings"
"""Local pub/sub only: batched per-request stage timings from the runtime to the telemetry component."""
_THING_NAME = re.compile(r"[A-Za-z0-9:_-]{1,128}")


def is_thing_name(name: str) -> bool:
    """An AWS IoT thing name (1-128 of letters, digits, ':', '_', '-'): safe as one topic level."""
    return _THING_NAME.fullmatch(name) is not None


def infer_topic(thing: str) -> str:
    return f"edgeinfer/{thing}/infer"


def result_topic(thing: str) -> str:
    return f"edgeinfer/{thing}/result"


def offload_topic(thing: str) -> str:
    return f"edgeinfer/{thing}/offload"


def offload_result_topic(thing: str) -> str:
    return f"edgeinfer/{thing}/offload/result"


def telemetry_topic(thing: str) -> str:
    return f"edgeinfer/{thing}/telemetry"


# ------------------------------------------------------------------------------------------- helpers


_iso_second: tuple[int, str] = (-1, "")  # the last whole second formatted, and its text


def iso_utc(epoch_s: float) -> str:
    """`2026-11-29T14:52:13.123Z` — millisecond precision, always UTC with a `Z`."""
    global _iso_second
    # datetime's own rounding to microseconds (`datetime.fromtimestamp`), then milliseconds down
    frac, whole = math.modf(epoch_s)
    second, micro = int(whole), round(frac * 1e6)
    if micro >= 1_000_000:
        second, micro = second + 1, micro - 1_000_000
    elif micro < 0:
        second, micro = second - 1, micro + 1_000_000
    milli = micro // 1000
    last, text = _iso_second  # one tuple: threads see a pair that belongs together
    if second != last:
        # strftime is ~10 us and every result and timing record is stamped: once per second is enough
        moment = _dt.datetime.fromtimestamp(second, tz=_dt.timezone.utc)
        text = moment.strftime("%Y-%m-%dT%H:%M:%S.")
        _iso_second = (second, text)
    return f"{text}{milli:03d}Z"


def parse_iso_utc(text: str) -> float:
    """Inverse of `iso_utc` (accepts any ISO-8601 form ending in `Z` or an offset)."""
    moment = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=_dt.timezone.utc)
    return moment.timestamp()


def _dumps(obj: Any) -> bytes:
    return codec.dumpb(obj)  # an offload carries the image: the stdlib took 0.21 ms, this 0.03 ms


def _round(value: float, digits: int = 3) -> float:
    return round(float(value), digits)


# --------------------------------------------------------------------------------------------- errors


class ErrorCode(str, enum.Enum):
    """Stable error codes: clients switch on these, so they never change meaning."""

    BAD_REQUEST = "BAD_REQUEST"
    BAD_IMAGE = "BAD_IMAGE"
    TOO_LARGE = "TOO_LARGE"
    OVERLOADED = "OVERLOADED"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    INTERNAL = "INTERNAL"

    def __str__(self) -> str:
        return self.value


class MessageError(Exception):
    """A payload that cannot be served. `request_id` is set when the payload carried a usable id."""

    def __init__(self, code: ErrorCode, message: str, request_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id


_MALFORMED = (KeyError, TypeError, ValueError, AttributeError, OverflowError)
"""What reading a wrongly shaped document raises; the parsers turn it into MessageError."""


def _malformed(what: str, exc: Exception) -> MessageError:
    return MessageError(ErrorCode.BAD_REQUEST, f"malformed {what} ({type(exc).__name__}: {exc})")


@dataclass(frozen=True)
class ErrorInfo:
    code: ErrorCode
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code.value, "message": self.message}


# ------------------------------------------------------------------------------------------- requests

OffloadMode = Literal["auto", "never", "always"]
ResultFormat = Literal["edgeinfer", "dlr"]
_OFFLOAD_MODES = ("auto", "never", "always")
_RESULT_FORMATS = ("edgeinfer", "dlr")
_MAX_ID_LEN = 256
_MAX_TOPIC_LEN = 256
DEFAULT_TOP_K = 5  # what a request that leaves `top_k` out gets, before a runtime's `topK`
MAX_TOP_K = 100
MAX_DETECTIONS = 300


@dataclass
class Request:
    """An inference request. `image` holds the encoded image bytes (already base64-decoded).

    `sent_at` (when the client sent it) and `deadline_at` (an absolute deadline) are epoch seconds on
    the sender's clock, ISO-8601 UTC on the wire: with `sent_at`, `deadline_ms` counts from the
    sending, so time the request spent upstream (a broker's queue, a clogged bridge) counts against it.
    """

    id: str
    image: bytes | None = None
    image_path: str | None = None
    image_url: str | None = None  # s3://bucket/key or http(s)://…, fetched once the request is taken on
    reply_to: str | None = None
    deadline_ms: float | None = None
    top_k: int = DEFAULT_TOP_K
    offload: OffloadMode = "auto"
    model: str | None = None
    result_format: ResultFormat = "edgeinfer"
    sent_at: float | None = None
    deadline_at: float | None = None
    # detection: None takes the runtime's configured defaults (from the model's manifest)
    max_detections: int | None = None
    score_threshold: float | None = None

    def expires_at(self) -> float | None:
        """The wall-clock time (epoch s) after which an answer is of no use, as far as the request
        itself says; None when it says nothing absolute (then `deadline_ms` counts from arrival)."""
        ends = [] if self.deadline_at is None else [self.deadline_at]
        if self.sent_at is not None and self.deadline_ms is not None:
            ends.append(self.sent_at + self.deadline_ms / 1000.0)
        return min(ends, default=None)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id}
        if self.image is not None:
            out["image"] = codec.b64encode(self.image).decode("ascii")
        if self.image_path is not None:
            out["image_path"] = self.image_path
        if self.image_url is not None:
            out["image_url"] = self.image_url
        for key in ("reply_to", "deadline_ms", "model", "max_detections", "score_threshold"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        out["top_k"] = self.top_k
        out["offload"] = self.offload
        if self.result_format != "edgeinfer":
            out["result_format"] = self.result_format
        if self.sent_at is not None:
            out["sent_at"] = iso_utc(self.sent_at)
        if self.deadline_at is not None:
            out["deadline_at"] = iso_utc(self.deadline_at)
        return out

    def to_json(self) -> bytes:
        return _dumps(self.to_dict())


def _request_id(doc: Mapping[str, Any]) -> str | None:
    raw = doc.get("id")
    if isinstance(raw, bool) or not isinstance(raw, (str, int)):
        return None
    text = str(raw)
    if not text or len(text) > _MAX_ID_LEN:
        return None
    return text


def _load_object(payload: bytes | str | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(payload, Mapping):
        return dict(payload)
    try:
        doc = codec.loads(payload)
    except (UnicodeDecodeError, ValueError) as exc:
        raise MessageError(ErrorCode.BAD_REQUEST, f"payload is not valid UTF-8 JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise MessageError(ErrorCode.BAD_REQUEST, "payload must be a JSON object")
    return doc


@dataclass
class RequestHead:
    """A request read and checked in full except its image's base64, which `decode` turns into
    `request.image`. What the runtime answers on the cheap fields (a deadline that passed upstream, a
    full queue) costs it no base64 decode; `given` names the keys the payload had."""

    request: Request
    image_b64: str | bytes | memoryview | None = None  # the 'image' value, still base64
    given: frozenset[str] = frozenset()
    whole: bytes | None = None  # the payload, when its image was cut out unparsed (see `decode`)

    def decode(self) -> Request:
        """`request` with its image decoded. Raises `MessageError` (BAD_IMAGE, or BAD_REQUEST for a
        payload that was not JSON after all), as `parse_request` does."""
        text, self.image_b64 = self.image_b64, None
        if text is None:
            return self.request
        rid = self.request.id
        try:
            image = codec.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            if self.whole is not None:
                _load_object(self.whole)  # the cut-out value may be what made the JSON invalid
            raise MessageError(ErrorCode.BAD_IMAGE, "'image' is not valid base64", rid) from None
        if not image:
            raise MessageError(ErrorCode.BAD_IMAGE, "'image' decodes to zero bytes", rid)
        self.request.image = image
        return self.request


_IMAGE_KEY = b'"image"'
_JSON_SPACE = b" \t\r\n"


def _cut_image(payload: bytes) -> tuple[bytes, memoryview] | None:
    """`(payload with the image's value replaced by 0, that value's text)` for a request whose one
    `"image"` key has a plain string value (no escapes); None for any other shape (then the
    payload is parsed whole). A base64 image is nearly all of a request: parsing the rest is ~1 us,
    the whole ~50 us for a 640x480 JPEG, and the text is only decoded once the request is taken on.

    The key must follow `{` or `,` (an unescaped quote there starts a key; anywhere else the match is
    inside another value, or a nested object's key, which `read_request` tells by the parsed rest),
    and no second `"image"` (nor any `\\u` escape that could spell one) may follow: JSON's last
    duplicate wins, and the whole parse then decides. What makes the value itself invalid JSON (a
    control character, bad UTF-8) also makes it invalid base64: `RequestHead.decode` then parses the
    payload whole for the error it would have had."""
    key = payload.find(_IMAGE_KEY)
    if key < 0:
        return None
    i = key - 1
    while i >= 0 and payload[i] in _JSON_SPACE:
        i -= 1
    if i < 0 or payload[i] not in b"{,":
        return None
    n = len(payload)
    j = key + len(_IMAGE_KEY)
    while j < n and payload[j] in _JSON_SPACE:
        j += 1
    if j >= n or payload[j] != 0x3A:  # ':'
        return None
    j += 1
    while j < n and payload[j] in _JSON_SPACE:
        j += 1
    if j >= n or payload[j] != 0x22:  # '"'
        return None
    begin = j + 1
    end = payload.find(b'"', begin)
    if end < 0 or payload.find(b"\\", begin, end) >= 0:  # an escape (JSON may write / as \\/): parse it whole
        return None
    rest = payload[: begin - 1] + b"0" + payload[end + 1 :]
    if rest.find(_IMAGE_KEY, begin) >= 0 or b"\\u" in rest:
        return None
    return rest, memoryview(payload)[begin:end]  # not copied: decoded from the payload itself


def parse_request(
    payload: bytes | str | Mapping[str, Any],
    *,
    max_bytes: int | None = None,
    allow_image_path: bool = True,
) -> Request:
    """Validate a request payload. Raises `MessageError` with the right code, and the id if known.

    `max_bytes` bounds the raw payload (TOO_LARGE); `allow_image_path` is False for requests that
    came from IoT Core, which may not name files on the device. The image's base64 is checked last.
    """
    return read_request(payload, max_bytes=max_bytes, allow_image_path=allow_image_path).decode()


def read_request(
    payload: bytes | str | Mapping[str, Any],
    *,
    max_bytes: int | None = None,
    allow_image_path: bool = True,
) -> RequestHead:
    """`parse_request` up to the image's base64 (`RequestHead.decode` does that). Each field is read
    and checked in the order below; the first that is wrong is the error."""
    doc, cut = _load_request(payload, max_bytes)
    rid = _required_id(doc, payload, cut)
    image, image_b64, image_path = _read_image(doc, cut, rid, allow_image_path=allow_image_path)
    image_url = _read_image_url(
        doc, image is not None or image_b64 is not None or image_path is not None, rid
    )
    reply_to = _read_reply_to(doc, rid)
    deadline_ms = _read_deadline_ms(doc, rid)
    top_k = _read_count(doc, "top_k", MAX_TOP_K, rid, default=DEFAULT_TOP_K)
    offload = _read_choice(
        doc, "offload", _OFFLOAD_MODES, rid, "'offload' must be one of auto, never, always"
    )
    model = _read_model(doc, rid)
    result_format = _read_choice(
        doc, "result_format", _RESULT_FORMATS, rid, "'result_format' must be 'edgeinfer' or 'dlr'"
    )
    max_detections = _read_count(doc, "max_detections", MAX_DETECTIONS, rid)
    score_threshold = _read_score_threshold(doc, rid)
    sent_at = _read_time(doc, "sent_at", rid)
    deadline_at = _read_time(doc, "deadline_at", rid)
    request = Request(
        id=rid,
        image=image,
        image_path=image_path,
        image_url=image_url,
        reply_to=reply_to,
        deadline_ms=deadline_ms,
        top_k=DEFAULT_TOP_K if top_k is None else top_k,
        offload=cast("OffloadMode", offload),
        model=model,
        result_format=cast("ResultFormat", result_format),
        sent_at=sent_at,
        deadline_at=deadline_at,
        max_detections=max_detections,
        score_threshold=score_threshold,
    )
    whole = payload if cut is not None and isinstance(payload, bytes) else None
    return RequestHead(request, image_b64, frozenset(doc), whole)


def _load_request(
    payload: bytes | str | Mapping[str, Any], max_bytes: int | None
) -> tuple[dict[str, Any], tuple[bytes, memoryview] | None]:
    """The payload's object (its image cut out unparsed where `_cut_image` can) and that cut."""
    size = len(payload) if isinstance(payload, (bytes, str)) else 0
    cut = _cut_image(payload) if isinstance(payload, bytes) else None
    if max_bytes is not None and size > max_bytes:
        # Still try to echo the id: the client needs it to match the error to its request.
        rid = None
        with contextlib.suppress(MessageError):
            rid = _request_id(_load_object(payload if cut is None else cut[0]))
        raise MessageError(
            ErrorCode.TOO_LARGE, f"payload is {size} bytes, over the limit of {max_bytes}", rid
        )
    doc = _load_object(payload if cut is None else cut[0])
    if cut is not None and "image" not in doc:  # the cut key was a nested object's
        return _load_object(payload), None
    return doc, cut


def _required_id(
    doc: Mapping[str, Any], payload: bytes | str | Mapping[str, Any], cut: tuple[bytes, memoryview] | None
) -> str:
    rid = _request_id(doc)
    if rid is None:
        if cut is not None:
            _load_object(payload)  # the cut-out value may be what made the JSON invalid
        raise MessageError(ErrorCode.BAD_REQUEST, "'id' is required: a non-empty string of at most 256 chars")
    return rid


_IMAGE_URL_SCHEMES = ("s3://", "https://", "http://")
_MAX_URL_LEN = 4096  # a presigned URL with a session token runs to a few KB


def _read_image_url(doc: Mapping[str, Any], has_image: bool, rid: str) -> str | None:
    """`image_url` when given: the image by reference (whether it is allowed is the runtime's call)."""
    raw = doc.get("image_url")
    if raw is None:
        return None
    if has_image:
        raise MessageError(ErrorCode.BAD_REQUEST, "give one of 'image', 'image_path' or 'image_url'", rid)
    if (
        not isinstance(raw, str)
        or len(raw) > _MAX_URL_LEN
        or not raw.startswith(_IMAGE_URL_SCHEMES)
        or not raw.isprintable()
    ):
        raise MessageError(
            ErrorCode.BAD_REQUEST,
            f"'image_url' must be an s3://, https:// or http:// URL of at most {_MAX_URL_LEN} characters",
            rid,
        )
    return raw


def _read_image(
    doc: Mapping[str, Any], cut: tuple[bytes, memoryview] | None, rid: str, *, allow_image_path: bool
) -> tuple[bytes | None, str | bytes | memoryview | None, str | None]:
    """`(image bytes, image base64, image_path)`: exactly one of them is set."""
    raw_image = doc.get("image") if cut is None else cut[1]
    raw_path = doc.get("image_path")
    if raw_image is not None and raw_path is not None:
        raise MessageError(ErrorCode.BAD_REQUEST, "give either 'image' or 'image_path', not both", rid)
    if cut is None and isinstance(raw_image, (bytes, bytearray)):  # raw MQTT 5 (`parse_raw_request`)
        if not raw_image:
            raise MessageError(ErrorCode.BAD_IMAGE, "the image payload is empty", rid)
        return bytes(raw_image), None, None
    if raw_image is not None:
        if not isinstance(raw_image, (str, memoryview)) or not raw_image:
            raise MessageError(ErrorCode.BAD_IMAGE, "'image' must be a non-empty base64 string", rid)
        return None, raw_image, None
    if raw_path is None:
        if doc.get("image_url") is not None:
            return None, None, None  # `_read_image_url` reads it
        raise MessageError(
            ErrorCode.BAD_REQUEST, "one of 'image' (base64), 'image_path' or 'image_url' is required", rid
        )
    if not allow_image_path:
        raise MessageError(ErrorCode.BAD_REQUEST, "'image_path' is only accepted on local pub/sub", rid)
    if not isinstance(raw_path, str) or not raw_path or "\x00" in raw_path:
        raise MessageError(ErrorCode.BAD_REQUEST, "'image_path' must be a non-empty path string", rid)
    return None, None, raw_path


def _read_reply_to(doc: Mapping[str, Any], rid: str) -> str | None:
    reply_to = doc.get("reply_to")
    if reply_to is not None and (
        not isinstance(reply_to, str)
        or not reply_to
        or len(reply_to) > _MAX_TOPIC_LEN
        or any(c in reply_to for c in "+#\x00")
    ):
        raise MessageError(ErrorCode.BAD_REQUEST, "'reply_to' must be a topic name without wildcards", rid)
    return reply_to


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float))


def _read_deadline_ms(doc: Mapping[str, Any], rid: str) -> float | None:
    deadline_ms = doc.get("deadline_ms")
    if deadline_ms is None:
        return None
    if not _is_number(deadline_ms) or not math.isfinite(deadline_ms) or deadline_ms <= 0:
        raise MessageError(ErrorCode.BAD_REQUEST, "'deadline_ms' must be a positive number", rid)
    return float(deadline_ms)


def _read_count(
    doc: Mapping[str, Any], key: str, most: int, rid: str, *, default: int | None = None
) -> int | None:
    """An integer from 1 to `most`; `default` when the key is missing (an explicit null is that
    default only when there is none)."""
    value = doc.get(key, default)
    if value is None and default is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise MessageError(ErrorCode.BAD_REQUEST, f"'{key}' must be an integer from 1 to {most}", rid)
    return value


def _read_choice(doc: Mapping[str, Any], key: str, choices: tuple[str, ...], rid: str, why: str) -> str:
    value = doc.get(key, choices[0])
    if value not in choices:
        raise MessageError(ErrorCode.BAD_REQUEST, why, rid)
    return str(value)


def _read_model(doc: Mapping[str, Any], rid: str) -> str | None:
    model = doc.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise MessageError(ErrorCode.BAD_REQUEST, "'model' must be a non-empty string", rid)
    return model


def _read_score_threshold(doc: Mapping[str, Any], rid: str) -> float | None:
    value = doc.get("score_threshold")
    if value is None:
        return None
    if not _is_number(value) or not 0 <= value < 1:
        raise MessageError(ErrorCode.BAD_REQUEST, "'score_threshold' must be a number from 0 to below 1", rid)
    return float(value)


def _read_time(doc: Mapping[str, Any], key: str, rid: str) -> float | None:
    raw = doc.get(key)
    if raw is None:
        return None
    try:
        if not isinstance(raw, str):
            raise ValueError(raw)
        return parse_iso_utc(raw)
    except (ValueError, OverflowError, OSError):
        why = f"'{key}' must be an ISO-8601 UTC time, e.g. 2026-11-29T14:52:13.123Z"
        raise MessageError(ErrorCode.BAD_REQUEST, why, rid) from None


_RAW_NUMBERS = {"deadline_ms": float, "top_k": int, "max_detections": int, "score_threshold": float}


def parse_raw_request(
    image: bytes,
    params: Mapping[str, str],
    *,
    correlation_data: bytes | None = None,
    max_bytes: int | None = None,
) -> Request:
    """A request whose payload is the encoded image itself (MQTT 5, `content_type` one of
    `RAW_IMAGE_TYPES`), its parameters in user properties named as the JSON keys (string values).

    Without an `id` property the correlation data stands in for it (as text when it is printable
    UTF-8, else as hex), so the answer can still be matched. Raises `MessageError` as `parse_request` does.
    """
    return read_raw_request(image, params, correlation_data=correlation_data, max_bytes=max_bytes).decode()


def read_raw_request(
    image: bytes,
    params: Mapping[str, str],
    *,
    correlation_data: bytes | None = None,
    max_bytes: int | None = None,
) -> RequestHead:
    """`parse_raw_request` as a `RequestHead` (its `given` names the parameters the request had)."""
    doc: dict[str, Any] = {k: v for k, v in params.items() if k not in ("image", "image_path", "image_url")}
    if "id" not in doc and correlation_data:
        try:
            text = correlation_data.decode("utf-8")
        except UnicodeDecodeError:
            text = ""
        doc["id"] = text if text.isprintable() and text else correlation_data.hex()
    rid = _request_id(doc)
    if max_bytes is not None and len(image) > max_bytes:
        raise MessageError(
            ErrorCode.TOO_LARGE, f"payload is {len(image)} bytes, over the limit of {max_bytes}", rid
        )
    for key, kind in _RAW_NUMBERS.items():
        if key in doc:
            try:
                doc[key] = kind(doc[key])
            except ValueError:
                raise MessageError(ErrorCode.BAD_REQUEST, f"'{key}' must be a number", rid) from None
    doc["image"] = bytes(image)
    return read_request(doc, allow_image_path=False)


@dataclass(frozen=True)
class OffloadOrigin:
    thing: str
    deadline_left_ms: float | None = None
    sent_at: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"thing": self.thing}
        if self.deadline_left_ms is not None:
            out["deadline_left_ms"] = _round(self.deadline_left_ms)
        if self.sent_at is not None:
            out["sent_at"] = self.sent_at
        return out


@dataclass
class OffloadRequest:
    """A request the edge hands to the cloud router on `edgeinfer/{thing}/offload`."""

    request: Request
    origin: OffloadOrigin

    def to_json(self) -> bytes:
        doc = self.request.to_dict()
        doc["origin"] = self.origin.to_dict()
        return _dumps(doc)

    @classmethod
    def parse(cls, payload: bytes | str, *, max_bytes: int | None = None) -> OffloadRequest:
        doc = _load_object(payload)
        rid = _request_id(doc)
        origin = doc.pop("origin", None)
        if not isinstance(origin, dict) or not isinstance(origin.get("thing"), str) or not origin["thing"]:
            raise MessageError(ErrorCode.BAD_REQUEST, "'origin.thing' is required", rid)
        left = origin.get("deadline_left_ms")
        if left is not None and (isinstance(left, bool) or not isinstance(left, (int, float))):
            raise MessageError(ErrorCode.BAD_REQUEST, "'origin.deadline_left_ms' must be a number", rid)
        if max_bytes is not None and len(payload) > max_bytes:
            raise MessageError(ErrorCode.TOO_LARGE, f"payload over the limit of {max_bytes} bytes", rid)
        request = parse_request(doc, allow_image_path=False)
        sent_at = origin.get("sent_at")
        return cls(
            request,
            OffloadOrigin(
                origin["thing"],
                float(left) if left is not None else None,
                sent_at if isinstance(sent_at, str) else None,
            ),
        )


# -------------------------------------------------------------------------------------------- results

Placement = Literal["edge", "cloud"]


@dataclass(frozen=True)
class Prediction:
    index: int
    label: str
    score: float

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "label": self.label, "score": _round(self.score, 6)}


@dataclass(frozen=True)
class Box:
    """A box in the source image's pixels (the image the request carried, before any resize)."""

    x_min: float
    y_min: float
    x_max: float
    y_max: float

    def to_dict(self) -> dict[str, float]:
        return {
            "x_min": _round(self.x_min, 1),
            "y_min": _round(self.y_min, 1),
            "x_max": _round(self.x_max, 1),
            "y_max": _round(self.y_max, 1),
        }


@dataclass(frozen=True)
class Detection:
    index: int
    label: str
    score: float
    box: Box
    # A pipeline's classification of this detection's crop, best first (docs/models.md, "Pipelines");
    # None (and absent on the wire) for a detector's own answer and for detections it does not crop.
    classification: tuple[Prediction, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {
            "index": self.index,
            "label": self.label,
            "score": _round(self.score, 6),
            "box": self.box.to_dict(),
        }
        if self.classification is not None:
            out["classification"] = [p.to_dict() for p in self.classification]
        return out


@dataclass(frozen=True)
class ModelRef:
    name: str
    version: str
    variant: str

    def to_dict(self) -> dict[str, Any]:
        # spelled out, not asdict(): every result carries one (asdict took ~25 us of a shed request's ~60)
        return {"name": self.name, "version": self.version, "variant": self.variant}


@dataclass
class Latency:
    """Milliseconds per stage. `queue` is the wait before decode/compute, Triton-style."""

    queue: float = 0.0
    decode: float = 0.0
    inference: float = 0.0
    postprocess: float = 0.0
    total: float = 0.0

    def to_dict(self) -> dict[str, float]:
        # spelled out, not asdict(): this runs for every result and timing record (asdict is 5× slower)
        return {
            "queue": round(float(self.queue), 3),
            "decode": round(float(self.decode), 3),
            "inference": round(float(self.inference), 3),
            "postprocess": round(float(self.postprocess), 3),
            "total": round(float(self.total), 3),
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Latency:
        return cls(
            **{k: float(doc.get(k, 0.0)) for k in ("queue", "decode", "inference", "postprocess", "total")}
        )


@dataclass
class Result:
    id: str | None
    status: Literal["ok", "error"]
    timestamp: str
    predictions: list[Prediction] = field(default_factory=list)
    model: ModelRef | None = None
    placement: Placement = "edge"
    provider: str | None = None
    batch_size: int = 0
    latency_ms: Latency = field(default_factory=Latency)
    error: ErrorInfo | None = None
    detections: list[Detection] | None = None  # set (maybe empty) by a detector, instead of predictions

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "status": self.status}
        if self.status == "ok" and self.detections is not None:
            out["detections"] = [d.to_dict() for d in self.detections]
        elif self.status == "ok":
            out["predictions"] = [p.to_dict() for p in self.predictions]
        if self.model is not None:
            out["model"] = self.model.to_dict()
        out["placement"] = self.placement
        if self.provider is not None:
            out["provider"] = self.provider
        out["batch_size"] = self.batch_size
        out["latency_ms"] = self.latency_ms.to_dict()
        if self.error is not None:
            out["error"] = self.error.to_dict()
        out["timestamp"] = self.timestamp
        return out

    def to_json(self) -> bytes:
        return _dumps(self.to_dict())

    def to_dlr_dict(self) -> dict[str, Any]:
        """The message shape of AWS's `aws.greengrass.DLRImageClassification`, for migrating users.

        That component publishes `{"timestamp", "inference-type", "inference-description",
        "inference-results": [{"Label", "Score"}]}` with scores as strings; we keep its shape and types.
        A detector's result takes `aws.greengrass.DLRObjectDetection`'s shape: `"inference-type":
        "object-detection"`, results `{"Label", "Score", "Boundaries": "[x_min y_min x_max y_max]"}`,
        every value a string; the boundaries are in the source image's pixels (DLR's own are in its
        512×512 stretched input, which would need the image size to map back).
        """
        if self.detections is not None:
            return {
                "timestamp": self.timestamp,
                "inference-type": "object-detection",
                "inference-description": f"{len(self.detections)} objects detected",
                "inference-results": [
                    {
                        "Label": d.label,
                        "Score": str(round(d.score, 6)),
                        "Boundaries": f"[{d.box.x_min:g} {d.box.y_min:g} {d.box.x_max:g} {d.box.y_max:g}]",
                    }
                    for d in self.detections
                ],
            }
        return {
            "timestamp": self.timestamp,
            "inference-type": "image-classification",
            "inference-description": f"Top {len(self.predictions)} predictions",
            "inference-results": [
                {"Label": p.label, "Score": str(round(p.score, 6))} for p in self.predictions
            ],
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Result:
        """Raises `MessageError` when the document is not a result."""
        try:
            model = doc.get("model")
            error = doc.get("error")
            return cls(
                id=doc.get("id"),
                status=doc["status"],
                timestamp=doc.get("timestamp", ""),
                predictions=[
                    Prediction(int(p["index"]), str(p["label"]), float(p["score"]))
                    for p in doc.get("predictions", [])
                ],
                model=ModelRef(**model) if isinstance(model, dict) else None,
                placement=doc.get("placement", "edge"),
                provider=doc.get("provider"),
                batch_size=int(doc.get("batch_size", 0)),
                latency_ms=Latency.from_dict(doc.get("latency_ms", {})),
                error=ErrorInfo(ErrorCode(error["code"]), str(error.get("message", ""))) if error else None,
                detections=[
                    Detection(
                        int(d["index"]),
                        str(d["label"]),
                        float(d["score"]),
                        Box(*(float(d["box"][k]) for k in ("x_min", "y_min", "x_max", "y_max"))),
                        _predictions(d["classification"]) if "classification" in d else None,
                    )
                    for d in doc["detections"]
                ]
                if "detections" in doc
                else None,
            )
        except _MALFORMED as exc:
            raise _malformed("result", exc) from None

    @classmethod
    def parse(cls, payload: bytes | str) -> Result:
        return cls.from_dict(_load_object(payload))


def _predictions(docs: Sequence[Mapping[str, Any]]) -> tuple[Prediction, ...]:
    return tuple(Prediction(int(p["index"]), str(p["label"]), float(p["score"])) for p in docs)


def error_result(
    request_id: str | None,
    code: ErrorCode,
    message: str,
    *,
    timestamp: str,
    latency: Latency | None = None,
    placement: Placement = "edge",
    model: ModelRef | None = None,
    provider: str | None = None,
) -> Result:
    return Result(
        id=request_id,
        status="error",
        timestamp=timestamp,
        model=model,
        placement=placement,
        provider=provider,
        latency_ms=latency or Latency(),
        error=ErrorInfo(code, message),
    )


# ------------------------------------------------------------------------------------- timing events


# IPC_MAX_BYTES (nucleus lite's cap on one IPC message) lives in edgeinfer.limits, which imports
# nothing: the runtime's configuration reads it where the installer's verify step runs without this
# module's dependencies. A timing batch (`TimingPublisher`) and a telemetry window stay below it.

TIMED_DETECTIONS = 10
"""A detector's answer carries its most confident detections up to this many into its timing record."""
_TIMED_LABEL = 64  # a label is cut to this many characters in a timing batch's model table


@dataclass
class TimingRecord:
    """One request's stage timings, as the runtime saw it, and what the model answered.

    `model` is the model that answered (None for a request refused before any model); `top` its top-1
    prediction (a classifier), or its most confident detections, up to `TIMED_DETECTIONS` (a detector:
    `detector` is True, and `top` may be empty). On the wire a record names its model by an index into
    its batch's model table, which also holds the labels, so a record adds a few bytes; a record
    without these fields (an older runtime's) reads as no model.
    """

    id: str | None
    status: Literal["ok", "error"]
    latency_ms: Latency
    batch_size: int = 0
    provider: str | None = None
    placement: Placement = "edge"
    code: ErrorCode | None = None
    offloaded: bool = False
    cascaded: bool = False
    dropped: bool = False
    queue_depth: int = 0
    end: float = 0.0  # epoch seconds when the result was published
    model: ModelRef | None = None
    top: tuple[Prediction, ...] = ()
    detector: bool = False

    def to_dict(self, table: ModelTable | None = None) -> dict[str, Any]:
        """The record's JSON; its model and answer only with the batch's `table` to name them in."""
        out: dict[str, Any] = {
            "id": self.id,
            "status": self.status,
            "latency_ms": self.latency_ms.to_dict(),
            "batch_size": self.batch_size,
            "provider": self.provider,
            "placement": self.placement,
            "queue_depth": self.queue_depth,
            "end": round(self.end, 6),
        }
        if self.code is not None:
            out["code"] = self.code.value
        for flag in ("offloaded", "cascaded", "dropped"):
            if getattr(self, flag):
                out[flag] = True
        if table is not None and self.model is not None:
            out["m"] = table.add(self.model, self.provider, self.top)
            if self.top:
                out["top"] = [x for p in self.top for x in (p.index, round(float(p.score), 3))]
            if self.detector:
                out["det"] = True
        return out

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], models: Sequence[TimedModel | None] = ()) -> TimingRecord:
        """Raises what reading a wrongly shaped document raises, except for the model and answer: an
        index or pair that does not read is left out (they are statistics, never worth the record)."""
        code = doc.get("code")
        record = cls(
            id=doc.get("id"),
            status=doc.get("status", "ok"),
            latency_ms=Latency.from_dict(doc.get("latency_ms", {})),
            batch_size=int(doc.get("batch_size", 0)),
            provider=doc.get("provider"),
            placement=doc.get("placement", "edge"),
            code=ErrorCode(code) if code else None,
            offloaded=bool(doc.get("offloaded", False)),
            cascaded=bool(doc.get("cascaded", False)),
            dropped=bool(doc.get("dropped", False)),
            queue_depth=int(doc.get("queue_depth", 0)),
            end=float(doc.get("end", 0.0)),
        )
        index = doc.get("m")
        timed = models[index] if isinstance(index, int) and 0 <= index < len(models) else None
        if timed is not None:
            record.model = timed.model
            record.top = _read_top(doc.get("top"), timed.labels)
            record.detector = doc.get("det") is True
        return record


def _read_top(flat: Any, labels: Mapping[int, str]) -> tuple[Prediction, ...]:
    if not isinstance(flat, list):
        return ()
    top = []
    for index, score in zip(flat[::2], flat[1::2], strict=False):
        if isinstance(index, int) and isinstance(score, (int, float)) and not isinstance(score, bool):
            top.append(Prediction(index, labels.get(index, str(index)), float(score)))
    return tuple(top)


@dataclass(frozen=True)
class TimedModel:
    """An entry of a timing batch's model table: a model, the provider that ran it, and the labels of
    the classes its records in the batch name."""

    model: ModelRef
    provider: str | None
    labels: dict[int, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, doc: Any) -> TimedModel | None:
        if not isinstance(doc, dict) or not all(isinstance(doc.get(k), str) for k in ("name", "version")):
            return None
        raw = doc.get("labels")
        labels = {}
        for key, label in raw.items() if isinstance(raw, dict) else ():
            with contextlib.suppress(ValueError):
                labels[int(key)] = str(label)
        provider = doc.get("provider")
        return cls(
            ModelRef(doc["name"], doc["version"], str(doc.get("variant", ""))),
            provider if isinstance(provider, str) else None,
            labels,
        )


class ModelTable:
    """The model table a timing batch is written with: one entry per (model, provider), filled as the
    batch's records are written, holding the labels those records name."""

    def __init__(self) -> None:
        self._index: dict[tuple[ModelRef, str | None], int] = {}
        self.entries: list[dict[str, Any]] = []

    def add(self, model: ModelRef, provider: str | None, top: Sequence[Prediction]) -> int:
        key = (model, provider)
        index = self._index.get(key)
        if index is None:
            index = self._index[key] = len(self.entries)
            self.entries.append({**model.to_dict(), "provider": provider, "labels": {}})
        labels = self.entries[index]["labels"]
        for p in top:
            labels.setdefault(str(p.index), p.label[:_TIMED_LABEL])
        return index


def _counts(value: Any) -> dict[str, int]:
    """Named counts (capture's); what is not a count is left out, an older message has none."""
    if not isinstance(value, dict):
        return {}
    return {str(k): v for k, v in value.items() if isinstance(v, int) and not isinstance(v, bool) and v >= 0}


def _source_counts(value: Any) -> dict[str, dict[str, int]]:
    """Named counts per source name (`_counts` each); an older message has none."""
    if not isinstance(value, dict):
        return {}
    return {str(name): _counts(counts) for name, counts in value.items() if isinstance(counts, dict)}


@dataclass
class TimingBatch:
    """What the runtime publishes on `edgeinfer/local/timings`: records plus batch executions.

    `executions` lists the batch sizes the engine ran since the previous message, so the telemetry
    component can tell executions from inferences (Triton's split). The records' models travel in a
    `models` table beside them (see `TimingRecord`); a batch without one parses as before.
    """

    thing: str
    records: list[TimingRecord]
    executions: list[int] = field(default_factory=list)
    timestamp: str = ""
    capture: dict[str, int] = field(default_factory=dict)  # capture's counter increments (docs/capture.md)
    # The results outbox's counters as they stand (pending, spooled, sent, dropped; docs/iot-path.md):
    # totals, not increments; absent from a batch that does not change them.
    forward: dict[str, int] = field(default_factory=dict)
    # Per frame source (docs/sources.md): its counter increments (served, dropped, reconnects, outage_ms).
    sources: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_json(self) -> bytes:
        table = ModelTable()
        doc: dict[str, Any] = {
            "thing": self.thing,
            "records": [r.to_dict(table) for r in self.records],
            "executions": self.executions,
            "timestamp": self.timestamp,
        }
        if table.entries:
            doc["models"] = table.entries
        if self.capture:
            doc["capture"] = self.capture
        if self.forward:
            doc["forward"] = self.forward
        if self.sources:
            doc["sources"] = self.sources
        return _dumps(doc)

    @classmethod
    def parse(cls, payload: bytes | str) -> TimingBatch:
        doc = _load_object(payload)
        records = doc.get("records")
        if not isinstance(records, list):
            raise MessageError(ErrorCode.BAD_REQUEST, "'records' must be a list")
        raw_models = doc.get("models")
        # an unreadable entry keeps its place (records index the table) and reads as no model
        models = [TimedModel.from_dict(m) for m in raw_models] if isinstance(raw_models, list) else []
        try:
            return cls(
                thing=str(doc.get("thing", "")),
                records=[TimingRecord.from_dict(r, models) for r in records if isinstance(r, dict)],
                executions=[int(n) for n in doc.get("executions", []) if isinstance(n, int)],
                timestamp=str(doc.get("timestamp", "")),
                capture=_counts(doc.get("capture")),
                forward=_counts(doc.get("forward")),
                sources=_source_counts(doc.get("sources")),
            )
        except _MALFORMED as exc:
            raise _malformed("timing batch", exc) from None


# ---------------------------------------------------------------------------------- telemetry window


@dataclass
class StageQuantiles:
    p50: float = 0.0
    p90: float = 0.0
    p99: float = 0.0
    max: float = 0.0

    def to_dict(self) -> dict[str, float]:
        return {k: _round(v) for k, v in asdict(self).items()}


@dataclass
class ModelQuality:
    """What one model answered in a window (`TelemetryWindow.models`): its identity and the provider
    that ran it; `count` answers (ok, from this model), of which `low_confidence` had a top score below
    the telemetry's threshold; answers per class (a classifier's top-1, a detector's detections; the
    most frequent classes, the rest summed as "other"); and a histogram of the scores (a classifier's
    top-1, a detector's detections) over fixed `bins` edges."""

    name: str
    version: str
    variant: str = ""
    provider: str | None = None
    count: int = 0
    low_confidence: int = 0
    classes: dict[str, int] = field(default_factory=dict)
    bins: list[float] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)

    @property
    def low_confidence_share(self) -> float:
        return self.low_confidence / self.count if self.count else 0.0

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "variant": self.variant,
            "provider": self.provider,
            "count": self.count,
            "low_confidence": self.low_confidence,
            "low_confidence_share": _round(self.low_confidence_share, 4),
            "classes": dict(self.classes),
            "scores": {"bins": list(self.bins), "counts": list(self.counts)},
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ModelQuality:
        scores = doc.get("scores") or {}
        provider = doc.get("provider")
        return cls(
            name=str(doc.get("name", "")),
            version=str(doc.get("version", "")),
            variant=str(doc.get("variant", "")),
            provider=str(provider) if provider is not None else None,
            count=int(doc.get("count", 0)),
            low_confidence=int(doc.get("low_confidence", 0)),
            classes={str(k): int(v) for k, v in (doc.get("classes") or {}).items()},
            bins=[float(b) for b in scores.get("bins", [])],
            counts=[int(n) for n in scores.get("counts", [])],
        )


@dataclass
class TelemetryWindow:
    thing: str
    seq: int
    window_s: float
    count: int
    errors: dict[str, int]
    dropped: int
    offloaded: int
    throughput_rps: float
    latency_ms: dict[str, StageQuantiles]
    batch: dict[str, float]
    queue_depth: dict[str, float]
    provider: str | None
    system: dict[str, Any]
    timestamp: str
    cascaded: int = 0
    models: list[ModelQuality] = field(default_factory=list)  # empty: an older window, or no answers
    capture: dict[str, int] = field(default_factory=dict)  # capture's counters in the window (none: off)
    sources: dict[str, dict[str, int]] = field(default_factory=dict)  # per frame source, in the window

    def to_dict(self) -> dict[str, Any]:
        out = {
            "thing": self.thing,
            "seq": self.seq,
            "window_s": self.window_s,
            "count": self.count,
            "errors": dict(self.errors),
            "dropped": self.dropped,
            "offloaded": self.offloaded,
            "cascaded": self.cascaded,
            "throughput_rps": _round(self.throughput_rps),
            "latency_ms": {stage: q.to_dict() for stage, q in self.latency_ms.items()},
            "batch": dict(self.batch),
            "queue_depth": dict(self.queue_depth),
            "provider": self.provider,
            "system": dict(self.system),
            "timestamp": self.timestamp,
        }
        if self.models:
            out["models"] = [m.to_dict() for m in self.models]
        if self.capture:
            out["capture"] = dict(self.capture)
        if self.sources:
            out["sources"] = {name: dict(counts) for name, counts in self.sources.items()}
        return out

    def to_json(self) -> bytes:
        return _dumps(self.to_dict())

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> TelemetryWindow:
        """Raises `MessageError` when the document is not a telemetry window."""
        try:
            return cls(
                thing=doc["thing"],
                seq=int(doc["seq"]),
                window_s=float(doc["window_s"]),
                count=int(doc["count"]),
                errors={str(k): int(v) for k, v in doc.get("errors", {}).items()},
                dropped=int(doc.get("dropped", 0)),
                offloaded=int(doc.get("offloaded", 0)),
                cascaded=int(doc.get("cascaded", 0)),
                throughput_rps=float(doc.get("throughput_rps", 0.0)),
                latency_ms={s: StageQuantiles(**q) for s, q in doc.get("latency_ms", {}).items()},
                batch=dict(doc.get("batch", {})),
                queue_depth=dict(doc.get("queue_depth", {})),
                provider=doc.get("provider"),
                system=dict(doc.get("system", {})),
                timestamp=str(doc.get("timestamp", "")),
                # what another writer left out of an entry reads as empty (older readers take the document)
                models=[ModelQuality.from_dict(m) for m in doc.get("models") or [] if isinstance(m, dict)],
                capture=_counts(doc.get("capture")),
                sources=_source_counts(doc.get("sources")),
            )
        except _MALFORMED as exc:
            raise _malformed("telemetry window", exc) from None
