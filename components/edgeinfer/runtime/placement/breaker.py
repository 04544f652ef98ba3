"""The circuit breaker in front of the cloud.

Consecutive cloud failures (timeouts, INTERNAL / OVERLOADED answers, failed publishes) open the
breaker — a timeout only when no answer at all came from the cloud since that offload was sent (the
cloud is then slow, not down: counted as `cloud_slow`, left to the latency model and the limit; at
1.5x the breaker had opened 7-32 times in 10 s, each time closed by the next late answer): no
offloading for `breaker_cooldown_s`; then one probe request goes out (half-open). Its success closes
the breaker; its failure opens it again with a doubled cooldown (up to a maximum).
An answer that comes after its request was served locally is not forwarded, but it proves the cloud
is up (the breaker closes) and its round trip teaches the latency model that the cloud is slow — so
a slow cloud stops being chosen by prediction, and only a dead one is kept out by the breaker.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable

__all__ = ["BreakerState", "CircuitBreaker"]


class BreakerState(str, enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    def __init__(
        self,
        failures: int = 3,
        cooldown_s: float = 2.0,
        max_cooldown_s: float = 30.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.threshold = failures
        self.base_cooldown_s = cooldown_s
        self.max_cooldown_s = max_cooldown_s
        self.clock = clock
        self.state = BreakerState.CLOSED
        self.consecutive_failures = 0
        self.cooldown_s = cooldown_s
        self.opened_at = 0.0
        self.opened_count = 0
        self._probe_out = False

    def available(self) -> bool:
        """Would `allow()` say yes? (Does not take the half-open probe.)"""
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.OPEN:
            return self.clock() - self.opened_at >= self.cooldown_s
        return not self._probe_out

    def allow(self) -> bool:
        """May a request go to the cloud now? In half-open state exactly one probe is let through."""
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.OPEN:
            if self.clock() - self.opened_at < self.cooldown_s:
                return False
            self.state = BreakerState.HALF_OPEN
            self._probe_out = False
        if self._probe_out:
            return False
        self._probe_out = True
        return True

    def record_success(self) -> None:
        self.consecutive_failures = 0
        if self.state is not BreakerState.CLOSED:
            self.state = BreakerState.CLOSED
            self.cooldown_s = self.base_cooldown_s
            self._probe_out = False

    def record_failure(self) -> None:
        self.consecutive_failures += 1
        if self.state is BreakerState.HALF_OPEN:
            self.cooldown_s = min(self.max_cooldown_s, self.cooldown_s * 2)
            self._open()
        elif self.state is BreakerState.CLOSED and self.consecutive_failures >= self.threshold:
            self._open()

    def _open(self) -> None:
        self.state = BreakerState.OPEN
        self.opened_at = self.clock()
        self.opened_count += 1
        self._probe_out = False
