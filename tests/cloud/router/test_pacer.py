"""The pacer: both buckets of a direction on a fake clock, and the defaults against IoT Core's limits."""

from __future__ import annotations

import pytest

from edgeinfer_cloud.router.pacer import (
    IOT_CORE_BYTES_PER_S,
    IOT_CORE_PUBLISHES_PER_S,
    DirectionLimits,
    Pacer,
    PacingConfig,
)
from tests.helpers.clock import FakeTime


def most_in_any_window(stamps: list[float], window: float = 1.0) -> int:
    stamps = sorted(stamps)
    best, lo = 0, 0
    for hi, t in enumerate(stamps):
        while t - stamps[lo] >= window - 1e-9:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def test_pacer_holds_both_the_count_and_the_byte_rate() -> None:
    ft = FakeTime()
    pacer = Pacer(DirectionLimits(50, 5, 10_000, 2_000), clock=ft.clock, sleep=ft.sleep)
    stamps: list[float] = []
    sizes: list[int] = []
    for i in range(300):
        size = 100 if i % 3 else 1_500  # small ones bound by count, big ones by bytes
        pacer.admit(size)
        stamps.append(ft.t)
        sizes.append(size)
    start = stamps[0]
    for k in range(int(stamps[-1] - start)):  # every one-second window from the start
        inside = [i for i, t in enumerate(stamps) if start + k <= t < start + k + 1]
        assert len(inside) <= 50 + 5
        assert sum(sizes[i] for i in inside) <= 10_000 + 2_000 + 1_500  # rate + burst (+ one debt)
    assert most_in_any_window(stamps) <= 55
    assert pacer.messages == 300
    assert pacer.total_bytes == sum(sizes)
    assert pacer.waited_s == pytest.approx(stamps[-1] - start)


def test_the_defaults_stay_under_iot_cores_limits_for_a_25_kb_offload() -> None:
    pacing = PacingConfig()
    pacing.check()
    out, inb = pacing.outbound, pacing.inbound
    assert out.publishes_per_s + out.publish_burst < IOT_CORE_PUBLISHES_PER_S
    assert out.bytes_per_s + out.byte_burst < IOT_CORE_BYTES_PER_S
    # inbound the broker may also send up to Receive Maximum messages not yet paid for
    offload = 25 * 1024
    assert pacing.receive_maximum + inb.publishes_per_s + inb.publish_burst < IOT_CORE_PUBLISHES_PER_S
    assert pacing.receive_maximum * offload + inb.bytes_per_s + inb.byte_burst < IOT_CORE_BYTES_PER_S


@pytest.mark.parametrize(
    ("pacing", "message"),
    [
        (PacingConfig(outbound=DirectionLimits(95, 10, 1000, 1000)), "exceeds IoT Core's 100 publishes"),
        (PacingConfig(inbound=DirectionLimits(10, 1, 500 * 1024, 64 * 1024)), "exceeds IoT Core's 512 KB/s"),
        (PacingConfig(inbound=DirectionLimits(10, 0, 1000, 1000)), "must be positive"),
        (PacingConfig(receive_maximum=101), "receive maximum must be 1..100"),
    ],
)
def test_limits_iot_core_would_throttle_are_refused(pacing: PacingConfig, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        pacing.check()


def test_scaled_limits_scale_every_rate_and_burst() -> None:
    small = PacingConfig().scaled(0.1, receive_maximum=1)
    assert small.outbound.publishes_per_s == pytest.approx(8)
    assert small.inbound.bytes_per_s == pytest.approx(36 * 1024)
    assert small.inbound.publish_burst == 1  # never below one message
    assert small.receive_maximum == 1
    small.check()
