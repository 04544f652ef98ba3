"""The one quantile (nearest rank), and the guard that it stays the only one."""

from __future__ import annotations

import math
import re

import pytest

from edgeinfer.stats import percentile, quantile
from edgeinfer.telemetry.histogram import Histogram
from tests.helpers import PROJECT


def test_nearest_rank() -> None:
    assert quantile([5.0, 1.0, 3.0], 0.5) == 3.0
    assert quantile(range(1, 101), 0.99) == 99
    assert quantile(range(1, 101), 1.0) == 100
    assert quantile([7.0], 0.0) == 7.0
    assert percentile(range(1, 101), 99) == 99
    assert percentile([2.0, 4.0], 50) == 2.0  # nearest rank never interpolates


def test_empty_and_out_of_range() -> None:
    assert math.isnan(quantile([], 0.5))
    assert quantile([], 0.5, empty=0.0) == 0.0
    with pytest.raises(ValueError, match="outside"):
        quantile([1.0], 1.5)


def test_histogram_agrees_on_exact_values() -> None:
    hist = Histogram()
    values = [float(v) for v in range(1, 201)]
    for v in values:
        hist.record(v)
    for q in (0.5, 0.9, 0.99):
        assert hist.quantile(q) == pytest.approx(quantile(values, q), rel=0.02)


def test_no_second_quantile_definition() -> None:
    pattern = re.compile(r"^def _?(pct|percentile|quantile)\(", re.M)  # top-level helpers
    found = []
    for root in ("components", "cloud", "bench"):
        for path in (PROJECT / root).rglob("*.py"):
            if path.name != "stats.py" and pattern.search(path.read_text(encoding="utf-8")):
                found.append(str(path.relative_to(PROJECT)))
    assert found == []
