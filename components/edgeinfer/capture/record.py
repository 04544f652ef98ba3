"""One capture record: the input image (JPEG) and a JSON document with the result, the request's
metadata and the model's identity, named by an id that orders records by age and makes their keys.

`<prefix>/<thing>/<model>/<version>/<yyyy>/<mm>/<dd>/<id>.{jpg,json}`: a user lists a thing's, a
model's, a version's or a day's records by prefix. The id is fixed when the record is made, so a
retried upload writes the same key again, never a second object.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

from edgeinfer.messages import Request, Result

__all__ = ["JPEG_MAGIC", "Record", "make_id", "object_key", "to_jpeg"]

JPEG_MAGIC = b"\xff\xd8\xff"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _safe(text: str, limit: int = 64) -> str:
    return _UNSAFE.sub("_", text)[:limit] or "_"


def make_id(wall: float, request_id: str) -> str:
    """`<epoch ms, 13 digits>-<request id, made safe>-<random>`: sorts by age, unique per record."""
    return f"{int(wall * 1000):013d}-{_safe(request_id, 40)}-{secrets.token_hex(4)}"


def object_key(prefix: str, thing: str, *, model: str, version: str, wall: float, record_id: str) -> str:
    """The key without its extension."""
    day = dt.datetime.fromtimestamp(wall, dt.timezone.utc)
    parts = [prefix.strip("/")] if prefix.strip("/") else []
    parts += [
        _safe(thing, 128),
        _safe(model),
        _safe(version),
        f"{day:%Y}",
        f"{day:%m}",
        f"{day:%d}",
        record_id,
    ]
    return "/".join(parts)


def to_jpeg(image: bytes, max_side: int, quality: int) -> bytes:
    """The image as sent when it is a JPEG within `max_side` (0: any size); else decoded, resized
    so its longer side is `max_side`, and encoded at `quality`. Raises ValueError on a bad image."""
    if image.startswith(JPEG_MAGIC) and max_side == 0:
        return image
    import cv2
    import numpy as np

    img = cv2.imdecode(np.frombuffer(image, np.uint8), cv2.IMREAD_COLOR)
    if img is None:
        raise ValueError("the image does not decode")
    h, w = img.shape[:2]
    if max_side and max(h, w) > max_side:
        scale = max_side / max(h, w)
        img = cv2.resize(
            img, (max(1, round(w * scale)), max(1, round(h * scale))), interpolation=cv2.INTER_AREA
        )
    elif image.startswith(JPEG_MAGIC):
        return image
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise ValueError("the image does not encode as JPEG")
    return bytes(buf)


@dataclass
class Record:
    id: str
    key: str  # without the extension
    image: bytes
    doc: dict[str, Any]

    def document(self) -> bytes:
        return json.dumps(self.doc, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def make(
        cls,
        *,
        prefix: str,
        thing: str,
        request: Request,
        computed: Result,
        answered: Result,
        reason: str,
        wall: float,
        image: bytes,
        source: str | None = None,
    ) -> Record:
        model = computed.model or answered.model
        name, version = (model.name, model.version) if model is not None else ("unknown", "unknown")
        record_id = make_id(wall, request.id)
        doc: dict[str, Any] = {
            "id": record_id,
            "thing": thing,
            "captured_at": dt.datetime.fromtimestamp(wall, dt.timezone.utc)
            .isoformat()
            .replace("+00:00", "Z"),
            "reason": reason,
            "model": model.to_dict() if model is not None else None,
            "provider": computed.provider,
            "request": _request_meta(request, source),
            "result": computed.to_dict(),
        }
        if answered.status != computed.status:
            doc["answered"] = answered.to_dict()  # what went out instead (late, too large)
        key = object_key(prefix, thing, model=name, version=version, wall=wall, record_id=record_id)
        return cls(record_id, key, image, doc)


def _request_meta(request: Request, source: str | None) -> dict[str, Any]:
    meta = request.to_dict()
    meta.pop("image", None)  # the image is the record's .jpg
    if source is not None:
        meta["source"] = source
    return meta
