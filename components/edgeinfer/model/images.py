"""Images for calibration and validation: the photos inside scikit-image, augmented crops, user folders.

The built-in sets split scikit-image's photos by source image, so the validation (gate) set shares no
image with the calibration set. Everything is returned as uint8 RGB HWC arrays at the store's
`preferred_input` size, which is what the runtime feeds the published graphs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.errors import EdgeinferError

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}

# Split by source photo: no calibration image is a crop of a validation photo or vice versa. The
# held-out set is every natural photo (what the device classifies; the bundled samples are among
# them); calibration gets everything else: textures, microscopy, astronomy, documents, the camera man.
# Calibrating on the one kind of image and validating on the other is the harder test of the ranges.
CALIBRATION_PHOTOS = (
    "brick",
    "grass",
    "gravel",
    "hubble_deep_field",
    "immunohistochemistry",
    "retina",
    "cell",
    "moon",
    "coins",
    "page",
    "text",
    "logo",
    "colorwheel",
    "camera",
)
VALIDATION_PHOTOS = (
    "chelsea",
    "coffee",
    "astronaut",
    "rocket",
    "motorcycle_left",
    "motorcycle_right",  # the stereo pair's other view: on the same side of the split
    "horse",
    "clock",
)


# Detectors: Darknet's classic test photos (Debian's `darknet` package installs them), the photos
# bundled with this package and scikit-image's. The held-out set is four Darknet photos full of
# objects; calibration gets every other photo, so the gate compares on images it never calibrated on.
DARKNET_DATA = Path("/usr/share/darknet/data")
DETECTION_VALIDATION = ("dog", "person", "horses", "kite")
DETECTION_CALIBRATION = ("eagle", "giraffe", "scream")
SAMPLES = Path(__file__).resolve().parent / "samples"
NATURAL_PHOTOS = ("chelsea", "coffee", "astronaut", "rocket", "motorcycle_left", "horse", "clock", "camera")


def darknet_photo(name: str, folder: Path | None = None) -> np.ndarray | None:
    """One of Darknet's test photos as uint8 RGB; None when the darknet data is not installed."""
    path = (folder or DARKNET_DATA) / f"{name}.jpg"
    return read_image(path) if path.is_file() else None


def letterbox(image: np.ndarray, size: Sequence[int], pad_value: int = 127) -> np.ndarray:
    """Scale to fit [H, W] keeping the aspect, centred on a `pad_value` canvas (what a detector sees)."""
    import cv2

    h, w = int(size[0]), int(size[1])
    scale = min(h / image.shape[0], w / image.shape[1])
    nh = max(1, min(h, int(image.shape[0] * scale + 0.5)))
    nw = max(1, min(w, int(image.shape[1] * scale + 0.5)))
    resized = cv2.resize(image, (nw, nh), interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR)
    canvas = np.full((h, w, 3), pad_value, dtype=np.uint8)
    top, left = (h - nh) // 2, (w - nw) // 2
    canvas[top : top + nh, left : left + nw] = resized
    return canvas


def detection_sets(
    size: Sequence[int], calibration_per_photo: int, validation_per_photo: int, seed: int
) -> tuple[ImageSet, ImageSet]:
    """(calibration, held-out validation) for a detector, letterboxed to `size`, disjoint by photo."""
    rng = np.random.default_rng(seed)

    def resize(image: np.ndarray, shape: Sequence[int]) -> np.ndarray:
        return letterbox(image, shape)

    calib, valid = ImageSet(images=[]), ImageSet(images=[])
    darknet_valid = [(n, darknet_photo(n)) for n in DETECTION_VALIDATION]
    have_darknet = all(p is not None for _, p in darknet_valid)
    calib_photos: list[tuple[str, np.ndarray | None]] = [
        (f"darknet:{n}", darknet_photo(n)) for n in DETECTION_CALIBRATION
    ]
    calib_photos += [(f"sample:{p.stem}", read_image(p)) for p in sorted(SAMPLES.glob("*.jpg"))]
    natural = [(f"skimage:{n}", builtin_photo(n)) for n in NATURAL_PHOTOS]
    if have_darknet:
        valid_photos = [(f"darknet:{n}", p) for n, p in darknet_valid]
        calib_photos += natural
    else:  # no darknet data here: hold out half of scikit-image's natural photos instead
        log.warning("Darknet's test photos are missing (%s): validating on scikit-image photos", DARKNET_DATA)
        valid_photos, calib_photos = natural[::2], calib_photos + natural[1::2]
    for target, photos, per_photo in (
        (calib, calib_photos, calibration_per_photo),
        (valid, valid_photos, validation_per_photo),
    ):
        for name, photo in photos:
            if photo is None:
                continue
            crops = augment(photo, rng, per_photo, size, resize=resize)
            target.images += crops
            target.sources += [name] * len(crops)
    return calib, valid


class CalibrationError(EdgeinferError):
    """Too few usable calibration images."""


@dataclass
class ImageSet:
    images: list[np.ndarray]  # uint8 RGB HWC, all the same size
    sources: list[str] = field(default_factory=list)  # source photo / file per image
    skipped: int = 0  # unreadable or non-image files

    def __len__(self) -> int:
        return len(self.images)

    def batches(self, size: int) -> Iterable[np.ndarray]:
        for start in range(0, len(self.images), size):
            yield np.stack(self.images[start : start + size])


def to_rgb(image: np.ndarray) -> np.ndarray:
    """uint8 RGB HWC from gray, RGBA, bool or float images."""
    img = np.asarray(image)
    if img.dtype == np.bool_:
        img = img.astype(np.uint8) * 255
    elif img.dtype != np.uint8:
        scale = 255.0 if img.max() <= 1.0 else 1.0
        img = np.clip(img.astype(np.float64) * scale, 0, 255).astype(np.uint8)
    if img.ndim == 2:
        img = np.repeat(img[:, :, None], 3, axis=2)
    elif img.shape[2] == 4:
        alpha = img[:, :, 3:4].astype(np.float32) / 255.0
        img = (img[:, :, :3].astype(np.float32) * alpha + 255.0 * (1.0 - alpha)).astype(np.uint8)
    elif img.shape[2] == 1:
        img = np.repeat(img, 3, axis=2)
    return np.ascontiguousarray(img[:, :, :3])


def read_image(path: Path) -> np.ndarray | None:
    """Decode an image file to uint8 RGB, or None when it is unreadable or not an image."""
    import cv2

    try:
        data = np.fromfile(str(path), dtype=np.uint8)
    except OSError:
        return None
    if data.size == 0:
        return None
    img = cv2.imdecode(data, cv2.IMREAD_COLOR)
    if img is None or img.ndim != 3 or min(img.shape[:2]) < 8:
        return None
    return np.ascontiguousarray(img[:, :, ::-1])


def builtin_photo(name: str) -> np.ndarray | None:
    """One of scikit-image's bundled photos (no download) as uint8 RGB; None if unavailable."""
    try:
        from skimage import data
    except ImportError:
        return None
    stereo: Any = data.stereo_motorcycle
    getter: dict[str, Any] = {
        "motorcycle_left": lambda: stereo()[0],
        "motorcycle_right": lambda: stereo()[1],
    }
    try:
        fn = getter.get(name) or getattr(data, name)
        return to_rgb(fn())
    except Exception as exc:  # pooch-backed images raise when they would need a download
        log.debug("skimage photo %s unavailable: %s", name, exc)
        return None


def fit(image: np.ndarray, size: Sequence[int]) -> np.ndarray:
    """Resize to [H, W] (area interpolation when shrinking) — what the runtime does after decode."""
    import cv2

    h, w = int(size[0]), int(size[1])
    if image.shape[:2] == (h, w):
        return image
    shrink = image.shape[0] >= h and image.shape[1] >= w
    return cv2.resize(image, (w, h), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)


def augment(
    image: np.ndarray,
    rng: np.random.Generator,
    count: int,
    size: Sequence[int],
    *,
    resize: Callable[[np.ndarray, Sequence[int]], np.ndarray] | None = None,
) -> list[np.ndarray]:
    """The image itself plus `count - 1` random resized crops with flips and light colour jitter.
    `resize` brings each to `size` (default `fit`, a plain resize; detectors letterbox)."""
    fit_to = resize or fit
    out = [fit_to(image, size)]
    h, w = image.shape[:2]
    for _ in range(count - 1):
        area = rng.uniform(0.12, 1.0) * h * w
        ratio = float(np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3))))
        ch = int(min(h, max(16, round(np.sqrt(area / ratio)))))
        cw = int(min(w, max(16, round(np.sqrt(area * ratio)))))
        y = int(rng.integers(0, h - ch + 1))
        x = int(rng.integers(0, w - cw + 1))
        crop = image[y : y + ch, x : x + cw]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        crop = fit_to(np.ascontiguousarray(crop), size).astype(np.float32)
        crop = crop * rng.uniform(0.75, 1.25) + rng.uniform(-20, 20)  # contrast, brightness
        out.append(np.clip(crop, 0, 255).astype(np.uint8))
    return out


def builtin_set(names: Sequence[str], per_photo: int, size: Sequence[int], seed: int) -> ImageSet:
    rng = np.random.default_rng(seed)
    result = ImageSet(images=[])
    for name in names:
        photo = builtin_photo(name)
        if photo is None:
            continue
        crops = augment(photo, rng, per_photo, size)
        result.images += crops
        result.sources += [name] * len(crops)
    return result


def folder_set(
    folder: Path,
    size: Sequence[int],
    *,
    limit: int,
    per_image: int,
    min_count: int,
    seed: int,
    resize: Callable[[np.ndarray, Sequence[int]], np.ndarray] | None = None,
    files: Sequence[Path] | None = None,
) -> ImageSet:
    """Images from a user folder (recursively, or the `files` in it a pulled capture folder's manifest
    lists); unreadable and non-image files are skipped and counted."""
    if not folder.is_dir():
        raise CalibrationError(f"calibration folder {folder} does not exist")
    files = list(files) if files is not None else sorted(p for p in folder.rglob("*") if p.is_file())
    rng = np.random.default_rng(seed)
    result = ImageSet(images=[])
    for path in files:
        if len(result.images) >= limit:
            break
        image = read_image(path) if path.suffix.lower() in IMAGE_SUFFIXES else None
        if image is None:
            result.skipped += 1
            continue
        crops = augment(image, rng, per_image, size, resize=resize)
        result.images += crops
        result.sources += [str(path)] * len(crops)
    if len(result.images) < min_count:
        what = f"{len(files)} files, {result.skipped} skipped as unreadable or not images"
        raise CalibrationError(
            f"calibration folder {folder} has too few usable images:"
            f" {len(result.images)} < {min_count} ({what})"
        )
    return result


def stack(images: Sequence[np.ndarray]) -> Any:
    return np.stack(images)
