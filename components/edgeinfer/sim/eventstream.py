"""The AWS event-stream binary framing and the RPC message constants Greengrass IPC uses.

Frame: `[total_len u32][headers_len u32][prelude_crc u32][headers][payload][message_crc u32]`, big-endian,
CRC32 of the 8-byte prelude and of everything before the final CRC.
"""

from __future__ import annotations

import functools
import struct
import uuid
import zlib
from dataclasses import dataclass, field
from typing import Any

# RPC message types (`:message-type`) and flags (`:message-flags`).
APPLICATION_MESSAGE = 0
APPLICATION_ERROR = 1
PING = 2
PING_RESPONSE = 3
CONNECT = 4
CONNECT_ACK = 5
PROTOCOL_ERROR = 6
INTERNAL_ERROR = 7
FLAG_CONNECTION_ACCEPTED = 1
FLAG_TERMINATE_STREAM = 2

PRELUDE_LEN = 12
MAX_FRAME = 16 * 1024 * 1024 + 128 * 1024

_INT32 = 4
_STRING = 7


class FrameError(ValueError):
    """A frame that is not valid event-stream (bad CRC, truncated header, oversize)."""


@dataclass
class Frame:
    headers: dict[str, Any] = field(default_factory=dict)
    payload: bytes = b""

    @property
    def message_type(self) -> int:
        return int(self.headers.get(":message-type", -1))

    @property
    def flags(self) -> int:
        return int(self.headers.get(":message-flags", 0))

    @property
    def stream_id(self) -> int:
        return int(self.headers.get(":stream-id", 0))


def _encode_header(name: str, value: Any) -> bytes:
    return _encode_typed(name, type(value).__name__, value)


@functools.lru_cache(maxsize=8192)
def _encode_typed(name: str, _kind: str, value: Any) -> bytes:
    raw_name = name.encode()
    out = bytes([len(raw_name)]) + raw_name
    if name in (":message-type", ":message-flags", ":stream-id") or (
        isinstance(value, int) and not isinstance(value, bool)
    ):
        return out + bytes([_INT32]) + struct.pack(">i", int(value))
    if isinstance(value, bool):
        return out + bytes([0 if value else 1])
    if isinstance(value, bytes):
        return out + bytes([6]) + struct.pack(">H", len(value)) + value
    if isinstance(value, uuid.UUID):
        return out + bytes([9]) + value.bytes
    raw = str(value).encode()
    return out + bytes([_STRING]) + struct.pack(">H", len(raw)) + raw


def encode(headers: dict[str, Any], payload: bytes = b"") -> bytes:
    raw_headers = b"".join(_encode_header(k, v) for k, v in headers.items())
    total = PRELUDE_LEN + len(raw_headers) + len(payload) + 4
    prelude = struct.pack(">II", total, len(raw_headers))
    head = prelude + struct.pack(">I", zlib.crc32(prelude)) + raw_headers
    # One copy of the payload (an image request is ~120 KB), the CRC chained over both parts.
    return b"".join((head, payload, struct.pack(">I", zlib.crc32(payload, zlib.crc32(head)))))


def _decode_headers(raw: bytes) -> dict[str, Any]:
    headers: dict[str, Any] = {}
    i = 0
    n = len(raw)
    try:
        while i < n:
            name_len = raw[i]
            name = raw[i + 1 : i + 1 + name_len].decode()
            i += 1 + name_len
            kind = raw[i]
            i += 1
            value: Any
            if kind in (0, 1):
                value = kind == 0
            elif kind == 2:
                value = struct.unpack_from(">b", raw, i)[0]
                i += 1
            elif kind == 3:
                value = struct.unpack_from(">h", raw, i)[0]
                i += 2
            elif kind == 4:
                value = struct.unpack_from(">i", raw, i)[0]
                i += 4
            elif kind in (5, 8):
                value = struct.unpack_from(">q", raw, i)[0]
                i += 8
            elif kind in (6, 7):
                length = struct.unpack_from(">H", raw, i)[0]
                data = raw[i + 2 : i + 2 + length]
                value = data.decode() if kind == 7 else bytes(data)
                i += 2 + length
            elif kind == 9:
                value = uuid.UUID(bytes=bytes(raw[i : i + 16]))
                i += 16
            else:
                raise FrameError(f"unknown header type {kind} for {name!r}")
            headers[name] = value
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise FrameError(f"truncated or malformed headers: {exc}") from exc
    return headers


class FrameTooLargeError(FrameError):
    """A frame longer than the receiver takes (nucleus lite's 10,000-byte IPC messages)."""


class Decoder:
    """Incremental decoder: feed bytes, get whole frames (FrameTooLargeError past `max_frame`)."""

    def __init__(self, max_frame: int | None = None) -> None:
        self._buf = bytearray()
        self.max_frame = max_frame

    def feed(self, data: bytes) -> list[Frame]:
        self._buf += data
        frames: list[Frame] = []
        buf = self._buf
        while len(buf) >= PRELUDE_LEN:
            total, headers_len, prelude_crc = struct.unpack_from(">III", buf, 0)
            if zlib.crc32(bytes(buf[:8])) != prelude_crc:
                raise FrameError("prelude CRC mismatch")
            if total > MAX_FRAME or total < PRELUDE_LEN + 4 or headers_len > total - PRELUDE_LEN - 4:
                raise FrameError(f"bad frame length {total}")
            if len(buf) < total:
                break
            if self.max_frame is not None and total > self.max_frame:
                head = _decode_headers(bytes(buf[PRELUDE_LEN : PRELUDE_LEN + headers_len]))
                what = head.get("operation") or head.get("service-model-type") or "message"
                raise FrameTooLargeError(f"a {total}-byte {what}, over the {self.max_frame} bytes taken")
            (message_crc,) = struct.unpack_from(">I", buf, total - 4)
            with memoryview(buf) as view:  # one copy of the payload; released before `buf` shrinks
                if zlib.crc32(view[: total - 4]) != message_crc:
                    raise FrameError("message CRC mismatch")
                raw_headers = view[PRELUDE_LEN : PRELUDE_LEN + headers_len].tobytes()
                payload = view[PRELUDE_LEN + headers_len : total - 4].tobytes()
            headers = _decode_headers(raw_headers)
            del buf[:total]
            frames.append(Frame(headers, payload))
        return frames
