"""Waiting on a condition that another thread or process makes true, polling, without a fixed sleep."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["eventually", "wait_for"]


def wait_for(predicate: Callable[[], bool], timeout: float = 30.0, interval: float = 0.01) -> bool:
    """True as soon as `predicate()` holds; False when `timeout` seconds pass first (asked once more then)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def eventually(
    predicate: Callable[[], bool],
    timeout: float = 30.0,
    what: str = "the condition",
    detail: Callable[[], str] | None = None,
) -> None:
    """Fail the test unless `predicate()` comes to hold within `timeout` seconds; `detail()`, if
    given, is added to the failure (a log's tail, say)."""
    if not wait_for(predicate, timeout):
        more = f"\n{detail()}" if detail is not None else ""
        raise AssertionError(f"{what} did not hold within {timeout:g} s{more}")
