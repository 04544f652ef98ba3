"""Exponential backoff, capped and jittered: how a lost camera or stream is tried again."""

from __future__ import annotations

import random
from collections.abc import Callable

INITIAL_S = 0.5
FACTOR = 2.0
JITTER = 0.2  # each delay within ±20 % of its step: sources lost together do not retry in step


class Backoff:
    """`next()` gives the delay before the next attempt: `initial_s` doubled at each failure up to
    `max_s`, each within ±`jitter` of its step. The jitter is kept below what a doubling adds, so
    successive delays grow until the cap. `reset()` after a success."""

    def __init__(
        self,
        max_s: float,
        *,
        initial_s: float = INITIAL_S,
        factor: float = FACTOR,
        jitter: float = JITTER,
        uniform: Callable[[float, float], float] = random.uniform,
    ) -> None:
        self.initial_s = min(initial_s, max_s)
        self.max_s = max_s
        self.factor = factor
        self.jitter = jitter
        self.uniform = uniform
        self.failures = 0

    def next(self) -> float:
        step = min(self.max_s, self.initial_s * self.factor**self.failures)
        self.failures += 1
        return step * self.uniform(1 - self.jitter, 1 + self.jitter)

    def reset(self) -> None:
        self.failures = 0
