"""The exactly-once ledger: every offload in flight, closed by exactly one outcome.

Every offload is opened (`OffloadPolicy.begin_offload`) until exactly one of these happens first: the
cloud answer arrives (`on_cloud_result`), its fallback time passes (`due`), or the publish fails
(`on_publish_failed`). The first to `close` (or `take_due`) the ticket wins; anything later for the
same wire id finds nothing and is ignored. A request whose cloud answer does not come in time is
served locally (or, for a low-confidence cascade, the local answer that was held back is published).
Tickets that timed out are remembered a while (`late`): a late answer still measures the cloud.

Not thread-safe on its own: `OffloadPolicy` holds its lock around every call.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

from edgeinfer.messages import Result

__all__ = ["CloudOutcome", "Fallback", "Ledger", "Ticket"]

T = TypeVar("T")


@dataclass
class Ticket(Generic[T]):
    """One offload in flight. `wire_id` is the id sent to the cloud (unique among those in flight)."""

    wire_id: str
    request_id: str
    item: T
    sent_at: float
    fallback_at: float
    payload_bytes: int
    held: Result | None = None  # a cascade's local answer, published if the cloud does not answer
    probe: bool = False
    ahead: int = 0  # this device's offloads already in flight when it was sent


@dataclass
class CloudOutcome(Generic[T]):
    """What to do with a cloud answer: publish `result` (already carrying the client's request id),
    or, when `serve_locally`, serve `ticket.item` locally instead (the cloud failed)."""

    ticket: Ticket[T]
    result: Result | None
    serve_locally: bool = False


@dataclass
class Fallback(Generic[T]):
    """An offload whose answer did not come in time: publish `ticket.held` or serve it locally."""

    ticket: Ticket[T]
    reason: str


class Ledger(Generic[T]):
    """Open tickets by wire id, and the last `keep_late` that timed out."""

    def __init__(self, keep_late: int = 1024) -> None:
        self._open: dict[str, Ticket[T]] = {}
        self._late: OrderedDict[str, Ticket[T]] = OrderedDict()
        self._seq = itertools.count(1)
        self.keep_late = keep_late

    def __len__(self) -> int:
        return len(self._open)

    def wire_id(self, request_id: str) -> str:
        """The request's own id, or a unique variant while one with that id is still in flight."""
        if request_id in self._open:
            return f"{request_id}~{next(self._seq)}"
        return request_id

    def open(self, ticket: Ticket[T]) -> None:
        self._open[ticket.wire_id] = ticket

    def close(self, wire_id: str) -> Ticket[T] | None:
        """The open ticket, removed; None when it was already closed (or never opened)."""
        return self._open.pop(wire_id, None)

    def late(self, wire_id: str) -> Ticket[T] | None:
        """A ticket that timed out before its answer came, removed (a second late answer finds none)."""
        return self._late.pop(wire_id, None)

    def take_due(self, now: float) -> list[Ticket[T]]:
        """Open tickets whose fallback time has come, closed and remembered as late."""
        due = [t for t in self._open.values() if t.fallback_at <= now]
        for ticket in due:
            del self._open[ticket.wire_id]
            self._late[ticket.wire_id] = ticket
            while len(self._late) > self.keep_late:
                self._late.popitem(last=False)
        return due

    def next_due(self) -> float | None:
        return min((t.fallback_at for t in self._open.values()), default=None)

    def drain(self) -> list[Ticket[T]]:
        """Every open ticket, closed (on shutdown, so that the caller can still answer each one)."""
        out = list(self._open.values())
        self._open.clear()
        return out
