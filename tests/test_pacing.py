"""The one token bucket, on a fake clock: its burst, its rate, its capacity, a debt."""

from __future__ import annotations

import threading

import pytest

from edgeinfer.pacing import TokenBucket
from tests.helpers.clock import FakeTime


def _most_in_one_second(stamps: list[float]) -> int:
    stamps = sorted(stamps)
    best, lo = 0, 0
    for hi, t in enumerate(stamps):
        while t - stamps[lo] >= 1.0 - 1e-9:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def test_a_full_bucket_lets_its_burst_through_then_the_rate() -> None:
    ft = FakeTime()
    bucket = TokenBucket(10, 3, clock=ft.clock, sleep=ft.sleep)
    stamps = []
    for _ in range(23):
        bucket.take(1)
        stamps.append(ft.t)
    assert stamps[:3] == [1000.0] * 3  # the burst, no waiting
    assert ft.t == pytest.approx(1002.0)  # then 20 more at 10 a second
    assert _most_in_one_second(stamps) <= 10 + 3


def test_a_bucket_refills_while_idle_but_never_past_its_capacity() -> None:
    ft = FakeTime()
    bucket = TokenBucket(10, 5, clock=ft.clock, sleep=ft.sleep)
    for _ in range(5):
        bucket.take(1)
    ft.t += 60  # a long idle spell fills it to its capacity, not 600
    for _ in range(5):
        assert bucket.take(1) == 0
    assert bucket.take(1) == pytest.approx(0.1)


def test_a_message_bigger_than_the_bucket_passes_when_full_and_leaves_a_debt() -> None:
    ft = FakeTime()
    bucket = TokenBucket(1000, 500, clock=ft.clock, sleep=ft.sleep)
    assert bucket.take(2000) == 0  # full: it passes at once rather than never
    waited = bucket.take(100)  # the debt (1500) and this one (100) are paid at the rate
    assert waited == pytest.approx(1.6)


def test_bad_bucket_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        TokenBucket(0, 1)


def test_a_byte_rate_of_one_second_burst_paces_a_stream_of_chunks() -> None:
    ft = FakeTime()
    bucket = TokenBucket(1000, 1000, clock=ft.clock, sleep=ft.sleep)
    for _ in range(10):
        bucket.take(500)
    # a second's burst, then the rate: 5000 bytes take 4 s
    assert sum(ft.sleeps) == pytest.approx(4.0)


def test_a_cancelled_take_ends_its_wait_and_takes_nothing() -> None:
    bucket = TokenBucket(1, 1)
    assert bucket.take_unless(1000, threading.Event())  # a full bucket lets it pass, leaving a long debt
    cancel = threading.Event()
    outcome: list[bool] = []
    waiter = threading.Thread(target=lambda: outcome.append(bucket.take_unless(1, cancel)), daemon=True)
    waiter.start()
    cancel.set()
    waiter.join(30)  # a bound, not a measurement: the debt alone would take far longer
    assert outcome == [False]
    assert bucket._tokens < 0  # still the debt: nothing was taken by the cancelled wait


def test_take_unless_takes_like_take_when_not_cancelled() -> None:
    bucket = TokenBucket(1000, 3)
    cancel = threading.Event()
    assert all(bucket.take_unless(1, cancel) for _ in range(5))
