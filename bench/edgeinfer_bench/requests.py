"""Requests for load generators: each image encoded once by the message contract, each send fills its id in.

Encoding a 100 KB image request (base64 and JSON) costs the generator more than a send; a template per
image with an id slot keeps that cost out of the measured path, and `edgeinfer.messages.Request` keeps
the payload what a real client sends. A `Template` adds a `sent_at` slot to the same encoding, for
loads whose requests carry when they were sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgeinfer.errors import EdgeinferError
from edgeinfer.messages import Request, iso_utc

__all__ = ["ID_SLOT", "SENT_AT_SLOT", "Template", "request_templates", "timed_templates", "with_id"]

ID_SLOT = "__ID__"
SENT_AT_SLOT = iso_utc(0.0)  # how the encoder writes `sent_at` 0.0; replaced per send


def request_templates(images: list[bytes], **fields: Any) -> list[bytes]:
    """One encoded request per image, `fields` (Request's: top_k, deadline_ms, …) set, its id `ID_SLOT`."""
    return [Request(ID_SLOT, image=image, **fields).to_json() for image in images]


def with_id(template: bytes, request_id: str) -> bytes:
    """The template as the request `request_id` (the id is the first key the encoder writes)."""
    return template.replace(ID_SLOT.encode(), request_id.encode(), 1)


@dataclass(frozen=True)
class Template:
    """A request's encoded JSON cut around its id and its `sent_at`: one join per send."""

    head: bytes
    middle: bytes
    tail: bytes

    @classmethod
    def from_request(cls, encoded: bytes) -> Template:
        """Cut a request_templates entry encoded with `sent_at` 0.0."""
        head, sep, rest = encoded.partition(ID_SLOT.encode())
        middle, sep2, tail = rest.partition(SENT_AT_SLOT.encode())
        if not sep or not sep2:
            raise EdgeinferError("request template: no id or sent_at slot in the encoded request")
        return cls(head, middle, tail)

    def body(self, request_id: str, sent_at: float) -> bytes:
        """The request `request_id`, sent at `sent_at` (epoch seconds)."""
        return b"".join((self.head, request_id.encode(), self.middle, iso_utc(sent_at).encode(), self.tail))


def timed_templates(images: list[bytes], **fields: Any) -> list[Template]:
    """request_templates with a `sent_at` slot as well, filled in at each send."""
    return [Template.from_request(e) for e in request_templates(images, sent_at=0.0, **fields)]
