"""The answer layer: exactly once, late and too-large substitutions, the format, publishing, records."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from edgeinfer.messages import (
    IPC_MAX_BYTES,
    TIMED_DETECTIONS,
    TIMINGS_TOPIC,
    Box,
    Detection,
    ErrorCode,
    Latency,
    ModelRef,
    Prediction,
    Request,
    Result,
    TimingBatch,
    result_topic,
)
from edgeinfer.runtime.answer import AnswerHook, Answers, Job, Stats
from edgeinfer.runtime.inbound import Refusal, ReplyTarget
from edgeinfer.runtime.ipc_frame import framed_size
from edgeinfer.runtime.timings import TimingPublisher
from edgeinfer.runtime.updates import InFlight
from edgeinfer.transport import MemoryBus, MqttProperties
from tests.runtime.conftest import GuardedBus

THING = "dev1"
DEFAULT = result_topic(THING)
CLASSIC_IPC_MAX = 16 * 1024 * 1024


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Recorder(AnswerHook):
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    def on_answer(self, job: Job, computed: Result, answered: Result) -> None:
        code = answered.error.code.value if answered.error else "ok"
        self.seen.append((job.request.id, computed.status, code))


class Broken(AnswerHook):
    def on_answer(self, job: Job, computed: Result, answered: Result) -> None:
        raise RuntimeError("a hook's bug")


def make(
    bus: MemoryBus | None = None, *, max_ipc_bytes: int = IPC_MAX_BYTES
) -> tuple[Answers, MemoryBus, Clock, Recorder]:
    bus = bus or MemoryBus()
    clock = Clock()
    timings = TimingPublisher(bus, THING, enabled=False, clock=clock, wall=lambda: 1_800_000_000.0)
    answers = Answers(
        bus,
        THING,
        timings=timings,
        inflight=InFlight(),
        stats=Stats(),
        stats_lock=threading.Lock(),
        clock=clock,
        wall=lambda: 1_800_000_000.0,
        max_ipc_bytes=max_ipc_bytes,
    )
    rec = Recorder()
    answers.hooks += [Broken(), rec]
    return answers, bus, clock, rec


def ok(rid: str, n: int = 1) -> Result:
    preds = [Prediction(i, f"class {i}", 0.5) for i in range(n)]
    lat = Latency(queue=1.0, decode=2.0, inference=3.0)
    return Result(
        rid, "ok", "", predictions=preds, model=ModelRef("m", "1", "int8"), batch_size=2, latency_ms=lat
    )


def test_a_job_is_answered_exactly_once_and_leaves_the_in_flight_count() -> None:
    answers, bus, clock, rec = make()
    done: list[int] = []
    job = Job(Request("a"), ReplyTarget(DEFAULT), clock(), counted=True, on_done=lambda: done.append(1))
    answers.inflight.enter()
    clock.now += 0.010
    answers.send(job, ok("a"))
    answers.fail(job, ErrorCode.INTERNAL, "too late to matter")
    assert len(bus.published) == 1
    assert answers.inflight.count == 0
    assert done == [1]
    out = Result.parse(bus.published[0].payload)
    assert out.status == "ok"
    assert abs(out.latency_ms.total - 10.0) < 1e-6
    assert abs(out.latency_ms.postprocess - 4.0) < 1e-6  # what the stages left of the total
    assert out.timestamp
    assert answers.stats.ok == 1
    assert rec.seen == [("a", "ok", "ok")]  # a broken hook does not keep the others from seeing it


def test_a_result_ready_after_its_deadline_is_answered_deadline_exceeded() -> None:
    answers, bus, clock, rec = make()
    job = Job(Request("late"), ReplyTarget(DEFAULT), clock(), deadline=clock() + 0.005)
    clock.now += 0.020
    answers.send(job, ok("late"))
    out = Result.parse(bus.published[0].payload)
    assert out.error is not None
    assert out.error.code is ErrorCode.DEADLINE_EXCEEDED
    assert out.batch_size == 2  # where the time went stays
    assert rec.seen == [("late", "ok", "DEADLINE_EXCEEDED")]
    assert answers.stats.errors == {"DEADLINE_EXCEEDED": 1}


def test_dlr_format_from_the_request_or_the_runtime() -> None:
    answers, bus, clock, _ = make()
    answers.send(Job(Request("d", result_format="dlr"), ReplyTarget(DEFAULT), clock()), ok("d"))
    answers.send(Job(Request("e"), ReplyTarget(DEFAULT), clock()), ok("e"))
    answers.result_format = "dlr"
    answers.send(Job(Request("f"), ReplyTarget(DEFAULT), clock()), ok("f"))
    docs = [json.loads(m.payload) for m in bus.published]
    assert [("inference-results" in d, d["id"]) for d in docs] == [(True, "d"), (False, "e"), (True, "f")]


def test_a_result_iot_core_would_refuse_is_answered_too_large() -> None:
    answers, bus, clock, _ = make(max_ipc_bytes=CLASSIC_IPC_MAX)  # local: a classic-only deployment's
    answers.send(Job(Request("big"), ReplyTarget(DEFAULT, "iot"), clock()), ok("big", n=3000))
    answers.send(Job(Request("local"), ReplyTarget(DEFAULT, "local"), clock()), ok("local", n=3000))
    iot, local = (Result.parse(m.payload) for m in bus.published)
    assert iot.error is not None
    assert iot.error.code is ErrorCode.TOO_LARGE
    assert local.status == "ok"


def detector(rid: str, n: int) -> Result:
    boxes = [Detection(i % 80, f"class {i % 80}", 0.25, Box(1.5, 2.5, 300.5, 400.5)) for i in range(n)]
    return Result(rid, "ok", "", detections=boxes, model=ModelRef("det", "1", "int8"), batch_size=1)


def test_a_result_over_the_ipc_message_cap_is_answered_too_large_once() -> None:
    answers, bus, clock, rec = make()
    assert answers.max_ipc_bytes == IPC_MAX_BYTES
    answers.timings.enabled = True
    answers.send(Job(Request("many"), ReplyTarget(DEFAULT), clock()), detector("many", 300))
    answers.send(Job(Request("few"), ReplyTarget(DEFAULT), clock()), detector("few", 10))
    answers.timings.flush()
    many, few, timing = bus.published
    assert len(many.payload) < 1000  # the error in its place is small
    out = Result.parse(many.payload)
    assert out.error is not None
    assert out.error.code is ErrorCode.TOO_LARGE
    assert "ask for fewer (max_detections / top_k)" in out.error.message
    assert "\n" not in out.error.message
    assert out.model == ModelRef("det", "1", "int8")
    assert Result.parse(few.payload).status == "ok"
    assert framed_size(DEFAULT, len(few.payload)) <= IPC_MAX_BYTES
    assert rec.seen == [("many", "ok", "TOO_LARGE"), ("few", "ok", "ok")]
    assert answers.stats.errors == {"TOO_LARGE": 1}
    assert answers.stats.ok == 1
    records = TimingBatch.parse(timing.payload).records
    assert [(r.id, r.code) for r in records] == [("many", ErrorCode.TOO_LARGE), ("few", None)]


def test_the_ipc_cap_counts_the_reply_topic_and_correlation_data() -> None:
    result = detector("x", 1)
    payload_len = len(result.to_json())
    cap = framed_size(DEFAULT, payload_len + 200)  # room for the timestamp and latency it gets
    answers, bus, clock, _ = make(max_ipc_bytes=cap)
    answers.send(Job(Request("a"), ReplyTarget(DEFAULT), clock()), detector("a", 1))
    props = MqttProperties(correlation_data=bytes(600))
    answers.send(Job(Request("b"), ReplyTarget(DEFAULT, "iot", props), clock()), detector("b", 1))
    a, b = (Result.parse(m.payload) for m in bus.published)
    assert a.status == "ok"
    assert b.error is not None
    assert b.error.code is ErrorCode.TOO_LARGE


def test_raising_the_ipc_cap_lets_a_large_result_through() -> None:
    answers, bus, clock, _ = make()
    answers.max_ipc_bytes = CLASSIC_IPC_MAX  # what a live configuration change does
    answers.send(Job(Request("many"), ReplyTarget(DEFAULT), clock()), detector("many", 300))
    out = Result.parse(bus.published[0].payload)
    assert out.status == "ok"
    assert out.detections is not None
    assert len(out.detections) == 300


def test_a_refusal_is_answered_where_it_says_with_its_correlation_data() -> None:
    answers, bus, clock, rec = make()
    props = MqttProperties(correlation_data=b"c")
    where = ReplyTarget("edgeinfer/dev1/result/app", "iot", props)
    answers.refuse(Refusal(ErrorCode.BAD_REQUEST, "no", "r1", where), clock())
    (msg,) = bus.published
    assert msg.topic == "edgeinfer/dev1/result/app"
    assert msg.properties == props
    assert Result.parse(msg.payload).id == "r1"
    assert rec.seen == [("r1", "error", "BAD_REQUEST")]


def test_a_reply_to_the_nucleus_refuses_is_answered_bad_request_on_the_default_topic() -> None:
    answers, bus, clock, _ = make(GuardedBus())
    answers.send(Job(Request("x"), ReplyTarget("forbidden/x"), clock()), ok("x"))
    (msg,) = bus.published
    assert msg.topic == DEFAULT
    out = Result.parse(msg.payload)
    assert out.error is not None
    assert out.error.code is ErrorCode.BAD_REQUEST
    assert answers.stats.ok == 0
    assert answers.stats.errors == {"BAD_REQUEST": 1}


def test_a_self_test_job_publishes_nothing() -> None:
    answers, bus, clock, rec = make()
    done: list[int] = []
    answers.send(
        Job(Request("s"), ReplyTarget(""), clock(), discard=True, on_done=lambda: done.append(1)), ok("s")
    )
    assert bus.published == []
    assert rec.seen == []
    assert done == [1]


def test_the_timing_record_names_the_model_and_its_top_answer() -> None:
    answers, bus, clock, _ = make()
    answers.timings.enabled = True
    answers.send(Job(Request("c"), ReplyTarget(DEFAULT), clock()), ok("c", n=3))
    boxes = [Detection(i % 4, f"class {i % 4}", s, Box(0, 0, 1, 1)) for i, s in enumerate([0.3, 0.9] * 8)]
    detector = Result("d", "ok", "", model=ModelRef("yolo", "2", "int8"), detections=boxes)
    answers.send(Job(Request("d"), ReplyTarget(DEFAULT), clock()), detector)
    late = Job(Request("late"), ReplyTarget(DEFAULT), clock(), deadline=clock() - 1)
    answers.send(late, ok("late"))
    answers.timings.flush()
    (batch,) = [TimingBatch.parse(m.payload) for m in bus.published if m.topic == TIMINGS_TOPIC]
    classified, detected, refused = batch.records
    assert classified.model == ModelRef("m", "1", "int8")
    assert classified.top == (Prediction(0, "class 0", 0.5),)  # the top-1 only
    assert not classified.detector
    assert detected.model == ModelRef("yolo", "2", "int8")
    assert detected.detector
    assert [p.score for p in detected.top] == [0.9] * 8 + [0.3] * (TIMED_DETECTIONS - 8)  # the most confident
    assert refused.status == "error"
    assert refused.model == ModelRef("m", "1", "int8")  # what would have answered
    assert refused.top == ()  # an error's answer is not the model's


def test_a_sources_iot_results_go_through_the_outbox_and_a_requests_reply_does_not(tmp_path: Path) -> None:
    from edgeinfer.transport.outbox import Forwarder, Outbox, OutboxPublisher
    from tests.helpers.wait import eventually

    answers, bus, clock, _rec = make()
    bus.fail_publish = True  # IoT Core away
    pub = OutboxPublisher(bus, DEFAULT, Outbox(tmp_path), retry_s=0.01, max_retry_s=0.05)
    answers.forward = Forwarder(pub, tick_s=0.01).start()
    try:
        for i in range(3):
            frame = Job(Request(f"folder-{i}"), ReplyTarget(DEFAULT, "iot"), clock(), source="folder")
            answers.send(frame, ok(f"folder-{i}"))
        answers.send(Job(Request("req"), ReplyTarget(DEFAULT, "iot"), clock()), ok("req"))
        answers.send(Job(Request("local"), ReplyTarget(DEFAULT), clock(), source="folder"), ok("local"))
        eventually(lambda: len(pub.outbox) == 3, 30, "the source's IoT results kept")
        assert answers.stats.publish_failures == 2  # the reply and the local result: once, now, as today
        bus.fail_publish = False
        eventually(lambda: len(pub.outbox) == 0, 30, "the kept results sent once IoT Core is back")
    finally:
        answers.forward.stop()
    sent = [Result.parse(m.payload).id for m in bus.messages_on(DEFAULT, "iot")]
    assert sent == ["folder-0", "folder-1", "folder-2"]  # in order; the request's reply is not resent
    assert answers.stats.ok == 5
