"""The timing publisher: batches of at most `max_records`, each under nucleus lite's IPC message cap."""

from __future__ import annotations

import base64
import json

import pytest

from edgeinfer.messages import (
    IPC_MAX_BYTES,
    TIMED_DETECTIONS,
    TIMINGS_TOPIC,
    ErrorCode,
    Latency,
    ModelRef,
    Prediction,
    TimingBatch,
    TimingRecord,
)
from edgeinfer.runtime.config import TimingsConfig
from edgeinfer.runtime.timings import BATCH_MAX_BYTES, TimingPublisher
from edgeinfer.transport import MemoryBus


def _worst(i: int) -> TimingRecord:
    """A record as large as the runtime makes them: the longest id a request may have, a detector's
    most confident detections with long labels, every flag and field set."""
    model = ModelRef("a-detector-with-a-rather-long-name", f"10.20.{i % 3}", "int8-static")
    top = tuple(
        Prediction(i * TIMED_DETECTIONS + k, "x" * 80 + str(k), 0.123456) for k in range(TIMED_DETECTIONS)
    )
    return TimingRecord(
        id=f"{i:04d}" + "r" * 252,
        status="error" if i % 2 else "ok",
        latency_ms=Latency(1.234567, 22.345678, 333.456789, 4.567891, 361.604925),
        batch_size=32,
        provider="TensorrtExecutionProvider",
        placement="cloud",
        code=ErrorCode.DEADLINE_EXCEEDED if i % 2 else None,
        offloaded=True,
        cascaded=True,
        queue_depth=123456,
        end=1_800_000_000.123456,
        model=model,
        top=top,
        detector=True,
    )


def _sent(bus: MemoryBus) -> list[bytes]:
    return [m.payload for m in bus.published if m.topic == TIMINGS_TOPIC]


@pytest.mark.parametrize("cap", [TimingsConfig().max_records, 1000])  # the default, and the most allowed
def test_a_full_batch_of_the_largest_records_stays_under_the_ipc_cap(cap: int) -> None:
    bus = MemoryBus()
    timings = TimingPublisher(bus, "a-thing-name-" + "t" * 115, max_records=cap)
    for i in range(cap):
        timings.record(_worst(i))
    for _ in range(cap * 4):
        timings.execution(32)
    assert timings.flush() == cap
    payloads = _sent(bus)
    assert max(len(p) for p in payloads) <= BATCH_MAX_BYTES < IPC_MAX_BYTES
    # As the IPC bus sends it: a binary message, base64 in the frame's JSON, with a topic and headers.
    framed = max(len(base64.b64encode(p)) + len(TIMINGS_TOPIC) + 500 for p in payloads)
    assert framed <= IPC_MAX_BYTES
    batches = [TimingBatch.parse(p) for p in payloads]
    back = [r for b in batches for r in b.records]
    assert [r.id for r in back] == [_worst(i).id for i in range(cap)]  # every record, in order
    assert back[5].model == _worst(5).model
    assert [p.index for p in back[5].top] == [p.index for p in _worst(5).top]
    assert sum(len(b.executions) for b in batches) == cap * 4  # the executions go once


def test_a_full_batch_of_usual_records_goes_in_two_messages_at_most() -> None:
    bus = MemoryBus()
    timings = TimingPublisher(bus, "dev", max_records=32)
    model = ModelRef("resnet50", "1.0.0", "int8")
    for i in range(32):
        timings.record(
            TimingRecord(
                f"req-{i}",
                "ok",
                Latency(1, 2, 3, 4, 10),
                provider="CPUExecutionProvider",
                model=model,
                top=(Prediction(i, f"class {i}", 0.5),),
            )
        )
    timings.flush()
    payloads = _sent(bus)
    assert len(payloads) <= 2  # split only as far as the IPC message needs
    ids = [r["id"] for p in payloads for r in json.loads(p)["records"]]
    assert ids == [f"req-{i}" for i in range(32)]


def test_capture_counts_go_in_a_batch_of_their_own_when_no_request_comes() -> None:
    bus = MemoryBus()
    pub = TimingPublisher(bus, "dev", flush_interval_ms=1)
    pub.add_capture({"uploaded": 1})
    pub.add_capture({"uploaded": 2, "upload_failures": 1})
    assert pub.due(pub.clock() + 1)  # counts alone schedule a flush
    assert pub.flush() == 0  # no records, but a batch
    (payload,) = _sent(bus)
    batch = TimingBatch.parse(payload)
    assert batch.records == []
    assert batch.capture == {"uploaded": 3, "upload_failures": 1}
    assert pub.flush() == 0
    assert len(_sent(bus)) == 1


def test_capture_counts_ride_with_the_first_of_split_batches_only() -> None:
    bus = MemoryBus()
    pub = TimingPublisher(bus, "dev", max_records=4)
    for i in range(12):
        pub.record(_worst(i))
    pub.add_capture({"chosen": 5})
    pub.flush()
    batches = [TimingBatch.parse(p) for p in _sent(bus)]
    assert len(batches) > 1
    assert sum(b.capture.get("chosen", 0) for b in batches) == 5
