"""The accuracy gate: how closely a quantized variant agrees with the FP32 original."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from edgeinfer.errors import GateFailedError
from edgeinfer.postprocess import iou, softmax

CONFIDENT = 0.5  # FP32 top-1 probability above which an input counts as "confident"


@dataclass
class Thresholds:
    min_top1: float = 0.95  # top-1 agreement with FP32, all held-out inputs
    min_top1_confident: float = 0.99  # ... on inputs where FP32's top-1 probability > 0.5
    min_top5: float = 0.99  # FP32's top-1 class within the variant's top 5
    max_mean_abs_logit_delta: float | None = None  # mean |Δlogit|; None: reported, not gated
    # detectors: INT8's detections against FP32's own, matched at IoU >= 0.5 with the same class
    min_precision: float = 0.9  # of INT8's detections, the share FP32 also made
    min_recall: float = 0.9  # of FP32's detections, the share INT8 also made
    min_mean_iou: float = 0.8  # mean IoU of the matched pairs

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


MATCH_IOU = 0.5

# one detection: (class index, score, [x_min, y_min, x_max, y_max])
Found = tuple[int, float, Sequence[float]]


def agreement(reference: np.ndarray, candidate: np.ndarray) -> dict[str, Any]:
    """Agreement figures of `candidate` logits against `reference` (FP32) logits, both [N, classes]."""
    ref_top1 = reference.argmax(axis=1)
    cand_top1 = candidate.argmax(axis=1)
    confident = softmax(reference, axis=1).max(axis=1) > CONFIDENT
    top5 = np.argsort(-candidate, axis=1)[:, :5]
    same = ref_top1 == cand_top1
    return {
        "count": len(ref_top1),
        "confident_count": int(confident.sum()),
        "top1": float(same.mean()) if len(same) else 1.0,
        "top1_confident": float(same[confident].mean()) if confident.any() else 1.0,
        "top5": float((top5 == ref_top1[:, None]).any(axis=1).mean()) if len(same) else 1.0,
        "mean_abs_logit_delta": float(np.abs(reference - candidate).mean()) if len(same) else 0.0,
    }


def failures(name: str, figures: dict[str, Any], thresholds: Thresholds) -> list[str]:
    """Human-readable shortfalls ("top-1 agreement 92.3% < 95.0% (short by 2.7 points)")."""

    def pct(x: float) -> str:
        return f"{100 * x:.1f}%"

    out = []
    checks = [
        ("top-1 agreement", figures["top1"], thresholds.min_top1),
        ("confident top-1 agreement", figures["top1_confident"], thresholds.min_top1_confident),
        ("top-5 containment", figures["top5"], thresholds.min_top5),
    ]
    for label, value, minimum in checks:
        if value < minimum:
            out.append(
                f"{name} {label} {pct(value)} < {pct(minimum)}"
                f" (short by {100 * (minimum - value):.1f} points)"
            )
    limit = thresholds.max_mean_abs_logit_delta
    if limit is not None and figures["mean_abs_logit_delta"] > limit:
        out.append(f"{name} mean |Δlogit| {figures['mean_abs_logit_delta']:.3f} > {limit:.3f}")
    return out


def detection_agreement(
    reference: Sequence[Sequence[Found]], candidate: Sequence[Sequence[Found]]
) -> dict[str, Any]:
    """Precision, recall and mean IoU of `candidate`'s detections against `reference`'s (FP32's), image
    by image: greedy one-to-one matching, best IoU first, same class, IoU >= MATCH_IOU."""
    matched = ref_total = cand_total = 0
    ious: list[float] = []
    for ref, cand in zip(reference, candidate, strict=True):
        ref_total += len(ref)
        cand_total += len(cand)
        if not ref or not cand:
            continue
        overlap = iou(np.array([r[2] for r in ref]), np.array([c[2] for c in cand]))
        same = np.array([r[0] for r in ref])[:, None] == np.array([c[0] for c in cand])[None, :]
        overlap = np.where(same, overlap, 0.0)
        while True:
            i, j = np.unravel_index(int(np.argmax(overlap)), overlap.shape)
            if overlap[i, j] < MATCH_IOU:
                break
            ious.append(float(overlap[i, j]))
            matched += 1
            overlap[i, :] = 0.0
            overlap[:, j] = 0.0
    return {
        "images": len(reference),
        "reference_detections": ref_total,
        "detections": cand_total,
        "matched": matched,
        "precision": matched / cand_total if cand_total else 1.0,
        "recall": matched / ref_total if ref_total else 1.0,
        "mean_iou": float(np.mean(ious)) if ious else (1.0 if not ref_total else 0.0),
    }


def detection_failures(name: str, figures: dict[str, Any], thresholds: Thresholds) -> list[str]:
    out = []
    for label, key, minimum in (
        ("precision", "precision", thresholds.min_precision),
        ("recall", "recall", thresholds.min_recall),
        ("mean IoU", "mean_iou", thresholds.min_mean_iou),
    ):
        if figures[key] < minimum:
            out.append(
                f"{name} {label} {100 * figures[key]:.1f}% < {100 * minimum:.1f}%"
                f" (short by {100 * (minimum - figures[key]):.1f} points)"
            )
    return out


class AccuracyGateError(GateFailedError):
    """GateFailedError that also carries the whole validation report."""

    def __init__(self, message: str, report: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.report = report or {}


def check(
    results: dict[str, dict[str, Any]], thresholds: Thresholds, report: dict[str, Any] | None = None
) -> None:
    """Raise GateFailedError (one line) when any variant misses a threshold."""
    problems = [
        p
        for name, figures in results.items()
        for p in (detection_failures if "recall" in figures else failures)(name, figures, thresholds)
    ]
    if problems:
        raise AccuracyGateError("accuracy gate failed: " + "; ".join(problems), report)
