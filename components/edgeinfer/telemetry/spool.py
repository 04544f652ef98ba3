"""Publish telemetry windows to IoT Core; spool them to disk while it is unreachable.

The spool is the project's one outbox (`edgeinfer.transport.outbox`), which the runtime's source
results use too; this module only speaks of windows. `SpoolingPublisher.submit(window)` publishes at
once when nothing is waiting; when a publish raises (`TransportError`: the nucleus or IoT Core is
unreachable) the window goes to the spool, a folder of one JSON file per window named by its `seq`.
Later windows queue behind the spooled ones so that IoT Core receives every window in `seq` order.
`pump()` (the component calls it from its loop) resends the spool oldest first, backing off between
failed attempts, and stops at the first failure.

The spool is bounded (`max_windows`, `max_bytes`): when full, the oldest window is deleted and counted
in `dropped` (persisted in `state.json`, so the count survives restarts and the next window reports
it). `state.json` also remembers the next `seq`, so a restarted component keeps the sequence
continuous.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from edgeinfer.files import atomic_write
from edgeinfer.messages import TelemetryWindow
from edgeinfer.transport import PubSub
from edgeinfer.transport.outbox import Outbox, OutboxPublisher

__all__ = ["Spool", "SpoolingPublisher", "atomic_write"]


class Spool(Outbox):
    """The outbox of telemetry windows, keyed by their `seq`; its bound on messages is `max_windows`."""

    def __init__(
        self, directory: Path | str, *, max_windows: int = 8640, max_bytes: int = 50_000_000
    ) -> None:
        Path(directory).mkdir(parents=True, exist_ok=True)  # an unusable folder fails the start
        super().__init__(directory, max_items=max_windows, max_bytes=max_bytes, name="telemetry spool")

    @property
    def max_windows(self) -> int:
        return self.max_items

    @max_windows.setter
    def max_windows(self, value: int) -> None:
        self.max_items = value


class SpoolingPublisher(OutboxPublisher):
    """Publishes windows on `topic` to IoT Core in `seq` order, through the spool when offline."""

    def __init__(
        self,
        bus: PubSub,
        topic: str,
        spool: Spool,
        *,
        qos: int = 1,
        clock: Callable[[], float] = time.monotonic,
        retry_s: float = 1.0,
        max_retry_s: float = 15.0,
    ) -> None:
        super().__init__(bus, topic, spool, qos=qos, clock=clock, retry_s=retry_s, max_retry_s=max_retry_s)
        self.spool = spool

    @property
    def next_seq(self) -> int:
        """The `seq` a new window should carry to keep the sequence continuous across restarts."""
        return self.spool.next_seq

    def decorate(self, window: TelemetryWindow) -> None:
        """Report the spool's own figures in the window (pending windows, windows lost to the bound)."""
        window.system["spool"] = {"pending": len(self.spool), "dropped": self.spool.dropped}

    def submit(self, window: TelemetryWindow) -> bool:
        """Publish `window` now, or spool it; True when it (and everything before it) went out."""
        self.decorate(window)
        payload = window.to_json()
        self.spool.note_seq(window.seq + 1)
        return self.offer(window.seq, payload)
