"""A clock the test moves by hand (the code under test takes `clock=` instead of reading time)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FakeClock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
