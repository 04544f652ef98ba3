"""Post steps on a graph's outputs: softmax and top-k for classifiers, thresholds and NMS for detectors.

The one softmax and top-k of the project (the runtime's engine, `model classify` and the gate use
these). Detection: the graph already decoded the boxes (`boxes [N, A, 4]` in the input image's pixels,
`scores [N, A, C]`); what is left is per request — keep (box, class) pairs over the score threshold,
suppress overlaps class by class, keep the best `max_detections`. It is vectorised: one IoU matrix per
image over the candidates that passed the threshold (tens, rarely hundreds), every class at once by
offsetting each class's boxes into a region of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["MAX_CANDIDATES", "Box", "Detection", "detections", "iou", "nms", "softmax", "top_k"]

# NMS looks at the best this many (box, class) pairs over the threshold: its IoU matrix is 4 MB, where
# a low threshold on YOLOv3-tiny's 2535 × 80 scores could ask for 200,000 pairs and 160 GB.
MAX_CANDIDATES = 1024


def softmax(logits: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax along `axis`, float32."""
    x = np.asarray(logits, dtype=np.float32)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    out: np.ndarray = (e / e.sum(axis=axis, keepdims=True)).astype(np.float32)
    return out


def top_k(probs: np.ndarray, k: int) -> list[tuple[int, float]]:
    """[(class index, score)] of one row, best first, ties in index order."""
    row = np.asarray(probs).reshape(-1)
    k = max(1, min(k, row.shape[0]))
    idx = np.argpartition(-row, k - 1)[:k]
    idx = idx[np.argsort(-row[idx], kind="stable")]
    return [(int(i), float(row[i])) for i in idx]


@dataclass(frozen=True)
class Box:
    x_min: float
    y_min: float
    x_max: float
    y_max: float


@dataclass(frozen=True)
class Detection:
    index: int  # class index
    score: float
    box: Box


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU matrix `[len(a), len(b)]` of xyxy boxes."""
    a = np.asarray(a, dtype=np.float32).reshape(-1, 4)
    b = np.asarray(b, dtype=np.float32).reshape(-1, 4)
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(axis=2)
    area_a = np.clip(a[:, 2:] - a[:, :2], 0, None).prod(axis=1)
    area_b = np.clip(b[:, 2:] - b[:, :2], 0, None).prod(axis=1)
    union = area_a[:, None] + area_b[None, :] - inter
    out: np.ndarray = np.where(union > 0, inter / np.maximum(union, 1e-9), 0.0).astype(np.float32)
    return out


def nms(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float, limit: int) -> np.ndarray:
    """Indices kept by greedy NMS, best first, at most `limit`."""
    order = np.argsort(-scores, kind="stable")
    boxes = boxes[order]
    overlaps = iou(boxes, boxes) > iou_threshold
    keep: list[int] = []
    suppressed = np.zeros(len(order), dtype=bool)
    for i in range(len(order)):
        if suppressed[i]:
            continue
        keep.append(i)
        if len(keep) >= limit:
            break
        suppressed |= overlaps[i]
    return order[np.array(keep, dtype=np.int64)] if keep else np.zeros(0, np.int64)


def detections(
    boxes: np.ndarray,
    scores: np.ndarray,
    *,
    score_threshold: float,
    iou_threshold: float,
    max_detections: int,
    scale: Sequence[float] = (1.0, 1.0),
    offset: Sequence[float] = (0.0, 0.0),
    limit: Sequence[float] | None = None,
) -> list[Detection]:
    """One image's `boxes [A, 4]` and `scores [A, C]` → detections, best first.

    `scale`, `offset` (x, y): the runtime's own letterbox, canvas = source · scale + offset; undone
    here, and boxes clipped to `limit` (source width, height) when given."""
    # rows first: the row maxima and the few rows that pass cost a fraction of a nonzero over all of
    # YOLOv3-tiny's 2535 × 80 scores
    rows = np.flatnonzero(scores.max(axis=1) > score_threshold)
    if rows.size == 0:
        return []
    hit, cls = np.nonzero(scores[rows] > score_threshold)
    anchor = rows[hit]
    conf = scores[anchor, cls].astype(np.float32)
    if conf.size > MAX_CANDIDATES:
        best = np.argpartition(-conf, MAX_CANDIDATES - 1)[:MAX_CANDIDATES]
        anchor, cls, conf = anchor[best], cls[best], conf[best]
    cand = boxes[anchor].astype(np.float32)
    # class-aware NMS in one pass: each class's boxes moved to a region no other class reaches
    span = float(np.abs(cand).max()) + 1.0
    shifted = cand + (cls.astype(np.float32) * 2 * span)[:, None]
    kept = nms(shifted, conf, iou_threshold, max_detections)
    out = cand[kept]
    sx, sy = float(scale[0]), float(scale[1])
    out = (out - np.array([offset[0], offset[1], offset[0], offset[1]], np.float32)) / np.array(
        [sx, sy, sx, sy], np.float32
    )
    if limit is not None:
        out = np.clip(out, 0, np.array([limit[0], limit[1], limit[0], limit[1]], np.float32))
    return [
        Detection(int(cls[k]), float(conf[k]), Box(*(round(float(v), 2) for v in row)))
        for k, row in zip(kept, out, strict=True)
    ]
