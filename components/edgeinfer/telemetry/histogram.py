"""An HDR-style log-linear histogram of latencies in milliseconds.

Values are quantised to integer `unit`s (default 1 µs). Below `2**SUB_BITS` units every unit has its own
bucket (exact); above, each power-of-two range is split into `2**(SUB_BITS-1)` equal sub-buckets, so a
bucket is never wider than 1/128 of its lower bound — the same layout HdrHistogram uses.
Recording is a multiply, a `bit_length`, a shift and a dict increment; memory grows with the number of
distinct buckets touched (a few hundred for real latency distributions), never with the sample count.

Precision guarantee (what the tests check): for any quantile q, `quantile(q)` lies within
`RELATIVE_PRECISION` (1/256, under 0.4 %) of the nearest-rank sample (the ``ceil(q·n)``-th smallest
value recorded), plus one `unit` (which covers the exact linear range below `2**SUB_BITS` units).
`max` and `min` are exact.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["RELATIVE_PRECISION", "SUB_BITS", "Histogram"]

SUB_BITS = 8
"""Sub-bucket resolution: 2**8 = 256 linear buckets before the first shift, 128 per octave after."""

_SUB = 1 << SUB_BITS
_HALF = _SUB >> 1
RELATIVE_PRECISION = 1.0 / _SUB
"""Worst-case relative error of a reported quantile (1/256 ≈ 0.39 %): a bucket is at most 1/128 of its
lower bound wide and a quantile reports the bucket's midpoint (clamped to the exact min/max)."""


def _index(units: int) -> int:
    if units < _SUB:
        return units
    shift = units.bit_length() - SUB_BITS
    return _SUB + (shift - 1) * _HALF + ((units >> shift) - _HALF)


def _bounds(index: int) -> tuple[int, int]:
    """[low, high) in units of the bucket with this index."""
    if index < _SUB:
        return index, index + 1
    shift, sub = divmod(index - _SUB, _HALF)
    shift += 1
    low = (sub + _HALF) << shift
    return low, low + (1 << shift)


class Histogram:
    """Counts of values (ms) in log-linear buckets; `record`, `merge`, `quantile`, `max`, `min`, `mean`."""

    __slots__ = ("_counts", "_max", "_min", "_sum", "count", "unit")

    def __init__(self, unit: float = 0.001) -> None:
        if not unit > 0:
            raise ValueError("unit must be positive")
        self.unit = unit
        self._counts: dict[int, int] = {}
        self.count = 0
        self._sum = 0.0
        self._max = -math.inf
        self._min = math.inf

    # ------------------------------------------------------------------------------------- recording

    def record(self, value: float, count: int = 1) -> None:
        """Add `value` (ms) `count` times. Negative values count as 0; NaN and infinities are ignored."""
        if not value >= 0.0:  # NaN or negative
            if math.isnan(value):
                return
            value = 0.0
        if value == math.inf:
            return
        idx = _index(int(value / self.unit))
        counts = self._counts
        counts[idx] = counts.get(idx, 0) + count
        self.count += count
        self._sum += value * count
        # plain comparisons: this is the hot path, and max()/min() calls cost more
        if value > self._max:  # noqa: PLR1730
            self._max = value
        if value < self._min:  # noqa: PLR1730
            self._min = value

    def record_many(self, values: Iterable[float]) -> None:
        for value in values:
            self.record(value)

    def merge(self, other: Histogram) -> None:
        """Add every count of `other` (which must use the same unit) to this histogram."""
        if other.unit != self.unit:
            raise ValueError(f"cannot merge histograms with units {self.unit} and {other.unit}")
        counts = self._counts
        for idx, n in other._counts.items():
            counts[idx] = counts.get(idx, 0) + n
        self.count += other.count
        self._sum += other._sum
        self._max = max(self._max, other._max)
        self._min = min(self._min, other._min)

    def clear(self) -> None:
        self._counts.clear()
        self.count = 0
        self._sum = 0.0
        self._max = -math.inf
        self._min = math.inf

    # ---------------------------------------------------------------------------------------- reading

    @property
    def max(self) -> float:
        return self._max if self.count else 0.0

    @property
    def min(self) -> float:
        return self._min if self.count else 0.0

    @property
    def mean(self) -> float:
        return self._sum / self.count if self.count else 0.0

    def quantile(self, q: float) -> float:
        """The value at quantile `q` in [0, 1] by nearest rank; 0.0 when empty."""
        return self.quantiles((q,))[0]

    def quantiles(self, qs: Iterable[float]) -> list[float]:
        """Several quantiles in one pass over the buckets (results in the order of `qs`)."""
        wanted = list(qs)
        if not self.count:
            return [0.0 for _ in wanted]
        for q in wanted:
            if not 0.0 <= q <= 1.0:
                raise ValueError(f"quantile {q} is outside [0, 1]")
        ranks = sorted((max(1, math.ceil(q * self.count)), i) for i, q in enumerate(wanted))
        out = [0.0] * len(wanted)
        seen = 0
        pos = 0
        for idx in sorted(self._counts):
            seen += self._counts[idx]
            while pos < len(ranks) and ranks[pos][0] <= seen:
                rank, i = ranks[pos]
                # The extremes are known exactly.
                if rank == self.count:
                    out[i] = self._max
                elif rank == 1:
                    out[i] = self._min
                else:
                    out[i] = self._value_of(idx)
                pos += 1
            if pos == len(ranks):
                break
        return out

    def _value_of(self, index: int) -> float:
        low, high = _bounds(index)
        mid = low * self.unit if high - low == 1 else (low + high) / 2.0 * self.unit
        return min(max(mid, self._min), self._max)

    def buckets(self) -> Iterator[tuple[float, float, int]]:
        """(low_ms, high_ms, count) of every non-empty bucket, in ascending order."""
        for idx in sorted(self._counts):
            low, high = _bounds(idx)
            yield low * self.unit, high * self.unit, self._counts[idx]

    def to_dict(self) -> dict[str, Any]:
        """A compact, JSON-able form (bucket index → count) that `from_dict` restores exactly."""
        return {
            "unit": self.unit,
            "count": self.count,
            "sum": self._sum,
            "min": self.min,
            "max": self.max,
            "buckets": {str(k): v for k, v in sorted(self._counts.items())},
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Histogram:
        hist = cls(float(doc.get("unit", 0.001)))
        hist._counts = {int(k): int(v) for k, v in doc.get("buckets", {}).items()}
        hist.count = int(doc.get("count", sum(hist._counts.values())))
        hist._sum = float(doc.get("sum", 0.0))
        if hist.count:
            hist._min = float(doc.get("min", 0.0))
            hist._max = float(doc.get("max", 0.0))
        return hist

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"Histogram(count={self.count}, p50={self.quantile(0.5):.3f}, max={self.max:.3f})"
