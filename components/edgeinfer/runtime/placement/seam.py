"""The placement seam: one decision per request — run it on the edge, hand it to the cloud, or refuse it.

`PlacementPolicy` is the base class a policy subclasses; each hook has a no-op default, so a policy
overrides only what it needs and the server calls each one directly. The server asks
`decide(request, ctx)` once per accepted request, before any decode work is spent on it, and acts on
the `Decision`:

- `edge` (the base's answer, and `EdgeOnly`'s for everything): decode, batch and run here;
- `cloud`: `Offloader.offload(request, ctx, reply)` takes the request (e.g. publishes it on
  `edgeinfer/{thing}/offload`) and **must call `reply(result)` exactly once** — with the cloud's result
  (`placement="cloud"`) or with an error result of its own (e.g. DEADLINE_EXCEEDED when the cloud does
  not answer in time). `reply` publishes to the request's reply topic on the bus it came from and
  records the timing; a second call is ignored. Without an offloader, `cloud` runs on the edge;
- `reject`: answered at once with `decision.code` (e.g. OVERLOADED) and `decision.reason`.

What the policy learns from the runtime: `on_batch_start` / `on_batch_end` around every batch (on the
engine thread), `on_result` with every result the server publishes, and `on_late_arrival` for a
request answered DEADLINE_EXCEEDED on arrival, before any decision — what `decide` never sees of a
backlog upstream. With an offloader set, `cascade(request, edge_result, reply)` is asked about every
edge answer: True means the policy holds that answer, asks the cloud, and calls `reply` exactly once
(with the cloud's or the held one). `apply_config(cfg)` follows each live configuration change (the
keys the server applies live, e.g. `maxIpcMessageBytes`), as the server's own `apply_config` does.

Every hook runs on a serving thread: it must be quick. One that raises is logged and counts as the
default (`decide`: `edge`; `cascade`: False); serving goes on. `HybridPlacement`
(`edgeinfer.runtime.placement.hybrid`) fills this seam; the component wires it with
`InferenceServer(..., placement=..., offloader=...)` or `server.set_placement(policy, offloader)`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from edgeinfer.messages import ErrorCode, Request, Result
from edgeinfer.transport import Target

if TYPE_CHECKING:
    from edgeinfer.runtime.config import RuntimeConfig

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


class PlacementPolicy:
    """Where each request is served, and what the policy learns from serving. Every hook is a no-op
    here (`decide`: the edge; `cascade`: no)."""

    def decide(self, request: Request, ctx: PlacementContext) -> Decision:
        return EDGE

    def on_batch_start(self, batch_size: int) -> None:
        """A batch of `batch_size` starts on the engine."""

    def on_batch_end(self, batch_size: int, compute_ms: float) -> None:
        """That batch took `compute_ms` on the engine."""

    def on_result(self, request_id: str | None, result: Result) -> None:
        """Every result the server publishes, as computed (before a late or too-large substitution)."""

    def on_late_arrival(self, age_ms: float | None, left_ms: float) -> None:
        """A request answered DEADLINE_EXCEEDED on arrival (`age_ms`: since its sending, None when it
        did not say; `left_ms`: 0 or less)."""

    def cascade(self, request: Request, result: Result, reply: Reply) -> bool:
        """With an offloader: True takes over the edge answer `result`; `reply` then gets exactly one."""
        return False

    def apply_config(self, cfg: RuntimeConfig) -> None:
        """A live configuration change: take up what the policy reads from the runtime's keys."""


class Offloader(Protocol):
    def offload(self, request: Request, ctx: PlacementContext, reply: Reply) -> None: ...


class EdgeOnly(PlacementPolicy):
    """Everything on the edge (the default until the hybrid router configures a policy)."""
