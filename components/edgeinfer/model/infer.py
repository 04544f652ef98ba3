"""Small helpers to run a built store: open a session on a provider, prepare images, read top-k.

The inference runtime has its own engine (batching, warm-up, provider options); these serve the
`model classify` command, the benchmark and tests.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.errors import EdgeinferError
from edgeinfer.model.manifest import CPU, Manifest, Variant

log = logging.getLogger(__name__)


def session_options(threads: int = 0) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if threads:
        opts.intra_op_num_threads = threads
    return opts


def open_session(
    manifest: Manifest,
    provider: str | None = None,
    variant: str | None = None,
    threads: int = 0,
) -> tuple[Any, Variant, str]:
    """A session on `provider` (default: the best available one a variant is meant for).

    Returns (session, variant, provider that really runs): ONNX Runtime falls back to the CPU
    silently when a GPU provider fails to load, so the variant is re-picked for what really loaded."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    if provider is None:
        wanted = {p for v in manifest.variants for p in v.providers}
        provider = next((p for p in available if p in wanted), CPU)
    elif provider not in available:
        raise EdgeinferError(
            f"execution provider {provider} is not available here (have: {', '.join(available)})"
        )
    chosen = manifest.variant(variant) if variant else manifest.variant_for(provider)
    providers = [provider] + ([CPU] if provider != CPU else [])
    path = manifest.path(chosen)
    try:
        sess = ort.InferenceSession(str(path), session_options(threads), providers=providers)
    except Exception as exc:
        raise EdgeinferError(f"cannot load {path}: {str(exc).strip().splitlines()[0][:200]}") from None
    actual = sess.get_providers()[0]
    if actual != provider and variant is None:
        log.warning("%s did not load; running on %s", provider, actual)
        fallback = manifest.variant_for(actual)
        if fallback.file != chosen.file:
            chosen = fallback
            sess = ort.InferenceSession(
                str(manifest.path(chosen)), session_options(threads), providers=[actual]
            )
    return sess, chosen, actual


def decode(path: Path) -> np.ndarray:
    """Decode an image file to uint8 RGB HWC; EdgeinferError when it is not an image."""
    from edgeinfer.model.images import read_image

    if not path.is_file():
        raise EdgeinferError(f"image {path} {'is a folder' if path.is_dir() else 'does not exist'}")
    image = read_image(path)
    if image is None:
        raise EdgeinferError(f"cannot decode {path}: not an image")
    return image


def prepare(image: np.ndarray, manifest: Manifest) -> np.ndarray:
    """Resize to the store's preferred input (what the runtime does) and add the batch axis."""
    from edgeinfer.model.images import fit

    return fit(image, manifest.preprocessing.preferred_input)[None]


def top_k(logits: np.ndarray, labels: Sequence[str], k: int = 5) -> list[tuple[int, str, float]]:
    """[(class index, label, softmax probability)] for one row of logits, best first."""
    from edgeinfer import postprocess

    probs = postprocess.softmax(np.asarray(logits).reshape(-1))
    return [(i, labels[i] if i < len(labels) else str(i), p) for i, p in postprocess.top_k(probs, k)]


def detect(
    sess: Any,
    image: np.ndarray,
    manifest: Manifest,
    score_threshold: float | None = None,
    max_detections: int | None = None,
) -> list[Any]:
    """One RGB image of any size → its detections (edgeinfer.postprocess.Detection) in its own pixels:
    the graph letterboxes and maps the boxes back itself."""
    from edgeinfer import postprocess

    spec = manifest.detection
    if spec is None:
        raise EdgeinferError(f"model store {manifest.root} is not a detector")
    boxes, scores = sess.run(None, {sess.get_inputs()[0].name: image[None]})
    return postprocess.detections(
        boxes[0],
        scores[0],
        score_threshold=spec.score_threshold if score_threshold is None else score_threshold,
        iou_threshold=spec.iou_threshold,
        max_detections=max_detections or spec.max_detections,
    )


def drawing_targets(out: Path | None, images: Sequence[Path]) -> list[Path | None]:
    """Where `--out` puts each drawn photo: the file itself for one image, else `<folder>/<name>`."""
    if out is None:
        return [None] * len(images)
    if len(images) == 1 and out.suffix.lower() in (".jpg", ".jpeg", ".png", ".bmp", ".webp"):
        if out.is_dir():
            raise EdgeinferError(f"--out {out} is a folder; give a file name like boxes.jpg or a new folder")
        out.parent.mkdir(parents=True, exist_ok=True)
        return [out]
    if out.exists() and not out.is_dir():
        raise EdgeinferError(f"--out {out} is a file; with several images give a folder")
    out.mkdir(parents=True, exist_ok=True)
    return [out / f"{p.stem}.detected{p.suffix or '.jpg'}" for p in images]


def draw(image: np.ndarray, found: Sequence[Any], labels: Sequence[str], path: Path) -> None:
    """Write `image` (RGB) with each detection's box and label drawn on it."""
    import cv2

    canvas = np.ascontiguousarray(image[:, :, ::-1])
    thick = max(1, round(max(image.shape[:2]) / 400))
    for d in found:
        colour = tuple(int(c) for c in np.random.default_rng(d.index).integers(64, 256, 3))
        p1 = (int(d.box.x_min), int(d.box.y_min))
        p2 = (int(d.box.x_max), int(d.box.y_max))
        cv2.rectangle(canvas, p1, p2, colour, thick)
        text = f"{labels[d.index] if d.index < len(labels) else d.index} {d.score:.2f}"
        cv2.putText(
            canvas, text, (p1[0], max(12, p1[1] - 4)), cv2.FONT_HERSHEY_SIMPLEX, 0.4 * thick, colour, thick
        )
    ok, buf = cv2.imencode(path.suffix or ".jpg", canvas)
    if not ok:
        raise EdgeinferError(f"cannot encode {path.name}: use .jpg or .png")
    from edgeinfer.files import atomic_write

    atomic_write(path, bytes(buf))
