"""Where each request is served: the runtime's placement seam and the hybrid edge/cloud policy.

- `seam`: what the server asks: `PlacementPolicy`, the base class whose hooks (`decide` → `Decision`,
  the batch, result and late-arrival feedback, `cascade`) do nothing until a policy overrides them,
  `Offloader.offload`, and the edge-only default;
- `config`: the recipe's `placement` object (`OffloadConfig`);
- `estimators`: least-squares latency models of the engine and of the cloud's round trip;
- `breaker`: the circuit breaker in front of the cloud;
- `ledger`: offloads in flight, each closed by exactly one outcome;
- `policy`: `OffloadPolicy`, pure logic with an injected clock (serve here, offload, or refuse);
- `hybrid`: `HybridPlacement`, the bus adapter that fills the seam with the policy.
"""

from edgeinfer.runtime.placement.breaker import BreakerState, CircuitBreaker
from edgeinfer.runtime.placement.config import OffloadConfig
from edgeinfer.runtime.placement.estimators import CloudLatencyModel, LinearFit, ServiceTimeModel
from edgeinfer.runtime.placement.hybrid import HybridPlacement, create_placement
from edgeinfer.runtime.placement.ledger import CloudOutcome, Fallback, Ledger, Ticket
from edgeinfer.runtime.placement.policy import OffloadPolicy
from edgeinfer.runtime.placement.seam import (
    EDGE,
    Decision,
    EdgeOnly,
    Offloader,
    PlacementContext,
    PlacementPolicy,
    Reply,
    Where,
)

__all__ = [
    "EDGE",
    "BreakerState",
    "CircuitBreaker",
    "CloudLatencyModel",
    "CloudOutcome",
    "Decision",
    "EdgeOnly",
    "Fallback",
    "HybridPlacement",
    "Ledger",
    "LinearFit",
    "OffloadConfig",
    "OffloadPolicy",
    "Offloader",
    "PlacementContext",
    "PlacementPolicy",
    "Reply",
    "ServiceTimeModel",
    "Ticket",
    "Where",
    "create_placement",
]
