"""A source's counters reach the telemetry window: runner → timing batch on the bus → window."""

from __future__ import annotations

from edgeinfer.messages import TIMINGS_TOPIC, TelemetryWindow, TimingBatch
from edgeinfer.runtime.timings import TimingPublisher
from edgeinfer.telemetry.window import WindowAggregator
from edgeinfer.transport import MemoryBus


def test_source_counts_travel_in_timing_batches_and_sum_in_the_window() -> None:
    bus = MemoryBus()
    timings = TimingPublisher(bus, "t")
    timings.add_source("gate", {"served": 3, "dropped": 1})
    timings.add_source("dock", {"reconnects": 1, "outage_ms": 2500})
    assert timings.flush() == 0  # no request records, and still published
    timings.add_source("gate", {"served": 2, "outage_ms": 100})
    timings.flush()
    aggregator = WindowAggregator("t")
    payloads = [m.payload for m in bus.messages_on(TIMINGS_TOPIC)]
    assert len(payloads) == 2
    assert TimingBatch.parse(payloads[0]).sources == {
        "gate": {"served": 3, "dropped": 1},
        "dock": {"reconnects": 1, "outage_ms": 2500},
    }
    for payload in payloads:
        assert aggregator.add_payload(payload)
    window = aggregator.flush()
    assert window.sources == {
        "dock": {"outage_ms": 2500, "reconnects": 1},
        "gate": {"dropped": 1, "outage_ms": 100, "served": 5},
    }
    assert TelemetryWindow.from_dict(window.to_dict()).sources == window.sources


def test_what_does_not_read_as_counts_is_left_out() -> None:
    batch = TimingBatch.parse(b'{"records": [], "sources": {"a": {"served": -1, "dropped": 2}, "b": 3}}')
    assert batch.sources == {"a": {"dropped": 2}}
    assert TimingBatch.parse(b'{"records": []}').sources == {}
