"""Telemetry windows as the canary reads them: a fleet's and its canaries', healthy or degraded."""

from __future__ import annotations

import json
from typing import Any

from edgeinfer.messages import StageQuantiles, TelemetryWindow


def telemetry_window(
    thing: str,
    seq: int,
    *,
    count: int = 40,
    errors: dict[str, int] | None = None,
    p99_ms: float = 180.0,
    models: list[dict[str, Any]] | None = None,
) -> bytes:
    """One window's payload, as the Telemetry component publishes it (plus `models` when given)."""
    window = TelemetryWindow(
        thing=thing,
        seq=seq,
        window_s=10.0,
        count=count,
        errors=dict(errors or {}),
        dropped=0,
        offloaded=0,
        throughput_rps=count / 10.0,
        latency_ms={"total": StageQuantiles(p50=p99_ms / 3, p90=p99_ms / 1.5, p99=p99_ms, max=p99_ms * 1.2)},
        batch={},
        queue_depth={},
        provider="CPUExecutionProvider",
        system={},
        timestamp="2026-01-01T00:00:00Z",
    )
    if models is None:
        return window.to_json()
    return json.dumps({**window.to_dict(), "models": models}).encode()


def fleet_windows(things: list[str], per_thing: int = 3, **kwargs: Any) -> list[bytes]:
    """`per_thing` windows of each thing, thing after thing within each round."""
    return [telemetry_window(thing, seq, **kwargs) for seq in range(per_thing) for thing in things]
