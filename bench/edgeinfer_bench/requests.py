"""Requests for load generators: each image encoded once by the message contract, each send fills its id in.

Encoding a 100 KB image request (base64 and JSON) costs the generator more than a send; a template per
image with an id slot keeps that cost out of the measured path, and `edgeinfer.messages.Request` keeps
the payload what a real client sends.
"""

from __future__ import annotations

from typing import Any

from edgeinfer.messages import Request

__all__ = ["ID_SLOT", "request_templates", "with_id"]

ID_SLOT = "__ID__"


def request_templates(images: list[bytes], **fields: Any) -> list[bytes]:
    """One encoded request per image, `fields` (Request's: top_k, deadline_ms, …) set, its id `ID_SLOT`."""
    return [Request(ID_SLOT, image=image, **fields).to_json() for image in images]


def with_id(template: bytes, request_id: str) -> bytes:
    """The template as the request `request_id` (the id is the first key the encoder writes)."""
    return template.replace(ID_SLOT.encode(), request_id.encode(), 1)
