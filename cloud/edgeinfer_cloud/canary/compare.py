"""The canary's judgement: the canary things' windows against the fleet's, as one pure function.

`summarize` folds windows into `Figures`; `compare` checks each figure against `Thresholds` and says
why in words a reader acts on ("p99 412 ms is 2.3x the fleet's 180 ms"). A figure fails only when it is
both `ratio` times the fleet's and `margin` above it: the ratio alone would fail a canary at 0.2 %
errors against a fleet at 0.05 %, the margin alone a slow fleet's canary that is as slow.

The figures: the share of requests answered with an error other than OVERLOADED and DEADLINE_EXCEEDED
(those two have shares of their own: load and time, not the model), the total p99 (the windows' p99s
weighted by their ok requests: windows carry quantiles, not samples, so this is an estimate), and the
low-confidence share where windows carry model-quality figures (`Window.low_confidence`); a figure one
side lacks is not compared, and says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

__all__ = ["Figures", "Limit", "Thresholds", "Verdict", "Window", "compare", "summarize"]

LOAD_CODES = ("OVERLOADED", "DEADLINE_EXCEEDED")


@dataclass(frozen=True)
class Window:
    """What the canary reads of one telemetry window."""

    thing: str
    requests: int
    errors: dict[str, int]
    p99_ms: float | None  # total p99 over the window's ok requests; None without one
    low_confidence: tuple[int, int] | None = None  # (low-confidence answers, answers) when carried

    @property
    def ok(self) -> int:
        return max(self.requests - sum(self.errors.values()), 0)


@dataclass(frozen=True)
class Figures:
    things: int
    windows: int
    requests: int
    error_share: float
    overloaded_share: float
    deadline_share: float
    p99_ms: float | None
    low_confidence_share: float | None


@dataclass(frozen=True)
class Limit:
    """The canary's figure fails when it is over `ratio` times the fleet's and over it by `margin`."""

    ratio: float
    margin: float

    def exceeded(self, canary: float, fleet: float) -> bool:
        return canary > fleet * self.ratio and canary - fleet > self.margin


@dataclass(frozen=True)
class Thresholds:
    errors: Limit = Limit(2.0, 0.01)
    overloaded: Limit = Limit(2.0, 0.02)
    deadline_exceeded: Limit = Limit(2.0, 0.02)
    p99_ms: Limit = Limit(1.5, 5.0)
    low_confidence: Limit = Limit(1.5, 0.05)
    min_requests: int = 20  # each side: fewer is too little to judge, and the canary is not promoted


@dataclass(frozen=True)
class Verdict:
    promote: bool
    reasons: tuple[str, ...]  # why not (empty when promoted)
    notes: tuple[str, ...] = field(default=())  # every figure compared, passed or not


def summarize(windows: Sequence[Window]) -> Figures:
    requests = sum(w.requests for w in windows)
    load = {code: sum(w.errors.get(code, 0) for w in windows) for code in LOAD_CODES}
    errors = sum(sum(w.errors.values()) for w in windows) - sum(load.values())
    timed = [(w.p99_ms, w.ok) for w in windows if w.p99_ms is not None and w.ok > 0]
    weight = sum(ok for _, ok in timed)
    quality = [w.low_confidence for w in windows if w.low_confidence is not None]
    answers = sum(total for _, total in quality)
    return Figures(
        things=len({w.thing for w in windows}),
        windows=len(windows),
        requests=requests,
        error_share=_share(errors, requests),
        overloaded_share=_share(load["OVERLOADED"], requests),
        deadline_share=_share(load["DEADLINE_EXCEEDED"], requests),
        p99_ms=sum(p99 * ok for p99, ok in timed) / weight if weight else None,
        low_confidence_share=_share(sum(low for low, _ in quality), answers) if answers else None,
    )


def _share(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def _percent(value: float) -> str:
    return f"{value * 100:.1f}%"


def _ms(value: float) -> str:
    return f"{value:.0f} ms"


@dataclass(frozen=True)
class _Rule:
    name: str
    figure: Callable[[Figures], float | None]
    limit: Callable[[Thresholds], Limit]
    show: Callable[[float], str]


_RULES = (
    _Rule("error share", lambda f: f.error_share, lambda t: t.errors, _percent),
    _Rule("OVERLOADED share", lambda f: f.overloaded_share, lambda t: t.overloaded, _percent),
    _Rule("DEADLINE_EXCEEDED share", lambda f: f.deadline_share, lambda t: t.deadline_exceeded, _percent),
    _Rule("p99", lambda f: f.p99_ms, lambda t: t.p99_ms, _ms),
    _Rule("low-confidence share", lambda f: f.low_confidence_share, lambda t: t.low_confidence, _percent),
)


def _judge(rule: _Rule, canary: Figures, fleet: Figures, thresholds: Thresholds) -> tuple[bool, str]:
    mine, theirs = rule.figure(canary), rule.figure(fleet)
    if mine is None or theirs is None:
        side = "the canary's" if mine is None else "the fleet's"
        return True, f"{rule.name}: not compared ({side} windows do not carry it)"
    limit = rule.limit(thresholds)
    times = f"{mine / theirs:.1f}x" if theirs > 0 else "above"
    if limit.exceeded(mine, theirs):
        return False, f"{rule.name} {rule.show(mine)} is {times} the fleet's {rule.show(theirs)}"
    return True, f"{rule.name} {rule.show(mine)} against the fleet's {rule.show(theirs)}"


def compare(canary: Figures, fleet: Figures, thresholds: Thresholds = Thresholds()) -> Verdict:
    """Promote only on enough traffic on both sides and no figure over its limit."""
    reasons: list[str] = []
    for side, figures in (("the canary", canary), ("the fleet", fleet)):
        if figures.requests < thresholds.min_requests:
            reasons.append(
                f"too little to judge: {figures.requests} requests from {side} in {figures.windows} "
                f"windows (at least {thresholds.min_requests} needed)"
            )
    if reasons:
        return Verdict(False, tuple(reasons), tuple(reasons))
    notes: list[str] = []
    for rule in _RULES:
        ok, text = _judge(rule, canary, fleet, thresholds)
        notes.append(text)
        if not ok:
            reasons.append(text)
    return Verdict(not reasons, tuple(reasons), tuple(notes))
