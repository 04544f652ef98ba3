"""Image decoding to the common batch size, with every bad image turned into `DecodeError` (BAD_IMAGE).

- The header's dimensions are read *before* decoding (JPEG SOF, PNG IHDR, BMP, WebP), so a
  20000×20000 bomb or a 1×1 image is refused without allocating anything.
- A JPEG much larger than the model input is decoded at 1/2 or 1/4 resolution straight from the DCT
  (`IMREAD_REDUCED_COLOR_2/4`), about half the decode time of a 640×480 photo.
- Truncated files are refused even where libjpeg would only warn and hand back a grey-padded image.
- The output is RGB uint8 `[size, size, 3]`: shorter side resized to `size` (linear, or area when
  shrinking), centre crop — so images of any shape batch together and the graph's own crop is cheap.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

__all__ = [
    "DecodeError",
    "ImageHeader",
    "Letterbox",
    "decode_image",
    "decode_letterboxed",
    "decode_source",
    "letterbox",
    "read_header",
    "warm_up_decoder",
]


class DecodeError(Exception):
    """The bytes are not an image this runtime serves. The message says why (one line)."""


@dataclass(frozen=True)
class ImageHeader:
    format: str
    width: int
    height: int


_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def _jpeg_header(data: bytes) -> ImageHeader:
    i = 2
    n = len(data)
    while i < n:
        if data[i] != 0xFF:
            raise DecodeError("corrupt JPEG: bad marker")
        while i < n and data[i] == 0xFF:  # fill bytes
            i += 1
        if i >= n:
            break
        marker = data[i]
        i += 1
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            continue
        if marker in (0xD9, 0xDA):
            break  # end of image or start of scan before any frame header
        if i + 2 > n:
            break
        (length,) = struct.unpack(">H", data[i : i + 2])
        if length < 2:
            raise DecodeError("corrupt JPEG: bad segment length")
        if marker in _SOF:
            if i + 7 > n:
                break
            height, width = struct.unpack(">HH", data[i + 3 : i + 7])
            return ImageHeader("jpeg", width, height)
        i += length
    raise DecodeError("truncated or corrupt JPEG: no frame header")


def read_header(data: bytes) -> ImageHeader:
    """Format and dimensions from the first bytes, without decoding. Raises DecodeError."""
    if data[:3] == b"\xff\xd8\xff":
        return _jpeg_header(data)
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        if len(data) < 24 or data[12:16] != b"IHDR":
            raise DecodeError("truncated or corrupt PNG: no IHDR")
        width, height = struct.unpack(">II", data[16:24])
        return ImageHeader("png", width, height)
    if data[:2] == b"BM":
        if len(data) < 26:
            raise DecodeError("truncated BMP header")
        width, height = struct.unpack("<ii", data[18:26])
        return ImageHeader("bmp", abs(width), abs(height))
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        chunk = data[12:16]
        if chunk == b"VP8 " and len(data) >= 30:
            width, height = struct.unpack("<HH", data[26:30])
            return ImageHeader("webp", width & 0x3FFF, height & 0x3FFF)
        if chunk == b"VP8L" and len(data) >= 25:
            bits = int.from_bytes(data[21:25], "little")
            return ImageHeader("webp", (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
        if chunk == b"VP8X" and len(data) >= 30:
            width = int.from_bytes(data[24:27], "little") + 1
            height = int.from_bytes(data[27:30], "little") + 1
            return ImageHeader("webp", width, height)
        raise DecodeError("truncated or corrupt WebP header")
    raise DecodeError("not a supported image (JPEG, PNG, BMP or WebP)")


def _complete(data: bytes, fmt: str) -> bool:
    tail = data.rstrip(b"\x00\r\n ")
    if fmt == "jpeg":
        return tail.endswith(b"\xff\xd9")
    if fmt == "png":
        return b"IEND" in data[-32:]
    return True


@dataclass(frozen=True)
class Letterbox:
    """How a detector's input was made from the source image: canvas = source · scale + offset, (x, y);
    `limit` is the source image's (width, height), to which boxes are clipped."""

    scale: tuple[float, float]
    offset: tuple[float, float]
    limit: tuple[float, float]


def decode_image(
    data: bytes,
    size: int,
    *,
    max_pixels: int = 40_000_000,
    min_side: int = 8,
    detail: int | None = None,
) -> np.ndarray:
    """Encoded image → RGB uint8 `[size, size, 3]` (shorter side to `size`, centre crop).

    `detail`: the pixels the network really looks at (its own input size, e.g. 224, when `size` is
    the larger common size the graph crops from). A JPEG is decoded at 1/2 or 1/4 scale from the DCT
    while its shorter side keeps at least that many pixels; default `size`.
    """
    img, _ = _decode_bgr(data, size, max_pixels=max_pixels, min_side=min_side, detail=detail)
    return to_model_input(img, size, bgr=True)


def decode_letterboxed(
    data: bytes,
    size: int,
    *,
    max_pixels: int = 40_000_000,
    min_side: int = 8,
    detail: int | None = None,
) -> tuple[np.ndarray, Letterbox]:
    """Encoded image → RGB uint8 `[size, size, 3]` letterboxed (the whole image scaled to fit, centred
    on grey 127), for detectors: images of any shape batch together and the graph's own letterbox is
    then a no-op. The Letterbox maps boxes back to the source image's pixels."""
    img, header = _decode_bgr(data, size, max_pixels=max_pixels, min_side=min_side, detail=detail)
    return letterbox(img, size, bgr=True, source=(header.width, header.height))


def decode_source(data: bytes, *, max_pixels: int = 40_000_000, min_side: int = 8) -> np.ndarray:
    """Encoded image → BGR uint8 at its full size (a pipeline crops its detections from it: a reduced
    decode would blur the small ones), refused as `decode_image` refuses."""
    img, _ = _decode_bgr(data, 0, max_pixels=max_pixels, min_side=min_side, detail=max_pixels)
    return img


def letterbox(
    img: np.ndarray,
    size: int,
    *,
    bgr: bool = True,
    source: tuple[int, int] | None = None,
    pad_value: int = 127,
) -> tuple[np.ndarray, Letterbox]:
    """An HxWx3 uint8 frame → RGB `[size, size, 3]` letterboxed; `source`: the (width, height) the
    frame stands for when it was decoded reduced."""
    h, w = img.shape[:2]
    scale = min(size / h, size / w)
    nw, nh = max(1, min(size, int(w * scale + 0.5))), max(1, min(size, int(h * scale + 0.5)))
    if (nw, nh) != (w, h):
        img = cv2.resize(img, (nw, nh), interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR)
    top, left = (size - nh) // 2, (size - nw) // 2
    canvas = np.full((size, size, 3), pad_value, dtype=np.uint8)
    canvas[top : top + nh, left : left + nw] = cv2.cvtColor(img, cv2.COLOR_BGR2RGB) if bgr else img
    sw, sh = source or (w, h)
    return canvas, Letterbox((nw / sw, nh / sh), (float(left), float(top)), (float(sw), float(sh)))


def refit(job: Any, size: int, detector: bool) -> np.ndarray:
    """A queued job's image brought to a new engine's input `size` (an engine swap), its geometry
    updated in place for a detector."""
    if not detector:
        return to_model_input(job.image, size, bgr=False)
    img, step = letterbox(job.image, size, bgr=False)
    old = job.geometry or Letterbox((1.0, 1.0), (0.0, 0.0), (float(img.shape[1]), float(img.shape[0])))
    job.geometry = Letterbox(
        (old.scale[0] * step.scale[0], old.scale[1] * step.scale[1]),
        (old.offset[0] * step.scale[0] + step.offset[0], old.offset[1] * step.scale[1] + step.offset[1]),
        old.limit,
    )
    return img


def _decode_bgr(
    data: bytes, size: int, *, max_pixels: int, min_side: int, detail: int | None
) -> tuple[np.ndarray, ImageHeader]:
    if not data:
        raise DecodeError("empty image")
    header = read_header(data)
    w, h = header.width, header.height
    if min(w, h) < min_side:
        raise DecodeError(f"image is {w}×{h} pixels: each side must be at least {min_side}")
    if w * h > max_pixels:
        raise DecodeError(f"image is {w}×{h} pixels, over the limit of {max_pixels} pixels")
    if not _complete(data, header.format):
        raise DecodeError(f"truncated {header.format.upper()} image")
    flag = cv2.IMREAD_COLOR
    if header.format == "jpeg":
        shorter = min(w, h)
        keep = detail or size
        if shorter >= 4 * keep:
            flag = cv2.IMREAD_REDUCED_COLOR_4
        elif shorter >= 2 * keep:
            flag = cv2.IMREAD_REDUCED_COLOR_2
    buf = np.frombuffer(data, dtype=np.uint8)
    try:
        img = cv2.imdecode(buf, flag)
    except cv2.error as exc:
        raise DecodeError(f"corrupt {header.format.upper()} image: {str(exc).strip()[:120]}") from None
    if img is None or img.ndim != 3 or img.shape[0] < 1 or img.shape[1] < 1:
        raise DecodeError(f"corrupt {header.format.upper()} image: the decoder could not read it")
    return img, header


def to_model_input(img: np.ndarray, size: int, *, bgr: bool = True) -> np.ndarray:
    """An HxWx3 uint8 frame → RGB `[size, size, 3]`: shorter side to `size`, centre crop."""
    h, w = img.shape[:2]
    scale = size / min(h, w)
    nw, nh = max(size, round(w * scale)), max(size, round(h * scale))
    if (nw, nh) != (w, h):
        interp = cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR
        img = cv2.resize(img, (nw, nh), interpolation=interp)
    top, left = (nh - size) // 2, (nw - size) // 2
    img = img[top : top + size, left : left + size]
    if bgr:
        img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
    return np.ascontiguousarray(img)


def warm_up_decoder(size: int, detail: int | None = None) -> None:
    """Decode a 640×480 JPEG (reduced and full) and a PNG once, so the first request does not pay for
    the codecs' lazy initialisation."""
    img = np.zeros((480, 640, 3), dtype=np.uint8)
    img[:, :, 1] = np.arange(640, dtype=np.uint16)[None, :] * 255 // 640
    for ext in (".jpg", ".png"):
        ok, buf = cv2.imencode(ext, img)
        if ok:
            decode_image(bytes(buf), size, detail=detail)
            decode_image(bytes(buf), size, detail=max(8, 480 // 4))
