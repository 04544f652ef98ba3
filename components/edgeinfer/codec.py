"""JSON and base64 at native speed, with the standard library's results and errors.

An image request is base64 inside JSON, and on Greengrass IPC that JSON travels as a binary message:
base64 again, inside the SDK's JSON. For a 640×480 JPEG the standard library's codecs cost about 2 ms
of CPU per IPC hop on a small edge core; orjson and pybase64 (SIMD) do the same work in ~0.1 ms.

Each function returns what its standard-library namesake returns. The fast libraries take the common
case; whatever they refuse (invalid input, NaN/Infinity literals, lone surrogates, UTF-16 bytes, the
foreign characters a lenient base64 decode skips) goes to the standard library, so errors and edge cases
stay the stdlib's own. Two differences remain, both outside JSON's interoperable range (RFC 8259 §6):
`loads` reads an integer beyond 64 bits as a float, and `dumps` writes NaN and ±Infinity as `null`.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

import orjson
import pybase64

__all__ = ["b64decode", "b64encode", "dumpb", "dumps", "loads"]


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """`json.loads` (an integer beyond 64 bits comes back as a float, see above)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(bytes(data) if isinstance(data, memoryview) else data)


def dumps(obj: Any) -> str:
    """`json.dumps(obj)` with compact separators (NaN and ±Infinity become `null`, see above)."""
    try:
        return orjson.dumps(obj).decode()
    except TypeError:  # non-str keys, big ints, unknown types: the stdlib's behaviour and errors
        return json.dumps(obj, separators=(",", ":"))


def dumpb(obj: Any) -> bytes:
    """`json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()`: compact UTF-8 bytes
    (NaN and ±Infinity become `null`, see above)."""
    try:
        return orjson.dumps(obj)
    except TypeError:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def b64encode(data: bytes | bytearray | memoryview) -> bytes:
    """`base64.b64encode`."""
    return pybase64.b64encode(data)


def b64decode(data: str | bytes | bytearray | memoryview, validate: bool = False) -> bytes:
    """`base64.b64decode`: strict input takes the SIMD path; anything else gets the stdlib's answer
    (lenient decoding that skips foreign characters, or its `binascii.Error`)."""
    try:
        return pybase64.b64decode(data, validate=True)
    except (binascii.Error, ValueError, TypeError):
        return base64.b64decode(data, validate=validate)
