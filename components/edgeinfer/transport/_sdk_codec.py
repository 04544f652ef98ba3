"""Point the awsiotsdk's message codec at `edgeinfer.codec`.

The SDK's IPC model serialises every operation with the standard library: `json` in
`awsiot.eventstreamrpc`, `base64` for binary payloads in `awsiot.greengrasscoreipc.model`. A 90 KB image
request costs about 2 ms of CPU per IPC hop there, more than the rest of the transport together. The
SDK names both modules as module globals, so swapping those two names — for the SDK's modules only,
never the interpreter's — moves its codec onto orjson/pybase64 with the standard library's results
(see `edgeinfer.codec`). Idempotent; `uninstall` puts the standard library back (tests compare both).
"""

from __future__ import annotations

import base64
import json
from types import SimpleNamespace
from typing import Any

from edgeinfer import codec

_JSON = SimpleNamespace(loads=codec.loads, dumps=codec.dumps)
_BASE64 = SimpleNamespace(b64encode=codec.b64encode, b64decode=codec.b64decode)


def _modules() -> tuple[Any, Any]:
    import awsiot.eventstreamrpc as rpc
    from awsiot.greengrasscoreipc import model

    return rpc, model


def install() -> None:
    """Route the SDK's JSON and base64 through `edgeinfer.codec` (safe to call any number of times)."""
    rpc, model = _modules()
    rpc.json = _JSON
    model.base64 = _BASE64


def uninstall() -> None:
    rpc, model = _modules()
    rpc.json = json
    model.base64 = base64


def installed() -> bool:
    rpc, model = _modules()
    return rpc.json is _JSON and model.base64 is _BASE64
