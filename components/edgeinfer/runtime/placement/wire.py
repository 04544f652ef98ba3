"""What an offload carries through IoT Core: the image re-encoded at the size the cloud model uses.

A request's image may be far larger than the model looks at (1080p for a 224-pixel network) and, in
base64 JSON, larger than IoT Core's 128 KB. The offload sends a JPEG whose shorter side is the
model's common input size (the size the runtime decodes to before its centre crop, so the cloud's
preprocessing sees the same pixels), decoded at 1/2, 1/4 or 1/8 scale straight from the DCT where
the source allows: a 1080p JPEG becomes ~15-30 KB, smaller to send and faster to decode there.
"""

from __future__ import annotations

import cv2
import numpy as np

from edgeinfer.runtime.decode import DecodeError, read_header

__all__ = ["needs_reencode", "reencode"]

_SLACK = 1.25  # an image at most this much larger than needed is sent as it is: re-encoding costs more


def needs_reencode(data: bytes, side: int) -> bool:
    """Is `data` larger than the cloud needs (or not a JPEG)? From the header alone; an unreadable
    image is sent as it is, for the cloud to answer BAD_IMAGE as the edge would."""
    if side <= 0:
        return False
    try:
        header = read_header(data)
    except DecodeError:
        return False
    return header.format != "jpeg" or min(header.width, header.height) > side * _SLACK


def reencode(data: bytes, side: int, *, keep: int = 0, quality: int = 90) -> tuple[bytes, float]:
    """`data` as a JPEG with its shorter side at `side` (never enlarged), and the factor from the
    sent image's pixels to the original's (1.0 when `data` is returned as it was).

    `keep`: the pixels the network really looks at (its crop, e.g. 224 of 256): a JPEG is decoded at
    reduced scale from the DCT while its shorter side keeps at least that many, and not resized up
    again (a 640×480 photo: 320×240 in about a third of a full decode and resize)."""
    keep = min(keep or side, side)
    try:
        header = read_header(data)
    except DecodeError:
        return data, 1.0
    shorter = min(header.width, header.height)
    flag = cv2.IMREAD_COLOR
    if header.format == "jpeg":
        for factor, reduced in (
            (8, cv2.IMREAD_REDUCED_COLOR_8),
            (4, cv2.IMREAD_REDUCED_COLOR_4),
            (2, cv2.IMREAD_REDUCED_COLOR_2),
        ):
            if shorter >= factor * keep:
                flag = reduced
                break
    try:
        img = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), flag)
    except cv2.error:
        img = None
    if img is None or img.ndim != 3:
        return data, 1.0
    h, w = img.shape[:2]
    if min(h, w) > side:
        scale = side / min(h, w)
        # Area averaging only where linear would alias (over 2x): at a fractional ratio it costs 7x.
        interp = cv2.INTER_AREA if scale < 0.5 else cv2.INTER_LINEAR
        img = cv2.resize(img, (max(1, round(w * scale)), max(1, round(h * scale))), interpolation=interp)
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
    if not ok or (header.format == "jpeg" and len(buf) >= len(data)):
        return data, 1.0
    return bytes(buf), header.width / img.shape[1]
