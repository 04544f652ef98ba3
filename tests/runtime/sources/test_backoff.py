"""Backoff: doubling from its first step to its cap, each delay jittered, reset after a success."""

from __future__ import annotations

import itertools
import random

from edgeinfer.runtime.sources import Backoff


def test_delays_double_up_to_the_cap() -> None:
    backoff = Backoff(3.0, uniform=lambda lo, hi: 1.0)
    assert [backoff.next() for _ in range(6)] == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]
    backoff.reset()
    assert backoff.next() == 0.5


def test_jittered_delays_still_grow_until_the_cap() -> None:
    rng = random.Random(7)
    for _ in range(200):
        backoff = Backoff(8.0, uniform=rng.uniform)
        delays = [backoff.next() for _ in range(5)]  # steps 0.5, 1, 2, 4, 8
        assert all(b > a for a, b in itertools.pairwise(delays))
        assert all(0.8 * s <= d <= 1.2 * s for d, s in zip(delays, [0.5, 1, 2, 4, 8], strict=True))


def test_a_cap_below_the_first_step_is_the_step() -> None:
    assert Backoff(0.2, uniform=lambda lo, hi: 1.0).next() == 0.2
