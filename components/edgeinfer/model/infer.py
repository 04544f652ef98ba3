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
    row = np.asarray(logits, dtype=np.float64).reshape(-1)
    probs = np.exp(row - row.max())
    probs /= probs.sum()
    order = np.argsort(-probs)[:k]
    return [(int(i), labels[i] if i < len(labels) else str(i), float(probs[i])) for i in order]
