"""Solid-colour test images, encoded as the wire carries them."""

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
