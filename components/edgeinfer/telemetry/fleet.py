"""The fleet's figures: one row per thing, and the one "worst first" order.

`figures_of()` reduces one window to the figures a fleet row shows; `worst_first()` is the one order
both `watch --fleet` (`dashboard.FleetDashboard`) and `report --fleet` sort by. Standard library only:
the command line imports this for its help text.

`model_label()` reads the model's identity from the window document: its `models` list (one
`{name, version, …}` object per model that answered in the window, see `messages.ModelQuality`), or
one `model` object; a row shows "–" for a window without (an older telemetry, or no answers).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgeinfer.messages import TelemetryWindow

__all__ = [
    "DEFAULT_STALE_WINDOWS",
    "WORST_FIRST",
    "ThingFigures",
    "figures_of",
    "model_label",
    "worst_first",
]

DEFAULT_STALE_WINDOWS = 3
WORST_FIRST = "gone stale first, then by error share, then by total p99, highest first"


@dataclass(frozen=True)
class ThingFigures:
    """What a fleet row says about one thing: over its latest window (watch) or a recording (report)."""

    thing: str
    requests: int
    errors: int
    offloaded: int
    throughput_rps: float
    p50_ms: float | None  # total latency; None when no request succeeded
    p99_ms: float | None
    model: str | None = None

    @property
    def error_share(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    @property
    def offload_share(self) -> float:
        return self.offloaded / self.requests if self.requests else 0.0


def _identity(doc: Any) -> str | None:
    if not isinstance(doc, Mapping):
        return None
    name, version = doc.get("name"), doc.get("version")
    parts = [str(p) for p in (name, version) if isinstance(p, (str, int, float)) and str(p)]
    return " ".join(parts) or None


def model_label(doc: Mapping[str, Any]) -> str | None:
    """The model(s) a window says it served, as "name version[, name version]"; None when it says none."""
    models = doc.get("models")
    if isinstance(models, list):
        labels = [label for label in (_identity(m) for m in models) if label]
        return ", ".join(labels) or None
    return _identity(doc.get("model"))


def figures_of(window: TelemetryWindow, model: str | None = None) -> ThingFigures:
    errors = sum(window.errors.values())
    total = window.latency_ms.get("total")
    served = total is not None and window.count > errors  # a window without an ok request has no latency
    return ThingFigures(
        thing=window.thing,
        requests=window.count,
        errors=errors,
        offloaded=window.offloaded,
        throughput_rps=window.throughput_rps,
        p50_ms=total.p50 if served and total is not None else None,
        p99_ms=total.p99 if served and total is not None else None,
        model=model,
    )


def worst_first(figures: ThingFigures, stale: bool = False) -> tuple[bool, float, float, str]:
    """Sort key: a silent thing first (its figures are old and it may be down), then the share of its
    requests that failed, then its total p99 (none sorts last), then by name so the order is stable."""
    p99 = figures.p99_ms if figures.p99_ms is not None else -1.0
    return (not stale, -figures.error_share, -p99, figures.thing)
