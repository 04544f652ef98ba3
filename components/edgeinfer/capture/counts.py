"""Capture's counters, one thread-safe tally shared by the hook, the spool and the uploader.

The answering threads (records chosen, a full queue), the writer (spooled, dropped by a cap) and the
uploader (uploaded, failures) all count here, each increment under one lock. Each increment is also
handed to `sink` (the runtime's timing publisher), which carries it to the telemetry window of the
moment it happened: a window counts what happened in it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

__all__ = ["COUNTERS", "CaptureCounts", "Sink"]

# The names on the wire (a telemetry window's `capture`), in the order a reader wants them.
COUNTERS = (
    "chosen",  # answers a sampler chose
    "busy",  # chosen, but the writer's queue was full: not captured
    "spooled",  # records written to the spool
    "uploaded",  # records whose two objects are stored
    "dropped_size",  # records dropped, oldest first, to keep the spool within spoolMaxMb
    "dropped_age",  # records dropped for being older than spoolMaxAgeH
    "upload_failures",  # failed upload attempts (each backs off and retries)
    "no_image",  # chosen, but its image could not be read (an image_path gone meanwhile)
    "bad_image",  # chosen, but its image does not decode
)

Sink = Callable[[Mapping[str, int]], None]


def _nowhere(_counts: Mapping[str, int]) -> None:
    pass


class CaptureCounts:
    def __init__(self, sink: Sink = _nowhere) -> None:
        self.sink = sink  # set by the runtime once its publisher exists
        self._totals = dict.fromkeys(COUNTERS, 0)
        self._lock = threading.Lock()

    def add(self, name: str, n: int = 1) -> None:
        if n <= 0:
            return
        with self._lock:
            self._totals[name] = self._totals.get(name, 0) + n
        self.sink({name: n})

    def __getitem__(self, name: str) -> int:
        with self._lock:
            return self._totals.get(name, 0)

    def totals(self) -> dict[str, int]:
        """Since this process started."""
        with self._lock:
            return dict(self._totals)
