"""The one token bucket: a rate with a burst, for whatever must keep to one (a router connection's
publishes and bytes within IoT Core's limits, capture's uploads beside serving)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["TokenBucket"]

_EPSILON = 1e-9


class TokenBucket:
    """`rate` tokens a second up to `capacity`; `take(n)` waits until it may, then takes `n`
    (`take_unless(n, cancel)` gives up when `cancel` is set).

    Thread-safe. `clock` and `sleep` are injectable so tests run on a fake clock."""

    def __init__(
        self,
        rate: float,
        capacity: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate <= 0 or capacity <= 0:
            raise ValueError(f"a token bucket needs a positive rate and capacity, not {rate} / {capacity}")
        self.rate = float(rate)
        self.capacity = float(capacity)
        self.clock = clock
        self.sleep = sleep
        self._tokens = float(capacity)
        self._stamp = clock()
        self._lock = threading.Lock()

    def _refill(self) -> None:
        now = self.clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    def _shortfall(self, n: float) -> float:
        return max(0.0, min(n, self.capacity) - self._tokens)

    def take(self, n: float) -> float:
        """Wait until `n` tokens (at most a full bucket) are there, take `n`; returns the seconds waited."""
        waited = 0.0
        while True:
            pause = self._take_or_pause(n)
            if pause is None:
                return waited
            self.sleep(pause)
            waited += pause

    def take_unless(self, n: float, cancel: threading.Event) -> bool:
        """`take(n)`, but the wait ends as soon as `cancel` is set: then nothing is taken and False is
        returned. For a thread whose stop must not wait out a long debt (a slow uplink's pacing)."""
        while not cancel.is_set():
            pause = self._take_or_pause(n)
            if pause is None:
                return True
            cancel.wait(pause)
        return False

    def _take_or_pause(self, n: float) -> float | None:
        """Take `n` if they are there (None), else the seconds until they will be."""
        with self._lock:
            self._refill()
            short = self._shortfall(n)
            if short <= _EPSILON * max(1.0, n):  # rounding must not leave it waiting for nothing
                self._tokens -= n  # may go below zero: a message over the capacity leaves a debt
                return None
            return short / self.rate
