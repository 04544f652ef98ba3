"""The placement seam: one decision per request — run it on the edge, hand it to the cloud, or refuse it.

The server asks `PlacementPolicy.decide(request, ctx)` once per accepted request, before any decode
work is spent on it, and acts on the `Decision`:

- `edge` (the default `EdgeOnly` policy, for everything): decode, batch and run here;
- `cloud`: `Offloader.offload(request, ctx, reply)` takes the request (e.g. publishes it on
  `edgeinfer/{thing}/offload`) and **must call `reply(result)` exactly once** — with the cloud's result
  (`placement="cloud"`) or with an error result of its own (e.g. DEADLINE_EXCEEDED when the cloud does
  not answer in time). `reply` publishes to the request's reply topic on the bus it came from and
  records the timing; a second call is ignored. Without an offloader, `cloud` runs on the edge;
- `reject`: answered at once with `decision.code` (e.g. OVERLOADED) and `decision.reason`.

A policy may also define `on_batch_start(batch_size)` and `on_batch_end(batch_size, compute_ms)`,
which the engine thread calls around every batch, `on_result(request_id, result)`, called with
every result the server publishes, and `on_late_arrival(age_ms, left_ms)`, called for a request
answered DEADLINE_EXCEEDED on arrival, before any decision (`age_ms`: since its sending, None when it
did not say; `left_ms`: 0 or less) — what `decide` never sees of a backlog upstream. They must be
quick and must not raise. With an offloader set,
`cascade(request, edge_result, reply) -> bool` is asked about every edge answer: True means the policy
holds that answer, asks the cloud, and calls `reply` exactly once (with the cloud's or the held one).

`decide` runs on the transport thread: it must be quick and must not raise (an exception counts as
`edge`). `HybridPlacement` (`edgeinfer.runtime.placement.hybrid`) fills this seam; the component wires
it with `InferenceServer(..., placement=..., offloader=...)` or `server.set_placement(policy, offloader)`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from edgeinfer.messages import ErrorCode, Request, Result
from edgeinfer.transport import Target

__all__ = [
    "EDGE",
    "Decision",
    "EdgeOnly",
    "Offloader",
    "PlacementContext",
    "PlacementPolicy",
    "Reply",
    "Where",
]

Where = Literal["edge", "cloud", "reject"]
Reply = Callable[[Result], None]


@dataclass(frozen=True)
class Decision:
    """Where a request is served. The predictions are the policy's, for logs and tests."""

    where: Where = "edge"
    code: ErrorCode | None = None  # for `reject`
    reason: str = ""
    local_ms: float | None = None
    cloud_ms: float | None = None
    budget_ms: float | None = None


EDGE = Decision()


@dataclass(frozen=True)
class PlacementContext:
    """What the runtime knows when a request arrives."""

    thing: str
    target: Target  # the bus the request came from
    queue_depth: int  # decoded requests waiting for the engine
    outstanding: int  # admitted, not yet running (decoding + queued)
    max_queue_size: int
    max_batch_size: int
    engine_ms_per_batch: float  # moving average of recent batch runs (0 before the first)
    mean_batch_size: float  # of recent batches
    deadline_left_ms: float | None  # None: no deadline; counted from when it was sent, when known
    provider: str
    age_ms: float | None = None  # since the client sent it (its `sent_at`), when it says: the lag upstream
    # Given to `Offloader.offload` only: serve the request on the edge after all (a late or failed
    # offload); its result then goes out through the normal edge path, still exactly once.
    local: Callable[[], None] | None = None


class PlacementPolicy(Protocol):
    def decide(self, request: Request, ctx: PlacementContext) -> Decision: ...


class Offloader(Protocol):
    def offload(self, request: Request, ctx: PlacementContext, reply: Reply) -> None: ...


class EdgeOnly:
    """Everything on the edge (the default until the hybrid router configures a policy)."""

    def decide(self, request: Request, ctx: PlacementContext) -> Decision:
        return EDGE
