"""Test images, encoded as the wire carries them: solid colours, and photos with detail in them."""

from __future__ import annotations

import cv2
import numpy as np


def solid_jpeg(rgb: tuple[int, int, int], size: tuple[int, int] = (64, 48), quality: int = 90) -> bytes:
    w, h = size
    img = np.zeros((h, w, 3), dtype=np.uint8)
    img[:] = rgb[::-1]  # OpenCV is BGR
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, quality])
    assert ok
    return bytes(buf)


def solid_png(rgb: tuple[int, int, int], size: tuple[int, int] = (64, 48)) -> bytes:
    w, h = size
    img = np.zeros((h, w, 3), dtype=np.uint8)
    img[:] = rgb[::-1]
    ok, buf = cv2.imencode(".png", img)
    assert ok
    return bytes(buf)


def photo(size: tuple[int, int], seed: int = 7) -> bytes:
    """A JPEG with detail in it (blurred noise), `size` (width, height): a solid colour would compress
    to almost nothing, where a photo of that size is as large as a camera's. The same `seed`, the
    same bytes."""
    w, h = size
    rng = np.random.default_rng(seed)
    img = cv2.GaussianBlur(rng.integers(0, 255, (h, w, 3), dtype=np.uint8), (0, 0), 2)
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 95])
    assert ok
    return bytes(buf)
