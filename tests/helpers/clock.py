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


class FakeTime:
    """A clock that only moves when the code under test sleeps (`clock=ft.clock, sleep=ft.sleep`)."""

    def __init__(self) -> None:
        self.t = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += s
