"""The placement policy with a fake clock: predictions, decisions, breaker, exactly one result."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgeinfer.config import ConfigError
from edgeinfer.messages import ErrorCode, Latency, Prediction, Request, Result, error_result
from edgeinfer.runtime.placement import (
    BreakerState,
    CircuitBreaker,
    CloudLatencyModel,
    LinearFit,
    OffloadConfig,
    OffloadPolicy,
    ServiceTimeModel,
)
from tests.helpers.clock import FakeClock


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, ms: float) -> None:
        self.t += ms / 1000.0


def req(rid: str = "r1", deadline_ms: float | None = 100.0, **kw: object) -> Request:
    return Request(id=rid, image=b"jpeg", deadline_ms=deadline_ms, **kw)  # type: ignore[arg-type]


def ok(rid: str, total_ms: float = 5.0) -> Result:
    return Result(
        id=rid,
        status="ok",
        timestamp="2026-11-29T00:00:00.000Z",
        predictions=[Prediction(1, "goldfish", 0.9)],
        placement="cloud",
        latency_ms=Latency(total=total_ms),
    )


def err(rid: str, code: ErrorCode) -> Result:
    return error_result(rid, code, "x", timestamp="2026-11-29T00:00:00.000Z", placement="cloud")


def policy(clock: Clock, **cfg: object) -> OffloadPolicy[str]:
    config = OffloadConfig(**cfg)  # type: ignore[arg-type]
    p: OffloadPolicy[str] = OffloadPolicy(config, max_batch_size=8, local_models=["lite0"], clock=clock)
    for n in (1, 2, 4, 8):  # t(n) = 4n + 2 ms
        p.batch_finished(n, 4 * n + 2)
    p.observe_overhead(1.0)
    return p


def teach_cloud(p: OffloadPolicy[str], clock: Clock, rtt_ms: float, service_ms: float) -> None:
    """Feed the cloud model with a few answered offloads taking `rtt_ms` end to end."""
    for i in range(8):
        r = req(f"teach-{i}", deadline_ms=None, offload="always")
        assert p.decide(r, ahead=0, payload_bytes=1000 + i).where == "cloud"
        t = p.begin_offload(r, r.id, payload_bytes=1000 + i)
        clock.advance(rtt_ms)
        out = p.on_cloud_result(ok(t.wire_id, service_ms))
        assert out is not None
        assert out.result is not None


# ------------------------------------------------------------------------------------------ models


def test_linear_fit_recovers_a_n_plus_b() -> None:
    fit = LinearFit(16)
    for n in (1, 2, 4, 8, 1, 8):
        fit.add(n, 4.5 * n + 3)
    a, b = fit.coef or (0, 0)
    assert a == pytest.approx(4.5)
    assert b == pytest.approx(3)
    assert fit.predict(16) == pytest.approx(75)


def test_linear_fit_single_size_goes_through_origin_and_handles_noise() -> None:
    fit = LinearFit(8)
    assert fit.predict(3) is None
    fit.add(4, 20)
    assert fit.predict(8) == pytest.approx(40)
    flat = LinearFit(8)
    for n, y in ((1, 10), (8, 9)):  # decreasing: noise, not a model
        flat.add(n, y)
    assert flat.coef == (0.0, pytest.approx(9.5))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 32), st.floats(0, 500)), min_size=1, max_size=40))
def test_linear_fit_never_predicts_negative(samples: list[tuple[int, float]]) -> None:
    fit = LinearFit(64)
    for x, y in samples:
        fit.add(x, y)
    for n in (1, 8, 32):
        value = fit.predict(n)
        assert value is not None
        assert value >= 0


def test_service_model_prior_before_any_batch() -> None:
    m = ServiceTimeModel(prior_ms_per_item=10)
    assert m.predict(3) == 30
    m.observe(2, 10)
    assert m.predict(2) == pytest.approx(10)


def test_cloud_model_splits_network_and_service() -> None:
    m = CloudLatencyModel(window=16, prior_ms=60)
    assert m.predict(1000) == 60
    for size in (1000, 2000, 3000, 4000):
        m.observe(size, 30 + size / 1000 + 5, 5)  # 30 ms RTT + 1 ms/kB upload + 5 ms service
    assert m.predict(10_000) == pytest.approx(30 + 10 + 5, abs=0.01)


# ----------------------------------------------------------------------------------- predictions


def test_local_prediction_counts_batches_ahead_and_the_running_batch() -> None:
    clock = Clock()
    p = policy(clock)
    # idle, nothing ahead: t(1) + overhead
    assert p.predict_local_ms(0) == pytest.approx(6 + 1)
    # 10 ahead with batches of 8: one full batch t(8)=34, then own batch of 3: t(3)=14; before any
    # feedback, the 1 ms of decode/reply work of each of the 10 ahead as well
    assert p.predict_local_ms(10) == pytest.approx(34 + 14 + 1 + 10)
    p.batch_started(8)  # predicted to run 34 ms
    clock.advance(20)
    assert p.predict_local_ms(0) == pytest.approx(14 + 6 + 1)
    p.batch_finished(8, 34)
    assert p.predict_local_ms(0) == pytest.approx(7)


# ------------------------------------------------------------------------------------- decisions


def test_stays_local_while_local_meets_the_budget() -> None:
    clock = Clock()
    p = policy(clock)
    d = p.decide(req(deadline_ms=100), ahead=5, payload_bytes=20_000)
    assert d.where == "edge"
    assert d.local_ms is not None
    assert d.budget_ms is not None
    assert d.local_ms <= d.budget_ms


def test_offloads_when_only_the_cloud_meets_the_budget() -> None:
    clock = Clock()
    p = policy(clock)
    teach_cloud(p, clock, rtt_ms=35, service_ms=5)
    d = p.decide(req(deadline_ms=100), ahead=24, payload_bytes=1000)  # local: 3·34 + 6 + 1 = 109
    assert d.where == "cloud", d.reason
    assert d.cloud_ms is not None
    assert d.cloud_ms < 100


def test_deadline_exceeded_when_neither_can() -> None:
    clock = Clock()
    p = policy(clock)
    teach_cloud(p, clock, rtt_ms=80, service_ms=5)
    d = p.decide(req(deadline_ms=60), ahead=24, payload_bytes=1000)
    assert d.where == "reject"
    assert d.code is ErrorCode.DEADLINE_EXCEEDED


def test_time_already_spent_counts_against_the_budget() -> None:
    clock = Clock()
    p = policy(clock)
    arrived = clock()
    clock.advance(95)
    d = p.decide(req(deadline_ms=100), ahead=0, payload_bytes=1000, arrived=arrived)
    assert d.where == "reject"


def test_no_deadline_stays_local_and_never_stays_local() -> None:
    clock = Clock()
    p = policy(clock)
    assert p.decide(req(deadline_ms=None), ahead=500, payload_bytes=1).where == "edge"
    d = p.decide(req(deadline_ms=10, offload="never"), ahead=500, payload_bytes=1)
    assert d.where == "reject"
    assert d.code is ErrorCode.DEADLINE_EXCEEDED
    assert p.decide(req(deadline_ms=1000, offload="never"), ahead=1, payload_bytes=1).where == "edge"


def test_model_not_on_the_device_goes_to_the_cloud() -> None:
    clock = Clock()
    p = policy(clock)
    assert p.decide(req(model="lite2"), ahead=0, payload_bytes=1).where == "cloud"
    assert p.decide(req(model="lite0"), ahead=0, payload_bytes=1).where == "edge"
    d = p.decide(req(model="lite2", offload="never"), ahead=0, payload_bytes=1)
    assert d.where == "reject"
    assert d.code is ErrorCode.BAD_REQUEST


def test_policy_disabled_never_offloads() -> None:
    clock = Clock()
    p = policy(clock, enabled=False)
    assert p.decide(req(deadline_ms=100), ahead=40, payload_bytes=1).where == "reject"
    d = p.decide(req(model="lite2"), ahead=0, payload_bytes=1)
    assert d.where == "reject"
    assert d.code is ErrorCode.OVERLOADED
    assert p.decide(req(offload="always"), ahead=0, payload_bytes=1).where == "edge"


# ---------------------------------------------------------------------------- exactly one result


def test_cloud_answer_first_wins_and_later_events_are_ignored() -> None:
    clock = Clock()
    p = policy(clock)
    r = req("a", offload="always")
    p.decide(r, ahead=0, payload_bytes=10)
    t = p.begin_offload(r, "item-a", payload_bytes=10)
    clock.advance(30)
    out = p.on_cloud_result(ok("a"))
    assert out is not None
    assert out.result is not None
    assert out.result.id == "a"
    assert not out.serve_locally
    assert p.on_cloud_result(ok("a")) is None  # duplicate
    clock.advance(10_000)
    assert p.due() == []  # nothing left to fall back
    assert not p.on_publish_failed(t)
    assert p.inflight == 0


def test_no_answer_in_time_is_served_locally_once_and_late_answer_dropped() -> None:
    clock = Clock()
    p = policy(clock)
    r = req("b", deadline_ms=100, offload="always")
    p.decide(r, ahead=0, payload_bytes=10)
    t = p.begin_offload(r, "item-b", payload_bytes=10)
    assert p.next_due() == t.fallback_at
    assert t.fallback_at <= clock() + 0.1  # never waits past the deadline
    assert p.due() == []
    clock.t = t.fallback_at
    falls = p.due()
    assert [f.ticket.item for f in falls] == ["item-b"]
    assert p.due() == []
    assert p.on_cloud_result(ok("b")) is None  # too late: already served locally
    assert p.counters["late_cloud_answers"] == 1


def test_cloud_internal_error_is_served_locally_but_bad_request_is_forwarded() -> None:
    clock = Clock()
    p = policy(clock)
    for rid, code, local in (("c", ErrorCode.INTERNAL, True), ("d", ErrorCode.BAD_IMAGE, False)):
        r = req(rid, offload="always")
        p.decide(r, ahead=0, payload_bytes=10)
        p.begin_offload(r, rid, payload_bytes=10)
        out = p.on_cloud_result(err(rid, code))
        assert out is not None
        assert out.serve_locally is local
        assert (out.result is None) is local


def test_duplicate_request_ids_in_flight_get_distinct_wire_ids() -> None:
    clock = Clock()
    p = policy(clock)
    r1, r2 = req("same", offload="always"), req("same", offload="always")
    t1 = p.begin_offload(r1, "one", payload_bytes=1)
    t2 = p.begin_offload(r2, "two", payload_bytes=1)
    assert t1.wire_id != t2.wire_id
    a, b = p.on_cloud_result(ok(t2.wire_id)), p.on_cloud_result(ok(t1.wire_id))
    assert a is not None
    assert b is not None
    assert (a.ticket.item, b.ticket.item) == ("two", "one")
    assert a.result is not None
    assert a.result.id == "same"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["answer", "dup", "tick", "fail"]), max_size=60), st.integers(1, 12))
def test_every_offload_ends_exactly_once(events: list[str], n: int) -> None:
    clock = Clock()
    p = policy(clock)
    tickets = []
    for i in range(n):
        r = req(f"id{i}", deadline_ms=100, offload="always")
        tickets.append(p.begin_offload(r, r.id, payload_bytes=100))
    ended: list[str] = []
    for k, ev in enumerate(events):
        t = tickets[k % n]
        if ev in ("answer", "dup"):
            out = p.on_cloud_result(ok(t.wire_id))
            if out is not None:
                ended.append(out.ticket.item)
        elif ev == "tick":
            clock.advance(40)
            ended += [f.ticket.item for f in p.due()]
        elif p.on_publish_failed(t):
            ended.append(t.item)
    clock.advance(10_000)
    ended += [f.ticket.item for f in p.due()]
    assert sorted(ended) == sorted(t.item for t in tickets)


# ---------------------------------------------------------------------------------------- breaker


def test_breaker_opens_after_failures_then_probes_and_closes() -> None:
    clock = Clock()
    b = CircuitBreaker(failures=3, cooldown_s=2, max_cooldown_s=8, clock=clock)
    for _ in range(2):
        b.record_failure()
    assert b.state is BreakerState.CLOSED
    b.record_failure()
    assert b.state is BreakerState.OPEN
    assert not b.allow()
    clock.advance(2000)
    assert b.allow()  # the probe
    assert b.state is BreakerState.HALF_OPEN
    assert not b.allow()  # only one probe at a time
    b.record_failure()
    assert b.state is BreakerState.OPEN
    assert b.cooldown_s == 4  # doubled
    clock.advance(4000)
    assert b.allow()
    b.record_success()
    assert b.state is BreakerState.CLOSED
    assert b.cooldown_s == 2


def test_router_down_breaker_opens_requests_served_locally_then_offloading_resumes() -> None:
    """The policy-level version of 'router stopped mid-run, then back'."""
    clock = Clock()
    p = policy(clock, breaker_failures=3, breaker_cooldown_s=1.0)
    teach_cloud(p, clock, rtt_ms=30, service_ms=5)
    heavy = 24  # local predicted 109 ms: only the cloud meets a 100 ms deadline
    results: dict[str, str] = {}

    def submit(rid: str) -> None:
        r = req(rid, deadline_ms=100)
        d = p.decide(r, ahead=heavy, payload_bytes=1000)
        if d.where == "cloud":
            p.begin_offload(r, rid, payload_bytes=1000)
        else:
            results[rid] = d.where

    # router down: offloads time out, fall back locally, and the breaker opens
    for i in range(6):
        submit(f"down{i}")
        clock.advance(100)
        for f in p.due():
            results[f.ticket.item] = "local-fallback"
    assert p.breaker.state is BreakerState.OPEN
    assert sum(v == "local-fallback" for v in results.values()) == 3
    # open breaker: no offload; the heavy requests can't make it anywhere → DEADLINE_EXCEEDED now
    assert all(results[f"down{i}"] == "reject" for i in range(3, 6))
    assert p.inflight == 0
    # router back: after the cooldown one probe goes out, succeeds, and offloading resumes
    clock.advance(1000)
    submit("probe")
    assert p.inflight == 1
    submit("while-probing")
    assert results["while-probing"] == "reject"
    clock.advance(30)
    out = p.on_cloud_result(ok("probe"))
    assert out is not None
    results["probe"] = "cloud"
    assert p.breaker.state is BreakerState.CLOSED
    for i in range(3):
        submit(f"up{i}")
        clock.advance(30)
        answer = p.on_cloud_result(ok(f"up{i}"))
        assert answer is not None
        results[f"up{i}"] = "cloud"
    assert all(results[f"up{i}"] == "cloud" for i in range(3))
    assert set(results) == {f"down{i}" for i in range(6)} | {"probe", "while-probing"} | {
        f"up{i}" for i in range(3)
    }


def test_publish_failure_counts_against_the_breaker() -> None:
    clock = Clock()
    p = policy(clock, breaker_failures=2)
    for i in range(2):
        r = req(f"p{i}", offload="always")
        assert p.decide(r, ahead=0, payload_bytes=1).where == "cloud"
        t = p.begin_offload(r, r.id, payload_bytes=1)
        assert p.on_publish_failed(t)
    assert p.breaker.state is BreakerState.OPEN
    assert p.decide(req("x", offload="always"), ahead=0, payload_bytes=1).where == "edge"


# ---------------------------------------------------------------------------------------- cascade


def test_cascade_asks_the_cloud_when_unsure_and_falls_back_to_the_held_answer() -> None:
    clock = Clock()
    p = policy(clock, cascade_threshold=0.5)
    r = req("k", deadline_ms=200)
    assert not p.wants_cascade(r, 0.9, payload_bytes=10)
    assert not p.wants_cascade(req("n", offload="never"), 0.1, payload_bytes=10)
    assert p.wants_cascade(r, 0.3, payload_bytes=10)
    local = ok("k")
    local.placement = "edge"
    t = p.begin_offload(r, "k", payload_bytes=10, held=local)
    clock.t = t.fallback_at
    (fb,) = p.due()
    assert fb.ticket.held is local
    # and with an answer in time, the cloud's answer is the one
    r2 = req("k2", deadline_ms=200)
    assert p.wants_cascade(r2, 0.3, payload_bytes=10)
    p.begin_offload(r2, "k2", payload_bytes=10, held=ok("k2"))
    out = p.on_cloud_result(ok("k2"))
    assert out is not None
    assert out.result is not None
    assert out.result.placement == "cloud"


def test_cascade_off_by_default_and_skipped_without_time() -> None:
    clock = Clock()
    assert not policy(clock).wants_cascade(req(), 0.01, payload_bytes=1)
    p = policy(clock, cascade_threshold=0.5)
    teach_cloud(p, clock, rtt_ms=80, service_ms=5)
    assert not p.wants_cascade(req(deadline_ms=50), 0.1, payload_bytes=1000)


def test_config_from_recipe() -> None:
    cfg = OffloadConfig.from_recipe(
        {"enabled": False, "cascadeThreshold": 0.4, "breakerFailures": "3", "localModels": ["a"]}
    )
    assert cfg.enabled is False
    assert cfg.cascade_threshold == 0.4
    assert cfg.local_models == ["a"]
    assert cfg.breaker_failures == 3
    lite = OffloadConfig.from_recipe({"enabled": "false", "cloudQuantile": "0.8", "window": "16"})
    assert (lite.enabled, lite.cloud_quantile, lite.window) == (False, 0.8, 16)
    with pytest.raises(ConfigError) as err:
        OffloadConfig.from_recipe({"breakerFailures": "x", "cascadeThreshold": 2})
    assert err.value.reasons == "placement.breakerFailures: must be an integer, got 'x'"
    with pytest.raises(ConfigError) as err:
        OffloadConfig.from_recipe({"cascadeThreshold": 2, "cloudQuantile": 1, "priorCloudMs": -1})
    assert err.value.reasons == (
        "placement.priorCloudMs: must not be negative; placement.cascadeThreshold: must be from 0 to 1; "
        "placement.cloudQuantile: must be from 0.5 to below 1"
    )


def test_late_answers_teach_the_latency_model_and_close_the_breaker() -> None:
    """A slow cloud is avoided by prediction, not kept out by the breaker."""
    clock = Clock()
    p = policy(clock, breaker_failures=2, prior_cloud_ms=40)
    tickets = []
    for i in range(2):
        r = req(f"slow{i}", deadline_ms=100, offload="always")
        assert p.decide(r, ahead=0, payload_bytes=1000).where == "cloud"
        tickets.append(p.begin_offload(r, r.id, payload_bytes=1000))
    clock.advance(100)
    assert len(p.due()) == 2  # served locally
    assert p.breaker.state is BreakerState.OPEN
    clock.advance(150)  # the answers come 250 ms after sending
    for t in tickets:
        assert p.on_cloud_result(ok(t.wire_id, 5)) is None  # never forwarded: already answered
    assert p.breaker.state is BreakerState.CLOSED
    assert p.predict_cloud_ms(1000) > 200
    d = p.decide(req("next", deadline_ms=100), ahead=24, payload_bytes=1000)
    assert d.where != "cloud"  # too slow to be worth it now


def test_a_slow_cloud_is_forgotten_after_a_while_so_offloads_probe_it_again() -> None:
    clock = Clock()
    p = policy(clock, cloud_memory_s=10)
    teach_cloud(p, clock, rtt_ms=300, service_ms=5)
    assert p.decide(req("a", deadline_ms=100), ahead=24, payload_bytes=1000).where == "reject"
    clock.advance(11_000)
    assert p.decide(req("b", deadline_ms=100), ahead=24, payload_bytes=1000).where == "cloud"


def test_a_slow_verdict_is_probed_with_a_request_that_would_fail_anyway() -> None:
    clock = Clock()
    p = policy(clock, cloud_probe_s=0.5)
    teach_cloud(p, clock, rtt_ms=300, service_ms=5)
    assert p.decide(req("a", deadline_ms=100), ahead=24, payload_bytes=1000).where == "reject"
    clock.advance(600)  # the verdict is 0.6 s old: one probe, then none while it is in flight
    d = p.decide(req("b", deadline_ms=100), ahead=24, payload_bytes=1000)
    assert d.where == "cloud"
    assert d.reason.startswith("probe")
    t = p.begin_offload(req("b", deadline_ms=100), "b", payload_bytes=1000)
    assert p.decide(req("c", deadline_ms=100), ahead=24, payload_bytes=1000).where == "reject"
    clock.advance(40)  # the probe's answer is a fresh sample: no other probe for a while
    assert p.on_cloud_result(ok(t.wire_id, 5.0)) is not None
    clock.advance(100)
    assert p.decide(req("d", deadline_ms=100), ahead=24, payload_bytes=1000).where == "reject"
    clock.advance(500)
    assert p.decide(req("d2", deadline_ms=100), ahead=24, payload_bytes=1000).where == "cloud"
    # no probe for a budget the router could not even try
    p2 = policy(clock)
    teach_cloud(p2, clock, rtt_ms=300, service_ms=5)
    clock.advance(600)
    assert p2.decide(req("e", deadline_ms=30), ahead=24, payload_bytes=1000).where == "reject"


def test_feedback_samples_age_out_so_a_slow_spell_does_not_keep_the_edge_idle() -> None:
    clock = Clock()
    p = policy(clock, feedback_memory_s=3.0)
    for i in range(32):  # an overloaded spell: even requests with nothing ahead took 150 ms
        p.observe_local(i % 4, 150.0)
    assert p.decide(req("a", deadline_ms=100), ahead=0, payload_bytes=1000).where != "edge"
    clock.advance(3_500)  # nothing served here since: the engine model (idle) decides again
    assert p.decide(req("b", deadline_ms=100), ahead=0, payload_bytes=1000).where == "edge"


def test_linear_fit_memory_drops_old_samples() -> None:
    clock = Clock()
    fit = LinearFit(16, memory_s=1.0, clock=clock)
    fit.add(1, 10.0)
    clock.advance(600)
    fit.add(2, 20.0)
    assert len(fit) == 2
    clock.advance(600)
    assert len(fit) == 1
    assert fit.predict(2) == pytest.approx(20.0)


def test_a_jitter_spike_does_not_offload_what_the_edge_is_expected_to_serve_sooner() -> None:
    clock = Clock()
    p = policy(clock)
    teach_cloud(p, clock, rtt_ms=40, service_ms=5)
    for i in range(50):  # the edge: mostly 10 ms, now and then a 150 ms spike (another process)
        p.observe_local(0, 150.0 if i % 25 == 0 else 10.0)
    assert p.predict_local_ms(0) > 95 > p.predict_cloud_ms(1000)  # only the cloud is "sure"...
    d = p.decide(req("a", deadline_ms=100), ahead=0, payload_bytes=1000)
    assert d.where == "edge"  # ...but the edge is expected to answer in a fraction of its time


# ------------------------------------------------------------------ slow cloud, limit, light load


def test_timeouts_while_the_cloud_keeps_answering_do_not_open_the_breaker() -> None:
    """A slow cloud is not a dead one: it is kept out by the latency model and the offload limit."""
    clock = Clock()
    p = policy(clock, breaker_failures=2)
    tickets = []
    for i in range(3):
        r = req(f"s{i}", deadline_ms=100, offload="always")
        assert p.decide(r, ahead=0, payload_bytes=1000).where == "cloud"
        tickets.append(p.begin_offload(r, r.id, payload_bytes=1000))
        clock.advance(1)
    clock.advance(60)
    assert p.on_cloud_result(ok(tickets[0].wire_id)) is not None  # the cloud answers: it is up
    clock.advance(100)
    assert len(p.due()) == 2
    assert p.breaker.state is BreakerState.CLOSED
    assert p.counters["cloud_slow"] == 2
    # offloads sent after the last answer that then time out do count: the cloud may be down
    for i in range(2):
        r = req(f"d{i}", deadline_ms=100, offload="always")
        assert p.decide(r, ahead=0, payload_bytes=1000).where == "cloud"
        p.begin_offload(r, r.id, payload_bytes=1000)
    clock.advance(200)
    assert len(p.due()) == 2
    assert p.breaker.state is BreakerState.OPEN


def test_deadline_offloads_wait_for_room_under_the_adaptive_limit() -> None:
    clock = Clock()
    # the limit alone here: no breaker, no light-load rule
    p = policy(clock, cloud_limit_initial=3.0, breaker_failures=1000, offload_min_utilization=0.0)
    teach_cloud(p, clock, rtt_ms=30, service_ms=5)
    heavy = 24  # only the cloud meets a 100 ms deadline
    sent = []
    for i in range(5):
        r = req(f"h{i}", deadline_ms=100)
        d = p.decide(r, ahead=heavy, payload_bytes=1000)
        if d.where == "cloud":
            sent.append(p.begin_offload(r, r.id, payload_bytes=1000))
        else:
            assert d.where == "reject"
            assert "no room" in d.reason
    assert len(sent) == 3  # the limit
    # answers back well within their time raise the limit by 1/limit each
    clock.advance(30)
    for t in sent:
        assert p.on_cloud_result(ok(t.wire_id)) is not None
    assert 3.5 < p.cloud_limit < 4.2
    # misses cut it, once per congestion episode (`cloud_limit_hold_s`)
    before = p.cloud_limit
    late = []
    for i in range(3):
        r = req(f"l{i}", deadline_ms=100)
        assert p.decide(r, ahead=heavy, payload_bytes=1000).where == "cloud"
        late.append(p.begin_offload(r, r.id, payload_bytes=1000))
    clock.advance(200)
    assert len(p.due()) == 3
    assert p.cloud_limit == pytest.approx(before * 0.8)
    assert p.snapshot()["cloud_limit"] == pytest.approx(before * 0.8, abs=0.01)
    # never below one: the cloud is always tried again
    for _ in range(30):
        r = req("x", deadline_ms=100)
        if p.decide(r, ahead=heavy, payload_bytes=1000).where == "cloud":
            p.begin_offload(r, r.id, payload_bytes=1000)
        clock.advance(200)
        p.due()
    assert p.cloud_limit == pytest.approx(1.0)
    assert p.decide(req("y", deadline_ms=100), ahead=heavy, payload_bytes=1000).where == "cloud"


def test_an_answer_without_headroom_does_not_raise_the_limit() -> None:
    clock = Clock()
    p = policy(clock, cloud_limit_initial=2.0, cloud_limit_headroom=0.75)
    r = req("a", deadline_ms=100, offload="always")
    p.decide(r, ahead=0, payload_bytes=1000)
    t = p.begin_offload(r, r.id, payload_bytes=1000)
    clock.advance(90)  # in time, but with 90 of its ~100 ms used
    assert p.on_cloud_result(ok(t.wire_id)) is not None
    assert p.cloud_limit == 2.0


def test_utilization_is_the_busy_share_of_the_recent_window() -> None:
    clock = Clock()
    p = policy(clock, utilization_window_s=2.0, utilization_min_s=0.25)
    assert p.utilization() is None  # no batch seen yet
    p.batch_started(4)
    clock.advance(100)
    assert p.utilization() is None  # seen for too short a time to tell
    clock.advance(400)
    p.batch_finished(4, 500)
    clock.advance(500)
    assert p.utilization() == pytest.approx(0.5)  # of the 1 s since batches have been seen
    p.batch_started(4)
    clock.advance(1000)  # still running: counts up to now
    assert p.utilization() == pytest.approx(0.75)
    p.batch_finished(4, 1000)
    clock.advance(1500)  # the first batch has left the window, half of the second is in it
    assert p.utilization() == pytest.approx(0.25)
    clock.advance(1000)
    assert p.utilization() == 0.0  # idle for a whole window
    # after the gap, the share is taken over the time batches have been seen again
    p.batch_started(4)
    clock.advance(300)
    p.batch_finished(4, 300)
    assert p.utilization() == pytest.approx(1.0)


def busy_for(p: OffloadPolicy[str], clock: Clock, busy_ms: float, idle_ms: float) -> None:
    p.batch_started(8)
    clock.advance(busy_ms)
    p.batch_finished(8, 34)  # (the service model stays t(n) = 4n + 2)
    clock.advance(idle_ms)


def test_light_load_keeps_deadline_requests_on_the_edge() -> None:
    """At light load a Poisson burst (a long queue for a moment) stays on the edge; under load the
    same request goes to the cloud, which is sure to meet it."""
    clock = Clock()
    p = policy(clock, offload_min_utilization=0.7)
    teach_cloud(p, clock, rtt_ms=30, service_ms=5)
    for i in range(40):  # the edge: usually 40 ms with 8 ahead, now and then 150 ms
        p.observe_local(8, 150.0 if i % 10 == 0 else 40.0)
    assert p.predict_local_ms(8) > 95 > p.predict_local_ms(8, conservative=False)
    for _ in range(10):
        busy_for(p, clock, 20, 80)  # 20 % busy
    d = p.decide(req("a", deadline_ms=100), ahead=8, payload_bytes=1000)
    assert d.where == "edge"
    assert d.reason.startswith("light load")
    # even one expected to miss: the burst is over in a moment, and the device has room
    d = p.decide(req("a2", deadline_ms=100), ahead=40, payload_bytes=1000)
    assert d.where == "edge"
    # busy: the engine ran 90 % of the window
    for _ in range(20):
        busy_for(p, clock, 90, 10)
    for i in range(40):
        p.observe_local(8, 150.0 if i % 10 == 0 else 40.0)
    d = p.decide(req("b", deadline_ms=100), ahead=8, payload_bytes=1000)
    assert d.where == "cloud"
    # unknown (hooks not wired, or the first moments after an idle spell): as under load
    q = policy(clock)
    teach_cloud(q, clock, rtt_ms=30, service_ms=5)
    assert q.utilization() is None
    assert q.decide(req("c", deadline_ms=100), ahead=40, payload_bytes=1000).where == "cloud"


def test_residual_quantile_at_a_load_uses_samples_at_that_load_or_more() -> None:
    fit = LinearFit(256)
    for i in range(100):  # round trips: tight with few in flight, a long tail with many
        fit.add(1, 50 + i % 5)
        fit.add(9, 80 + (60 if i % 4 == 0 else i % 5))
    overall = fit.residual_quantile(0.8)  # the tail is 12.5 % of all samples, 25 % of those at 9
    assert fit.residual_quantile(0.8, at=9) > overall + 30
    assert fit.residual_quantile(0.8, at=0) == overall
    sparse = LinearFit(64)
    for x in range(10):
        sparse.add(x, 10 * x)
    sparse.add(20, 400)  # one sample beyond: the `min_samples` with the largest x stand in
    assert sparse.residual_quantile(1.0, at=20) == sparse.residual_quantile(1.0, at=30)


def test_before_any_feedback_the_work_of_requests_ahead_is_counted_too() -> None:
    clock = Clock()
    p = policy(clock)  # t(n) = 4n + 2, overhead 1 ms
    for _ in range(9):
        p.observe_overhead(3.0)
    assert p.predict_local_ms(0) == pytest.approx(6 + 3)
    assert p.predict_local_ms(10) == pytest.approx(34 + 14 + 3 + 10 * 3)
    for i in range(16):  # with feedback, the fit of what requests really took decides
        p.observe_local(10, 40.0 + i % 2)
    assert p.predict_local_ms(10, conservative=False) == pytest.approx(51)


def test_an_edge_whose_engine_shares_its_core_is_not_at_light_load_while_requests_queue() -> None:
    """The engine 40 % busy (decode and the transport take the rest of its one core), yet every
    arrival finds a full batch ahead: out of capacity, so the cloud, sure to meet it, gets it."""
    clock = Clock()
    p = policy(clock, offload_min_utilization=0.7)
    teach_cloud(p, clock, rtt_ms=30, service_ms=5)
    for i in range(40):
        p.observe_local(16, 150.0 if i % 10 == 0 else 90.0)
    for _ in range(10):
        busy_for(p, clock, 40, 60)  # 40 % busy
    first = p.decide(req("few", deadline_ms=100), ahead=16, payload_bytes=1000)
    assert first.where == "edge"  # one arrival is no load (a burst)
    assert first.reason.startswith("light load")
    for i in range(30):  # a sustained queue: arrivals keep finding two batches ahead
        p.decide(req(f"q{i}", deadline_ms=10_000), ahead=16, payload_bytes=1000)
        clock.advance(20)
    share = p.queued_share()
    assert share is not None
    assert share > 0.7
    assert p.decide(req("now", deadline_ms=100), ahead=16, payload_bytes=1000).where == "cloud"


# ------------------------------------------------------------------------------ behind a backlog


def _light_load(**cfg: object) -> tuple[OffloadPolicy[str], FakeClock]:
    """A policy at light load (engine 20 % busy) with a measured cloud of 30 ms round trips."""
    clock = FakeClock()
    config = OffloadConfig(offload_min_utilization=0.7, **cfg)  # type: ignore[arg-type]
    p: OffloadPolicy[str] = OffloadPolicy(config, max_batch_size=8, local_models=["lite0"], clock=clock)
    for n in (1, 2, 4, 8):
        p.batch_finished(n, 4 * n + 2)
    p.observe_overhead(1.0)
    for i in range(8):
        r = req(f"teach-{i}", deadline_ms=None, offload="always")
        assert p.decide(r, ahead=0, payload_bytes=1000).where == "cloud"
        t = p.begin_offload(r, r.id, payload_bytes=1000)
        clock.advance(0.030)
        assert p.on_cloud_result(ok(t.wire_id, 5.0)) is not None
    for _ in range(10):
        p.batch_started(8)
        clock.advance(0.020)
        p.batch_finished(8, 34)
        clock.advance(0.080)
    return p, clock


def _arrive(
    p: OffloadPolicy[str],
    clock: FakeClock,
    rid: str,
    lag_ms: float,
    *,
    ahead: int = 4,
    deadline_ms: float = 100,
) -> str:
    """A request whose `deadline_ms` counts from its sending, arriving `lag_ms` after it."""
    clock.advance(0.010)
    left = deadline_ms - lag_ms
    r = req(rid, deadline_ms=deadline_ms)
    return p.decide_left(r, ahead=ahead, payload_bytes=1000, deadline_left_ms=left, lag_ms=lag_ms).where


def test_requests_arriving_most_of_their_deadline_old_put_the_device_behind_and_the_cloud_takes_them() -> (
    None
):
    p, clock = _light_load()
    assert _arrive(p, clock, "fresh", lag_ms=2) == "edge"  # light load: the edge keeps it
    assert p.behind() is None
    # Sixty of its 100 ms spent on the way: one such arrival is a hiccup, three in a row a backlog.
    assert [_arrive(p, clock, f"late{i}", lag_ms=60) for i in range(3)] == ["edge", "edge", "cloud"]
    why = p.behind()
    assert why is not None
    assert "60 % of its deadline" in why
    assert p.snapshot()["behind_now"] == why
    # Behind, the cloud takes what it meets though the edge would meet it too (its own queue does not
    # show the backlog), but not what it cannot make: 15 ms left stays here.
    assert _arrive(p, clock, "empty", lag_ms=55, ahead=0) == "cloud"
    assert _arrive(p, clock, "tight", lag_ms=85, ahead=0) == "edge"
    assert p.counters["behind"] == 2
    # Fresh arrivals again: behind lapses `backlogHoldS` after the last late one.
    clock.advance(p.config.backlog_hold_s)
    assert _arrive(p, clock, "again", lag_ms=2) == "edge"
    assert p.behind() is None


def test_a_growing_lag_is_a_backlog_and_a_constant_one_is_a_clock_offset() -> None:
    p, clock = _light_load(backlog_growth_ms=20.0, backlog_lag_share=0.9)  # (the share rule aside)
    # The sender's clock 20 ms behind this one's: every request looks 20 ms late, none later.
    for i in range(40):
        assert _arrive(p, clock, f"skewed{i}", lag_ms=20 + (i % 3)) == "edge"
    assert p.behind() is None
    # Then a queue builds upstream: each arrival 6 ms later than the one before.
    wheres = [_arrive(p, clock, f"growing{i}", lag_ms=20 + 6 * i) for i in range(1, 8)]
    assert wheres == ["edge"] * 5 + ["cloud"] * 2  # up 24, 30, 36 ms: the third sign in a row
    why = p.behind()
    assert why is not None
    assert why.startswith("arrival lag 62 ms, up 42 ms")


def test_arrivals_past_their_deadline_count_though_no_decision_sees_them() -> None:
    p, clock = _light_load()
    for _ in range(3):  # answered DEADLINE_EXCEEDED on arrival, one with no `sent_at`
        clock.advance(0.001)
        p.observe_lag(None, -30.0)
    assert p.behind() == "an arrival past its deadline"
    assert _arrive(p, clock, "next", lag_ms=10, ahead=0) == "cloud"
    # Requests that say nothing of their way here change nothing; one with a deadline left does not
    # count either (nothing is known of its lag).
    p.observe_lag(None, None)
    p.observe_lag(None, 50.0)
    assert p.behind() is not None


def test_behind_needs_room_in_the_cloud_and_is_off_when_configured_so() -> None:
    p, clock = _light_load(backlog_lag_share=0.0, backlog_growth_ms=0.0)
    for i in range(5):
        assert _arrive(p, clock, f"late{i}", lag_ms=60) == "edge"  # off: the light-load rule holds
    assert p.behind() is None
    q, clock = _light_load()
    for i in range(3):
        _arrive(q, clock, f"late{i}", lag_ms=60)
    assert q.behind() is not None
    assert _arrive(q, clock, "room", lag_ms=60, ahead=0) == "cloud"
    while q.inflight < q.cloud_limit:  # as many offloads in flight as the adaptive limit allows
        q.begin_offload(req(f"held{q.inflight}"), "held", payload_bytes=1000)
    assert _arrive(q, clock, "full", lag_ms=60, ahead=0) == "edge"  # no room: served here after all


def test_decide_counts_the_lag_against_the_budget() -> None:
    p, _ = _light_load()
    d = p.decide(req("old", deadline_ms=100), ahead=0, payload_bytes=1000, lag_ms=90)
    assert d.budget_ms == pytest.approx(100 - 90 - p.config.deadline_margin_ms)


def test_backlog_keys_from_the_recipe_are_checked() -> None:
    cfg = OffloadConfig.from_recipe({"backlogLagShare": 0.6, "backlogArrivals": 2, "backlogHoldS": 1.5})
    assert (cfg.backlog_lag_share, cfg.backlog_arrivals, cfg.backlog_hold_s) == (0.6, 2, 1.5)
    assert OffloadConfig(backlog_lag_share=1.5, backlog_arrivals=0).check() == [
        ("backlogLagShare", "must be from 0 to 1"),
        ("backlogArrivals", "must be at least 1"),
    ]


def test_a_sender_clock_behind_this_one_is_learnt_as_the_usual_lag() -> None:
    """Every request 110 ms "late" of its 200 (the sender's clock 110 ms behind): until arrivals span
    `backlogFloorS` nothing tells that from a backlog the device started into; after, it is the usual
    lag, and only a lag above it (or growing) is a sign."""
    p, clock = _light_load(backlog_floor_s=10.0)

    def arrive(rid: str, lag_ms: float) -> str:
        return _arrive(p, clock, rid, lag_ms, ahead=0, deadline_ms=200)

    assert [arrive(f"early{i}", 110) for i in range(3)] == ["edge", "edge", "cloud"]
    for i in range(21):  # ten seconds of them
        clock.advance(0.5)
        arrive(f"steady{i}", 110 + (i % 2))
    clock.advance(p.config.backlog_hold_s)
    assert arrive("usual", 110) == "edge"
    assert p.behind() is None
    assert [arrive(f"growing{i}", 135) for i in range(3)] == ["edge", "edge", "cloud"]
    why = p.behind()
    assert why is not None
    assert why.startswith("arrival lag 135 ms, up 25 ms")
