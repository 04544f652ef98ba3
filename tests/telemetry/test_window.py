"""Windows: percentiles match the raw timings, counters add up, windows close on the injected clock."""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgeinfer.messages import (
    ErrorCode,
    Latency,
    ModelRef,
    Prediction,
    TelemetryWindow,
    TimingBatch,
    TimingRecord,
)
from edgeinfer.telemetry.histogram import RELATIVE_PRECISION
from edgeinfer.telemetry.window import (
    DEFAULT_LOW_CONFIDENCE,
    MAX_CLASSES,
    MAX_MODELS,
    OTHER,
    SCORE_BINS,
    STAGES,
    WindowAggregator,
)
from tests.helpers.clock import FakeClock
from tests.helpers.telemetry import make_record


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def within(got: float, want: float) -> bool:
    return abs(got - want) <= RELATIVE_PRECISION * abs(want) + 0.001


def test_no_window_before_its_end(clock: FakeClock) -> None:
    agg = WindowAggregator("dev", window_s=10, clock=clock)
    clock.advance(9.99)
    assert agg.poll() == []
    clock.advance(0.01)
    (window,) = agg.poll()
    assert window.seq == 0
    assert window.window_s == 10
    assert window.count == 0
    assert agg.poll() == []


def test_percentiles_match_raw_timings_through_the_wire(clock: FakeClock) -> None:
    rng = random.Random(11)
    agg = WindowAggregator("dev", window_s=10, clock=clock)
    raw: list[TimingRecord] = []
    for _ in range(40):
        records = [make_record(rng) for _ in range(50)]
        # what the telemetry component sees is the JSON the runtime published
        batch = TimingBatch.parse(TimingBatch("dev", records, executions=[8] * 6 + [2]).to_json())
        raw += batch.records
        assert agg.add_payload(TimingBatch("dev", records, executions=[8] * 6 + [2]).to_json())
        clock.advance(0.2)
    clock.advance(2.0)
    (window,) = agg.poll()
    assert window.count == len(raw) == 2000
    assert window.throughput_rps == pytest.approx(200.0)
    for stage in STAGES:
        values = [getattr(r.latency_ms, stage) for r in raw]
        q = window.latency_ms[stage]
        for name, quantile in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
            assert within(getattr(q, name), nearest_rank(values, quantile)), (stage, name)
        assert q.max == max(values)
    assert window.batch == {
        "executions": 280,
        "inferences": 2000,
        "mean_size": pytest.approx(2000 / 280, abs=1e-3),
    }
    depths = [r.queue_depth for r in raw]
    assert window.queue_depth["max"] == max(depths)
    assert window.queue_depth["mean"] == pytest.approx(sum(depths) / len(depths), abs=1e-3)
    assert window.provider == "CPUExecutionProvider"


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(min_value=0, max_value=5000, allow_nan=False),
            st.floats(min_value=0, max_value=5000, allow_nan=False),
        ),
        min_size=1,
        max_size=200,
    )
)
def test_any_timings_match_within_precision(pairs: list[tuple[float, float]]) -> None:
    clock = FakeClock()
    agg = WindowAggregator("dev", window_s=1, clock=clock)
    records = [TimingRecord(None, "ok", Latency(queue=q, inference=i, total=q + i)) for q, i in pairs]
    batch = TimingBatch.parse(TimingBatch("dev", records).to_json())
    agg.add(batch)
    clock.advance(1)
    (window,) = agg.poll()
    for stage in ("queue", "inference", "total"):
        values = [getattr(r.latency_ms, stage) for r in batch.records]
        for name, quantile in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
            assert within(getattr(window.latency_ms[stage], name), nearest_rank(values, quantile))
        assert window.latency_ms[stage].max == max(values)


def test_counters_errors_flags_and_dropped(clock: FakeClock) -> None:
    rng = random.Random(5)
    agg = WindowAggregator("dev", window_s=10, clock=clock)
    records = (
        [make_record(rng) for _ in range(10)]
        + [make_record(rng, status="error", code=ErrorCode.BAD_IMAGE) for _ in range(3)]
        + [make_record(rng, status="error", code=ErrorCode.DEADLINE_EXCEEDED)]
        + [make_record(rng, status="error")]  # no code: counted as INTERNAL
        + [make_record(rng, offloaded=True, provider="cloud") for _ in range(4)]
        + [make_record(rng, cascaded=True, offloaded=True) for _ in range(2)]
        + [make_record(rng, dropped=True) for _ in range(7)]
    )
    agg.add(TimingBatch("dev", records, executions=[4, 4, 0, 2]))
    clock.advance(10)
    (window,) = agg.poll()
    assert window.count == 10 + 3 + 1 + 1 + 4 + 2
    assert window.errors == {"BAD_IMAGE": 3, "DEADLINE_EXCEEDED": 1, "INTERNAL": 1}
    assert window.offloaded == 6
    assert window.cascaded == 2
    assert window.dropped == 7
    assert window.batch["executions"] == 3  # an empty execution is no execution
    assert window.batch["inferences"] == 10
    assert window.provider == "CPUExecutionProvider"


def test_windows_are_independent_and_seq_continues(clock: FakeClock) -> None:
    rng = random.Random(2)
    agg = WindowAggregator("dev", window_s=5, clock=clock, first_seq=41)
    seqs = []
    for n in range(4):
        agg.add(TimingBatch("dev", [make_record(rng) for _ in range(n)]))
        clock.advance(5)
        (window,) = agg.poll()
        assert window.count == n
        seqs.append(window.seq)
    assert seqs == [41, 42, 43, 44]


def test_a_stalled_loop_skips_ahead_instead_of_bursting(clock: FakeClock) -> None:
    agg = WindowAggregator("dev", window_s=10, clock=clock)
    agg.add(TimingBatch("dev", [make_record(random.Random(1)) for _ in range(19)]))
    clock.advance(95)
    (stalled,) = agg.poll()
    assert stalled.window_s == 95  # it spans the stall, so throughput is not overstated
    assert stalled.throughput_rps == pytest.approx(0.2)
    assert agg.poll() == []
    clock.advance(10)
    (window,) = agg.poll()
    assert window.seq == 1


def test_window_length_change_applies_from_the_next_window(clock: FakeClock) -> None:
    agg = WindowAggregator("dev", window_s=10, clock=clock)
    agg.set_window(2)
    clock.advance(10)
    assert agg.poll()[0].window_s == 10
    clock.advance(2)
    assert agg.poll()[0].window_s == 2
    with pytest.raises(ValueError, match="positive"):
        agg.set_window(0)


def test_system_figures_are_attached_and_failures_tolerated(clock: FakeClock) -> None:
    agg = WindowAggregator("dev", window_s=1, clock=clock, system=lambda: {"cpu_percent": 12.5})
    clock.advance(1)
    assert agg.poll()[0].system == {"cpu_percent": 12.5}

    def broken() -> dict[str, float]:
        raise OSError("no /proc")

    agg = WindowAggregator("dev", window_s=1, clock=clock, system=broken)
    clock.advance(1)
    assert agg.poll()[0].system == {}


def test_malformed_payloads_are_counted_not_raised(clock: FakeClock) -> None:
    agg = WindowAggregator("dev", clock=clock)
    assert not agg.add_payload(b"not json")
    assert not agg.add_payload(b'{"records": 3}')
    assert not agg.add_payload(b'{"records": [{"latency_ms": {"total": "x"}}]}')
    assert agg.bad_messages == 3


def test_window_round_trips_through_the_contract(clock: FakeClock) -> None:
    rng = random.Random(9)
    agg = WindowAggregator("dev", window_s=10, clock=clock, wall=lambda: 1.8e9)
    agg.add(TimingBatch("dev", [make_record(rng) for _ in range(100)], executions=[8] * 12 + [4]))
    clock.advance(10)
    (window,) = agg.poll()
    again = TelemetryWindow.from_dict(TelemetryWindow.from_dict(window.to_dict()).to_dict())
    assert again.to_dict() == window.to_dict()
    assert window.timestamp.endswith("Z")


def test_flush_closes_a_short_window(clock: FakeClock) -> None:
    agg = WindowAggregator("dev", window_s=10, clock=clock)
    agg.add(TimingBatch("dev", [make_record(random.Random(1))]))
    clock.advance(2.5)
    window = agg.flush()
    assert window.count == 1
    assert window.window_s == 2.5
    assert window.throughput_rps == pytest.approx(0.4)


# ------------------------------------------------------------------------------------ model quality

V1 = ModelRef("resnet50", "1.0.0", "int8")
V2 = ModelRef("resnet50", "1.1.0", "int8")
CPU = "CPUExecutionProvider"


def answered(model: ModelRef, *top: tuple[int, str, float], detector: bool = False) -> TimingRecord:
    return TimingRecord(
        "r",
        "ok",
        Latency(1, 1, 1, 1, 4),
        provider=CPU,
        model=model,
        top=tuple(Prediction(i, label, score) for i, label, score in top),
        detector=detector,
    )


def window_of(agg: WindowAggregator, clock: FakeClock, *records: TimingRecord) -> TelemetryWindow:
    agg.add_payload(TimingBatch("dev", list(records)).to_json())  # through the wire
    clock.advance(agg.window_s)
    (window,) = agg.poll()
    return window


def test_a_window_counts_each_models_classes_scores_and_low_confidence(clock: FakeClock) -> None:
    agg = WindowAggregator("dev", window_s=1, clock=clock)
    window = window_of(
        agg,
        clock,
        answered(V1, (1, "cat", 0.95)),
        answered(V1, (1, "cat", 0.45)),
        answered(V1, (2, "dog", 1.0)),
        answered(V1),  # an answer without a prediction counts, with no class or score
        TimingRecord("e", "error", Latency(total=1), code=ErrorCode.BAD_IMAGE, model=V1),
        answered(ModelRef("yolo", "3", "int8"), (0, "person", 0.9), (0, "person", 0.2), detector=True),
        answered(ModelRef("yolo", "3", "int8"), (5, "bus", 0.3), (0, "person", 0.1), detector=True),
        answered(ModelRef("yolo", "3", "int8"), detector=True),  # nothing detected: not low confidence
    )
    resnet, yolo = window.models
    assert (resnet.name, resnet.version, resnet.variant, resnet.provider) == (
        "resnet50",
        "1.0.0",
        "int8",
        CPU,
    )
    assert (resnet.count, resnet.low_confidence) == (4, 1)  # the error is not an answer of the model
    assert resnet.classes == {"cat": 2, "dog": 1}
    assert resnet.bins == list(SCORE_BINS)
    assert resnet.counts == [0, 0, 0, 0, 1, 0, 0, 0, 0, 2]  # 1.0 falls in the last bin
    assert (yolo.count, yolo.low_confidence, yolo.low_confidence_share) == (3, 1, 1 / 3)
    assert yolo.classes == {"person": 3, "bus": 1}
    assert sum(yolo.counts) == 4  # every detection's score


def test_the_low_confidence_threshold_is_the_aggregators(clock: FakeClock) -> None:
    agg = WindowAggregator("dev", window_s=1, clock=clock, low_confidence=0.2)
    records = [answered(V1, (1, "cat", s)) for s in (0.1, 0.3, 0.6)]
    assert window_of(agg, clock, *records).models[0].low_confidence == 1
    agg.low_confidence = DEFAULT_LOW_CONFIDENCE
    assert window_of(agg, clock, *records).models[0].low_confidence == 2


def test_a_model_update_shows_in_the_next_window(clock: FakeClock) -> None:
    agg = WindowAggregator("dev", window_s=1, clock=clock)
    assert [m.label for m in window_of(agg, clock, answered(V1, (1, "cat", 0.9))).models] == [
        "resnet50 1.0.0"
    ]
    # the update lands mid-window: both versions answered in it, the newer alone after
    both = window_of(agg, clock, answered(V1, (1, "cat", 0.9)), *[answered(V2, (1, "cat", 0.9))] * 2)
    assert [(m.version, m.count) for m in both.models] == [("1.1.0", 2), ("1.0.0", 1)]
    assert [m.version for m in window_of(agg, clock, answered(V2, (1, "cat", 0.9))).models] == ["1.1.0"]
    assert window_of(agg, clock).models == []  # no answers, no model figures


def test_the_class_table_and_the_models_are_capped(clock: FakeClock) -> None:
    agg = WindowAggregator("dev", window_s=1, clock=clock)
    records = [answered(V1, (i, f"class {i}", 0.9)) for i in range(30) for _ in range(30 - i)]
    records += [answered(ModelRef(f"m{k}", "1", "fp32"), (0, "a", 0.9)) for k in range(MAX_MODELS + 3)]
    window = window_of(agg, clock, *records)
    assert len(window.models) == MAX_MODELS
    top = window.models[0]
    assert list(top.classes)[:MAX_CLASSES] == [f"class {i}" for i in range(MAX_CLASSES)]
    assert top.classes[OTHER] == sum(30 - i for i in range(MAX_CLASSES, 30))
    assert sum(top.classes.values()) == top.count


def test_a_window_of_many_models_and_classes_stays_well_under_the_ipc_cap(clock: FakeClock) -> None:
    system = {
        "cpu_percent": 99.9,
        "cpu_count": 64,
        "load_1m": 12.34,
        "mem_total_mb": 131072.0,
        "mem_available_mb": 65536.0,
        "processes": 12,
        "rss_mb": 4096.0,
        "process_cpu_percent": 800.0,
        "gpus": [
            {"index": i, "name": "NVIDIA H200", "util_percent": 99, "mem_used_mb": 140000.0, "temp_c": 80}
            for i in range(2)
        ],
        "gpu_util_percent": 99,
        "gpu_mem_used_mb": 280000.0,
        "spool": {"pending": 8640, "dropped": 123456, "bytes": 50_000_000},
    }
    agg = WindowAggregator("t" * 128, window_s=1, clock=clock, system=lambda: system, first_seq=10**9)
    records = []
    for k in range(MAX_MODELS + 4):
        model = ModelRef(f"a-model-name-of-some-length-{k}", f"10.20.30-rc{k}", "int8-static")
        for i in range(200):
            label = f"{i:03d} " + "a label as long as imagenet's longest ones are, or longer"
            top = tuple(Prediction(i * 10 + j, label + str(j), i / 200) for j in range(10))
            records.append(
                TimingRecord(
                    "r",
                    "ok",
                    Latency(1, 2, 3, 4, 10),
                    provider="TensorrtExecutionProvider",
                    model=model,
                    top=top,
                    detector=True,
                )
            )
        records.append(TimingRecord("e", "error", Latency(), code=ErrorCode(list(ErrorCode)[k % 6])))
    for start in range(0, len(records), 32):
        agg.add_payload(TimingBatch("dev", records[start : start + 32]).to_json())
    clock.advance(1)
    (window,) = agg.poll()
    assert len(window.models) == MAX_MODELS
    assert len(window.to_json()) < 9000


def test_what_fleet_and_canary_read_of_a_window(clock: FakeClock) -> None:
    from edgeinfer.telemetry.fleet import model_label
    from edgeinfer_cloud.canary.windows import low_confidence, read_window

    agg = WindowAggregator("dev", window_s=1, clock=clock)
    window = window_of(
        agg,
        clock,
        *[answered(V2, (1, "cat", 0.3))] * 3,
        *[answered(V2, (1, "cat", 0.9))] * 5,
        answered(ModelRef("yolo", "3", "int8"), (0, "person", 0.9), detector=True),
    )
    doc = json.loads(window.to_json())
    assert model_label(doc) == "resnet50 1.1.0, yolo 3"
    assert low_confidence(doc) == (3, 9)
    seen = read_window(window.to_json())
    assert seen is not None
    assert seen.low_confidence == (3, 9)


def test_capture_counters_are_summed_per_window_and_survive_the_wire(clock: FakeClock) -> None:
    agg = WindowAggregator("dev", window_s=10, clock=clock)
    assert agg.add_payload(TimingBatch("dev", [], capture={"chosen": 2, "spooled": 2}).to_json())
    assert agg.add_payload(TimingBatch("dev", [], capture={"uploaded": 1, "chosen": 1}).to_json())
    # a malformed count (negative, not a number) is left out, the rest is counted
    assert agg.add_payload(b'{"thing":"dev","records":[],"capture":{"chosen":-4,"spooled":"x","busy":1}}')
    clock.advance(10)
    (window,) = agg.poll()
    assert window.capture == {"busy": 1, "chosen": 3, "spooled": 2, "uploaded": 1}
    assert TelemetryWindow.from_dict(json.loads(window.to_json())).capture == window.capture
    clock.advance(10)
    (quiet,) = agg.poll()
    assert quiet.capture == {}
    assert "capture" not in quiet.to_dict()
