"""Decoding: header checks before decode, reduced JPEG decode, common size, every bad image refused."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from edgeinfer.runtime.decode import DecodeError, decode_image, read_header, to_model_input
from tests.helpers.images import solid_jpeg, solid_png


def encode(ext: str, img: np.ndarray) -> bytes:
    ok, buf = cv2.imencode(ext, img)
    assert ok
    return bytes(buf)


@pytest.mark.parametrize("ext", [".jpg", ".png", ".bmp", ".webp"])
def test_header_dimensions(ext: str) -> None:
    img = np.zeros((37, 91, 3), dtype=np.uint8)
    header = read_header(encode(ext, img))
    assert (header.width, header.height) == (91, 37)


def test_common_size_rgb_centre_crop() -> None:
    img = np.zeros((480, 640, 3), dtype=np.uint8)
    img[:, 80:560] = (0, 0, 255)  # red (BGR) in the centre square, black bars at the sides
    out = decode_image(encode(".png", img), 64)
    assert out.shape == (64, 64, 3)
    assert out.dtype == np.uint8
    assert tuple(out[32, 32]) == (255, 0, 0)


def test_reduced_decode_gives_the_same_picture() -> None:
    rng = np.random.default_rng(1)
    img = cv2.resize(rng.integers(0, 255, (12, 16, 3), dtype=np.uint8), (1280, 960))
    data = encode(".jpg", img)
    reduced = decode_image(data, 224)  # shorter side 960 ≥ 4×224: decoded at 1/4
    decoded = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    assert decoded is not None
    full = to_model_input(decoded, 224)
    assert np.abs(reduced.astype(int) - full.astype(int)).mean() < 6


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "empty"),
        (b"GIF89a....", "not a supported image"),
        (solid_png((1, 1, 1), (1, 1)), "at least 8"),
        (solid_jpeg((1, 1, 1))[:200], "truncated"),
        (solid_png((1, 1, 1))[:-20], "truncated"),
        (b"\xff\xd8\xff\xe0\x00\x10JFIF" + b"\x00" * 50, "corrupt JPEG"),
        (b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + b"\x01" * 7 + b"\xff\xd9", "no frame header"),
        (b"\x89PNG\r\n\x1a\n\x00", "IHDR"),
    ],
    ids=["empty", "gif", "1x1", "truncated-jpeg", "truncated-png", "corrupt", "no-sof", "no-ihdr"],
)
def test_bad_images(data: bytes, why: str) -> None:
    with pytest.raises(DecodeError, match=why):
        decode_image(data, 32)


def test_huge_image_refused_from_its_header() -> None:
    data = bytearray(solid_jpeg((1, 2, 3), (16, 16)))
    sof = data.find(b"\xff\xc0")
    data[sof + 5 : sof + 9] = (20000).to_bytes(2, "big") * 2
    assert read_header(bytes(data)).width == 20000
    with pytest.raises(DecodeError, match="over the limit"):
        decode_image(bytes(data), 32)


def test_corrupt_body_with_valid_header() -> None:
    good = solid_jpeg((10, 200, 10), (64, 64))
    sos = good.find(b"\xff\xda")
    bad = good[: sos + 4] + b"\xff\x00" * 10 + b"\xff\xd9"
    try:
        out = decode_image(bad, 32)
    except DecodeError:
        return
    assert out.shape == (32, 32, 3)  # libjpeg may salvage it: either way no crash, right shape
