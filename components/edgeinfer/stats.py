"""The one quantile: nearest rank, the definition the telemetry histogram documents.

Every benchmark, the placement policy and the telemetry windows report "p99" by this rule, so a
p99 in one table means the same as in another: the smallest value with at least 99 % of the values
at or below it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["percentile", "quantile"]


def quantile(values: Iterable[float], q: float, empty: float = math.nan) -> float:
    """The value at quantile `q` in [0, 1] by nearest rank; `empty` when there are no values."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is outside [0, 1]")
    ordered = sorted(values)
    if not ordered:
        return empty
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def percentile(values: Iterable[float], p: float, empty: float = math.nan) -> float:
    """`quantile` with `p` in [0, 100]."""
    return quantile(values, p / 100.0, empty)
