"""The runtime's store and forward: the outbox in the work folder, its counters to the telemetry window."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeinfer.messages import TIMINGS_TOPIC, TimingBatch, result_topic
from edgeinfer.runtime.forward import ForwardConfig, start_forwarding
from edgeinfer.telemetry.window import WindowAggregator
from edgeinfer.transport import MemoryBus
from tests.helpers.clock import FakeClock
from tests.helpers.wait import eventually

THING = "dev1"


def test_results_wait_in_the_work_folder_and_the_counters_reach_the_window(tmp_path: Path) -> None:
    bus = MemoryBus(fail_publish=True)
    forwarder = start_forwarding(bus, THING, str(tmp_path))
    assert forwarder is not None
    assert not (tmp_path / "outbox").exists()  # made only when something must wait
    try:
        for i in range(3):
            forwarder.submit(f'{{"id":"folder-{i}"}}'.encode(), result_topic(THING))
        eventually(lambda: len(list((tmp_path / "outbox").glob("*.msg"))) == 3, 30, "three results kept")
    finally:
        forwarder.stop()
    bus.fail_publish = False
    again = start_forwarding(bus, THING, str(tmp_path))  # a restart sends what waits
    assert again is not None
    try:
        eventually(lambda: len(bus.messages_on(result_topic(THING), "iot")) == 3, 30, "the kept results sent")

        def reported() -> dict[str, int]:
            batches = [TimingBatch.parse(m.payload) for m in bus.messages_on(TIMINGS_TOPIC, "local")]
            return next((b.forward for b in reversed(batches) if b.forward), {})

        final = {"pending": 0, "spooled": 3, "sent": 3, "dropped": 0}
        eventually(
            lambda: reported() == final, 30, "the counters on the timings topic", lambda: str(reported())
        )
    finally:
        again.stop()
    batch = next(TimingBatch.parse(m.payload) for m in reversed(bus.messages_on(TIMINGS_TOPIC, "local")))
    clock = FakeClock()
    agg = WindowAggregator(THING, window_s=1, clock=clock)
    agg.add(batch)
    clock.advance(1)
    (window,) = agg.poll()
    assert window.system["forward"] == final  # what telemetry reports


def test_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="maxMb"):
        start_forwarding(MemoryBus(), THING, "/nonexistent", ForwardConfig(max_mb=0))
