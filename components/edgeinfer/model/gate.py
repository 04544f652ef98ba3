"""The accuracy gate: how closely a quantized variant agrees with the FP32 original."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from edgeinfer.errors import GateFailedError

CONFIDENT = 0.5  # FP32 top-1 probability above which an input counts as "confident"


@dataclass
class Thresholds:
    min_top1: float = 0.95  # top-1 agreement with FP32, all held-out inputs
    min_top1_confident: float = 0.99  # ... on inputs where FP32's top-1 probability > 0.5
    min_top5: float = 0.99  # FP32's top-1 class within the variant's top 5
    max_mean_abs_logit_delta: float | None = None  # mean |Δlogit|; None: reported, not gated

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    return np.asarray(e / e.sum(axis=1, keepdims=True))


def agreement(reference: np.ndarray, candidate: np.ndarray) -> dict[str, Any]:
    """Agreement figures of `candidate` logits against `reference` (FP32) logits, both [N, classes]."""
    ref_top1 = reference.argmax(axis=1)
    cand_top1 = candidate.argmax(axis=1)
    confident = softmax(reference).max(axis=1) > CONFIDENT
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


class AccuracyGateError(GateFailedError):
    """GateFailedError that also carries the whole validation report."""

    def __init__(self, message: str, report: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.report = report or {}


def check(
    results: dict[str, dict[str, Any]], thresholds: Thresholds, report: dict[str, Any] | None = None
) -> None:
    """Raise GateFailedError (one line) when any variant misses a threshold."""
    problems = [p for name, figures in results.items() for p in failures(name, figures, thresholds)]
    if problems:
        raise AccuracyGateError("accuracy gate failed: " + "; ".join(problems), report)
