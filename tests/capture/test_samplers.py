"""Samplers as pure functions: each rule, the order, the limits on a fake clock."""

from __future__ import annotations

from edgeinfer.capture.config import Limits, ModelCapture, SamplerConfig
from edgeinfer.capture.samplers import Limiter, Selector
from edgeinfer.messages import Box, Detection, ErrorCode, ModelRef, Prediction, Result, error_result

MODEL = ModelRef("resnet", "1.0.0", "int8")


def _cls(label: str, score: float) -> Result:
    return Result("r", "ok", "", predictions=[Prediction(0, label, score)], model=MODEL)


def _det(*scores: float) -> Result:
    box = Box(0, 0, 1, 1)
    dets = [Detection(i, f"c{i}", s, box) for i, s in enumerate(scores)]
    return Result("r", "ok", "", detections=dets, model=MODEL)


def _select(*samplers: SamplerConfig, rng: float = 0.5) -> tuple[Selector, list[float]]:
    now = [0.0]
    return Selector(ModelCapture(samplers=list(samplers)), clock=lambda: now[0], rng=lambda: rng), now


def test_random_share_reads_the_random_source() -> None:
    assert (
        _select(SamplerConfig("random", share=0.1), rng=0.05)[0].choose(*[_cls("cat", 0.9)] * 2) == "random"
    )
    assert _select(SamplerConfig("random", share=0.1), rng=0.5)[0].choose(*[_cls("cat", 0.9)] * 2) is None


def test_confidence_band_on_top1_and_on_any_detection() -> None:
    sel, _ = _select(SamplerConfig("confidence", low=0.4, high=0.6))
    assert sel.choose(*[_cls("cat", 0.5)] * 2) == "confidence"
    assert sel.choose(*[_cls("cat", 0.9)] * 2) is None
    assert sel.choose(*[_det(0.9, 0.45)] * 2) == "confidence"
    assert sel.choose(*[_det(0.9)] * 2) is None


def test_classes_and_detection_counts() -> None:
    sel, _ = _select(SamplerConfig("classes", classes=["dog"]))
    assert sel.choose(*[_cls("dog", 0.9)] * 2) == "classes"
    assert sel.choose(*[_cls("cat", 0.9)] * 2) is None
    sel, _ = _select(SamplerConfig("detections", min_count=2, max_count=3))
    assert [sel.choose(*[_det(*[0.9] * n)] * 2) for n in range(5)] == [
        None,
        None,
        "detections",
        "detections",
        None,
    ]
    assert sel.choose(*[_cls("dog", 0.9)] * 2) is None  # a classifier has no detection count


def test_errors_and_deadline_misses() -> None:
    late = error_result("r", ErrorCode.DEADLINE_EXCEEDED, "late", timestamp="", model=MODEL)
    bad = error_result("r", ErrorCode.BAD_IMAGE, "bad", timestamp="", model=MODEL)
    sel, _ = _select(SamplerConfig("errors"), SamplerConfig("deadline"))
    assert sel.choose(_cls("cat", 0.9), late) == "deadline"  # computed in full, answered late
    assert sel.choose(bad, bad) == "errors"
    assert sel.choose(*[_cls("cat", 0.9)] * 2) is None
    only, _ = _select(SamplerConfig("errors", codes=["INTERNAL"]))
    assert only.choose(bad, bad) is None


def test_the_first_matching_sampler_names_the_reason() -> None:
    sel, _ = _select(SamplerConfig("classes", classes=["cat"]), SamplerConfig("random", share=1.0))
    assert sel.choose(*[_cls("cat", 0.9)] * 2) == "classes"
    assert sel.choose(*[_cls("dog", 0.9)] * 2) == "random"


def test_limits_per_minute_hour_and_day_on_a_fake_clock() -> None:
    lim = Limits(per_minute=2, per_hour=3, per_day=4)
    sel, now = _select(SamplerConfig("random", share=1.0, limits=lim), rng=0.0)
    ok = _cls("cat", 0.9)
    picks = []
    for t in (0, 1, 2, 61, 62, 3601, 3602, 3603, 86401):
        now[0] = float(t)
        picks.append(sel.choose(ok, ok) is not None)
    # minute: 2 of 0,1,2; hour: the 3rd at 61, 62 refused; day: the 4th at 3601, then full until a day on
    assert picks == [True, True, False, True, False, True, False, False, True]


def test_an_unlimited_limiter_keeps_nothing() -> None:
    lim = Limiter(Limits())
    for t in range(100):
        assert lim.allows(float(t))
        lim.take(float(t))
    assert lim.windows == []
