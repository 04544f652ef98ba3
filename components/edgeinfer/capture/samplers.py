"""Which answers to capture: one rule per sampler, each with its own per-minute/hour/day limits.

Pure: a rule reads the results only, the limits read the clock they are given, the random share
reads the random source it is given. An answer is chosen by the first sampler whose rule matches
and whose limits still allow one more; the sampler's kind is the record's reason.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable

from edgeinfer.capture.config import Limits, ModelCapture, SamplerConfig
from edgeinfer.messages import ErrorCode, Result

__all__ = ["Limiter", "Sampler", "Selector", "top_scores"]

_WINDOWS = ((60.0, "per_minute"), (3600.0, "per_hour"), (86400.0, "per_day"))


class Limiter:
    """Sliding windows of what was taken: `allows(now)` before, `take(now)` once chosen. One queue
    per window, so a check costs what expired since the last one, not the day's count."""

    def __init__(self, limits: Limits) -> None:
        self.windows = [
            (span, int(getattr(limits, name)), deque[float]())
            for span, name in _WINDOWS
            if getattr(limits, name)
        ]

    def allows(self, now: float) -> bool:
        ok = True
        for span, cap, taken in self.windows:
            while taken and taken[0] <= now - span:
                taken.popleft()
            ok = ok and len(taken) < cap
        return ok

    def take(self, now: float) -> None:
        for _span, _cap, taken in self.windows:
            taken.append(now)


def top_scores(result: Result) -> list[float]:
    """The scores a confidence band looks at: a classifier's top-1, or every detection's."""
    if result.detections is not None:
        return [d.score for d in result.detections]
    return [result.predictions[0].score] if result.predictions else []


def _labels(result: Result) -> list[str]:
    if result.detections is not None:
        return [d.label for d in result.detections]
    return [result.predictions[0].label] if result.predictions else []


class Sampler:
    """One configured sampler: its rule over (computed, answered) and its limits."""

    def __init__(self, cfg: SamplerConfig, rng: Callable[[], float]) -> None:
        self.cfg = cfg
        self.kind = cfg.kind
        self.rng = rng
        self.limiter = Limiter(cfg.limits)
        self.codes = set(cfg.codes)
        self.classes = set(cfg.classes)

    def matches(self, computed: Result, answered: Result) -> bool:
        """`computed`: what the model made (predictions even when late); `answered`: what went out."""
        cfg = self.cfg
        code = answered.error.code if answered.error is not None else None
        if self.kind == "deadline":
            return code is ErrorCode.DEADLINE_EXCEEDED
        if self.kind == "errors":
            if code is None or code is ErrorCode.DEADLINE_EXCEEDED:
                return False
            return not self.codes or code.value in self.codes
        if computed.status != "ok":
            return False
        if self.kind == "random":
            return self.rng() < cfg.share
        if self.kind == "confidence":
            return any(cfg.low <= s <= cfg.high for s in top_scores(computed))
        if self.kind == "classes":
            return any(label in self.classes for label in _labels(computed))
        if self.kind == "detections":
            count = len(computed.detections or [])
            return (
                computed.detections is not None
                and cfg.min_count <= count
                and (cfg.max_count < 0 or count <= cfg.max_count)
            )
        return False


class Selector:
    """A model's samplers in their configured order."""

    def __init__(
        self,
        cfg: ModelCapture,
        *,
        clock: Callable[[], float],
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.clock = clock
        self.samplers = [Sampler(s, rng) for s in cfg.samplers]

    def choose(self, computed: Result, answered: Result) -> str | None:
        """The reason to capture this answer (a sampler's kind), or None."""
        now = self.clock()
        for sampler in self.samplers:
            if sampler.matches(computed, answered) and sampler.limiter.allows(now):
                sampler.limiter.take(now)
                return sampler.kind
        return None
