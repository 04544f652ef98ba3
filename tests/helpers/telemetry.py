"""Timing records as the runtime publishes them, with random but plausible stage times."""

from __future__ import annotations

import random
from typing import Any

from edgeinfer.messages import ErrorCode, Latency, TimingRecord


def make_record(
    rng: random.Random,
    *,
    status: str = "ok",
    code: ErrorCode | None = None,
    provider: str = "CPUExecutionProvider",
    **flags: Any,
) -> TimingRecord:
    queue = rng.expovariate(1 / 3.0)
    decode = rng.uniform(0.5, 2.0)
    inference = rng.lognormvariate(1.0, 0.4)
    post = rng.uniform(0.01, 0.2)
    return TimingRecord(
        id=f"r{rng.randrange(10**9)}",
        status=status,  # type: ignore[arg-type]
        latency_ms=Latency(queue, decode, inference, post, queue + decode + inference + post),
        batch_size=rng.randint(1, 8),
        provider=provider,
        code=code,
        queue_depth=rng.randint(0, 20),
        end=1.7e9,
        **flags,
    )
