"""Sample photos bundled with the package (from scikit-image's data, resized to about 640×480 JPEG).

The runtime, the demo and the end-to-end tests use them; `cat_image()` is a tabby cat (ImageNet
classes 281–285).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["SAMPLES_DIR", "cat_image", "sample_images"]

SAMPLES_DIR = Path(__file__).resolve().parent


def sample_images() -> list[Path]:
    """All bundled sample JPEGs, sorted by name (astronaut, cat, coffee, motorcycle, rocket)."""
    return sorted(SAMPLES_DIR.glob("*.jpg"))


def cat_image() -> Path:
    """Chelsea the cat: the top-1 class of a working ImageNet classifier lies in 281–285."""
    return SAMPLES_DIR / "cat.jpg"
