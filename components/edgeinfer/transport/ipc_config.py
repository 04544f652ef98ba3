"""GetConfiguration over Greengrass IPC with the standard library alone.

The installer's Install step runs on the device's system Python, before any venv (and so before
awsiotsdk) exists; it still reads its configuration from the nucleus rather than from
`{configuration:/…}` interpolated onto its command line (nucleus lite escapes that JSON's quotes and
stringifies every scalar). Both nuclei give every lifecycle step of a component its IPC socket
(`AWS_GG_NUCLEUS_DOMAIN_SOCKET_FILEPATH_FOR_COMPONENT`) and token (`SVCUID`).

One connection, one operation: the event-stream framing (`[total u32][headers u32][prelude crc]
[headers][payload][crc]`, big-endian, CRC32), the connect message with `:version` 0.1.0 and
`{"authToken": SVCUID}`, then `aws.greengrass#GetConfiguration` on stream 1. What awsiotsdk does for
the other components (`edgeinfer.transport.ipc`).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import zlib
from collections.abc import Sequence
from typing import Any

from edgeinfer.transport.base import TransportError, UnauthorizedError

__all__ = ["SOCKET_ENV", "TOKEN_ENV", "available", "get_configuration"]

SOCKET_ENV = "AWS_GG_NUCLEUS_DOMAIN_SOCKET_FILEPATH_FOR_COMPONENT"
TOKEN_ENV = "SVCUID"

_APPLICATION_MESSAGE, _APPLICATION_ERROR, _CONNECT, _CONNECT_ACK = 0, 1, 4, 5
_PING, _PING_RESPONSE = 2, 3
_ACCEPTED, _TERMINATE = 1, 2
_INT32, _STRING = 4, 7
_MAX_FRAME = 16 * 1024 * 1024 + 128 * 1024


def available() -> bool:
    """Does the environment name a nucleus to ask (a lifecycle step of a Greengrass component)?"""
    return bool(os.environ.get(SOCKET_ENV) and os.environ.get(TOKEN_ENV))


def get_configuration(
    key_path: Sequence[str] = (),
    component: str | None = None,
    *,
    socket_path: str | None = None,
    token: str | None = None,
    timeout: float = 10.0,
) -> Any:
    """The value at `key_path` of the component's configuration (its whole `configuration` map for
    `()`); TransportError when the nucleus cannot be asked or refuses."""
    socket_path = socket_path or os.environ.get(SOCKET_ENV)
    token = token or os.environ.get(TOKEN_ENV)
    if not socket_path or not token:
        raise TransportError(f"not running under Greengrass: {SOCKET_ENV} and {TOKEN_ENV} must be set")
    what = f"GetConfiguration {'/'.join(key_path) or '/'}"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(socket_path)
            conn = _Connection(sock)
            conn.send(
                {":message-type": _CONNECT, ":message-flags": 0, ":stream-id": 0, ":version": "0.1.0"},
                json.dumps({"authToken": token}).encode(),
            )
            headers, _ = conn.receive(0)
            if (
                headers.get(":message-type") != _CONNECT_ACK
                or not int(headers.get(":message-flags", 0)) & _ACCEPTED
            ):
                raise UnauthorizedError(f"Greengrass IPC refused the connection at {socket_path}: bad token")
            # A leaf is asked of its parent, as ipc.GreengrassIpcBus does: the answer is the map holding it.
            request: dict[str, Any] = {"keyPath": list(key_path[:-1])}
            if component:
                request["componentName"] = component
            conn.send(
                {
                    ":message-type": _APPLICATION_MESSAGE,
                    ":message-flags": 0,
                    ":stream-id": 1,
                    "operation": "aws.greengrass#GetConfiguration",
                    "service-model-type": "aws.greengrass#GetConfigurationRequest",
                    ":content-type": "application/json",
                },
                json.dumps(request).encode(),
            )
            headers, payload = conn.receive(1)
    except OSError as exc:
        raise TransportError(f"{what}: cannot reach the nucleus at {socket_path}: {exc}") from exc
    body = _json(payload, what)
    if headers.get(":message-type") == _APPLICATION_ERROR:
        model = str(headers.get("service-model-type") or "an error")
        message = body.get("message") if isinstance(body, dict) else None
        error = UnauthorizedError if model.endswith("#UnauthorizedError") else TransportError
        raise error(f"{what}: {model.rsplit('#', 1)[-1]}: {message or 'no message'}")
    value = body.get("value") if isinstance(body, dict) else None
    if value is None:
        value = {}
    if not key_path:
        return value
    if not isinstance(value, dict) or key_path[-1] not in value:
        raise TransportError(f"configuration key {'/'.join(key_path)} not found")
    return value[key_path[-1]]


def _json(payload: bytes, what: str) -> Any:
    try:
        return json.loads(payload.decode() or "{}")
    except ValueError as exc:
        raise TransportError(f"{what}: the nucleus answered something that is not JSON") from exc


class _Connection:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def send(self, headers: dict[str, Any], payload: bytes = b"") -> None:
        self.sock.sendall(encode(headers, payload))

    def receive(self, stream_id: int) -> tuple[dict[str, Any], bytes]:
        """The next frame of `stream_id` (pings are answered, other streams' frames skipped)."""
        while True:
            headers, payload = self._frame()
            kind = headers.get(":message-type")
            if kind == _PING:
                self.send({":message-type": _PING_RESPONSE, ":message-flags": 0, ":stream-id": 0}, payload)
                continue
            if headers.get(":stream-id", 0) == stream_id:
                return headers, payload
            if kind not in (_APPLICATION_MESSAGE, _APPLICATION_ERROR, _PING_RESPONSE):
                raise TransportError(f"Greengrass IPC protocol error: {payload[:200]!r}")

    def _frame(self) -> tuple[dict[str, Any], bytes]:
        prelude = self._read(12)
        total, headers_len, crc = struct.unpack(">III", prelude)
        if zlib.crc32(prelude[:8]) != crc or not 16 <= total <= _MAX_FRAME or headers_len > total - 16:
            raise TransportError("Greengrass IPC: a malformed frame")
        rest = self._read(total - 12)
        if zlib.crc32(rest[:-4], zlib.crc32(prelude)) != struct.unpack(">I", rest[-4:])[0]:
            raise TransportError("Greengrass IPC: a frame with a bad checksum")
        return decode_headers(rest[:headers_len]), rest[headers_len:-4]

    def _read(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise TransportError("Greengrass IPC: the nucleus closed the connection")
            self.buffer += chunk
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out


def encode(headers: dict[str, Any], payload: bytes = b"") -> bytes:
    """One event-stream frame (int headers as int32, the rest as strings)."""
    raw = b""
    for name, value in headers.items():
        key = name.encode()
        raw += bytes([len(key)]) + key
        if isinstance(value, int) and not isinstance(value, bool):
            raw += bytes([_INT32]) + struct.pack(">i", value)
        else:
            text = str(value).encode()
            raw += bytes([_STRING]) + struct.pack(">H", len(text)) + text
    prelude = struct.pack(">II", 12 + len(raw) + len(payload) + 4, len(raw))
    head = prelude + struct.pack(">I", zlib.crc32(prelude)) + raw
    return head + payload + struct.pack(">I", zlib.crc32(payload, zlib.crc32(head)))


def decode_headers(raw: bytes) -> dict[str, Any]:
    headers: dict[str, Any] = {}
    i = 0
    try:
        while i < len(raw):
            name = raw[i + 1 : i + 1 + raw[i]].decode()
            i += 1 + raw[i]
            kind = raw[i]
            i += 1
            value: Any
            if kind in (0, 1):
                value = kind == 0
            elif kind in (2, 3, 4, 5, 8):
                fmt = {2: ">b", 3: ">h", 4: ">i", 5: ">q", 8: ">q"}[kind]
                value = struct.unpack_from(fmt, raw, i)[0]
                i += struct.calcsize(fmt)
            elif kind in (6, 7):
                (length,) = struct.unpack_from(">H", raw, i)
                data = raw[i + 2 : i + 2 + length]
                value = data.decode() if kind == 7 else bytes(data)
                i += 2 + length
            elif kind == 9:
                value = raw[i : i + 16].hex()
                i += 16
            else:
                raise TransportError(f"Greengrass IPC: unknown header type {kind}")
            headers[name] = value
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise TransportError(f"Greengrass IPC: malformed headers ({exc})") from exc
    return headers
