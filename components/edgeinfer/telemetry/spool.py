"""Publish telemetry windows to IoT Core; spool them to disk while it is unreachable.

`SpoolingPublisher.submit(window)` publishes at once when nothing is waiting; when a publish raises
(`TransportError`: the nucleus or IoT Core is unreachable) the window goes to the spool, a folder of
one JSON file per window named by its `seq`. Later windows queue behind the spooled ones so that IoT
Core receives every window in `seq` order. `pump()` (the component calls it from its loop) resends
the spool oldest first, backing off between failed attempts, and stops at the first failure.

The spool is bounded (`max_windows`, `max_bytes`): when full, the oldest window is deleted and counted
in `dropped` (persisted in `state.json`, so the count survives restarts and the next window reports
it). `state.json` also remembers the next `seq`, so a restarted component keeps the sequence
continuous. Every file is written to a temporary name in the same folder, flushed and renamed: a crash
never leaves a partial window behind.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgeinfer.files import atomic_write
from edgeinfer.messages import TelemetryWindow
from edgeinfer.transport import PubSub, TransportError

__all__ = ["Spool", "SpoolingPublisher", "atomic_write"]

log = logging.getLogger(__name__)

_STATE = "state.json"
_SUFFIX = ".json"


class Spool:
    """A bounded on-disk FIFO of windows, keyed by `seq`."""

    def __init__(
        self, directory: Path | str, *, max_windows: int = 8640, max_bytes: int = 50_000_000
    ) -> None:
        if max_windows < 1:
            raise ValueError("max_windows must be at least 1")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_windows = max_windows
        self.max_bytes = max_bytes
        self.dropped = 0
        self.next_seq = 0
        self._sizes: dict[int, int] = {}
        self._load()

    def _load(self) -> None:
        state = self.dir / _STATE
        if state.exists():
            try:
                doc = json.loads(state.read_text("utf-8"))
                self.dropped = int(doc.get("dropped", 0))
                self.next_seq = int(doc.get("next_seq", 0))
            except (OSError, ValueError, TypeError, AttributeError) as exc:
                log.warning("ignoring an unreadable spool state %s: %s", state, exc)
        for path in self.dir.iterdir():
            if path.name.startswith("."):  # a temporary file a crash left behind
                with contextlib.suppress(OSError):
                    path.unlink()
                continue
            if path.suffix != _SUFFIX or not path.stem.isdigit():
                continue
            self._sizes[int(path.stem)] = path.stat().st_size
        if self._sizes:
            self.next_seq = max(self.next_seq, max(self._sizes) + 1)
        self._enforce_bounds()

    # -------------------------------------------------------------------------------------- queries

    def __len__(self) -> int:
        return len(self._sizes)

    def seqs(self) -> list[int]:
        return sorted(self._sizes)

    def _path(self, seq: int) -> Path:
        return self.dir / f"{seq:012d}{_SUFFIX}"

    # ------------------------------------------------------------------------------------ mutations

    def put(self, seq: int, payload: bytes) -> None:
        atomic_write(self._path(seq), payload, mode=None, fsync=True)
        self._sizes[seq] = len(payload)
        self._enforce_bounds(keep=seq)

    def peek(self) -> tuple[int, bytes] | None:
        """The oldest spooled window, or None. An unreadable file is dropped and counted."""
        while self._sizes:
            seq = min(self._sizes)
            try:
                return seq, self._path(seq).read_bytes()
            except OSError as exc:
                log.warning("dropping unreadable spooled window %d: %s", seq, exc)
                self._sizes.pop(seq, None)
                self.dropped += 1
                self.save_state()
        return None

    def remove(self, seq: int) -> None:
        self._sizes.pop(seq, None)
        with contextlib.suppress(FileNotFoundError):
            self._path(seq).unlink()

    def note_seq(self, next_seq: int) -> None:
        """Remember the next sequence number (persisted with the state)."""
        if next_seq > self.next_seq:
            self.next_seq = next_seq
            self.save_state()

    def save_state(self) -> None:
        doc = {"next_seq": self.next_seq, "dropped": self.dropped}
        atomic_write(self.dir / _STATE, json.dumps(doc).encode("utf-8"), mode=None)

    def _enforce_bounds(self, keep: int | None = None) -> None:
        dropped = 0
        while self._sizes and (
            len(self._sizes) > self.max_windows or sum(self._sizes.values()) > self.max_bytes
        ):
            oldest = min(self._sizes)
            if oldest == keep and len(self._sizes) == 1:
                break  # one window always fits, whatever max_bytes says
            self.remove(oldest)
            dropped += 1
        if dropped:
            self.dropped += dropped
            log.warning("telemetry spool full: dropped the %d oldest window(s)", dropped)
            self.save_state()


class SpoolingPublisher:
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
        self.bus = bus
        self.topic = topic
        self.spool = spool
        self.qos = qos
        self._clock = clock
        self._retry_min = retry_s
        self._retry_max = max_retry_s
        self._retry = retry_s
        self._next_try = 0.0
        self.published = 0
        self.failures = 0
        self.online = True

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
        # Older windows go first; only when none is left waiting may this one skip the spool.
        if self.pump() and self._clock() >= self._next_try and self._send(payload, window.seq):
            return True
        try:
            self.spool.put(window.seq, payload)
        except OSError as exc:  # a full or read-only disk: the window is lost, and counted
            self.spool.dropped += 1
            log.error("cannot spool telemetry window %d: %s", window.seq, exc)
            return False
        log.debug("spooled telemetry window %d (%d waiting)", window.seq, len(self.spool))
        return False

    def pump(self) -> bool:
        """Resend spooled windows oldest first; False when some are still waiting."""
        while len(self.spool):
            if self._clock() < self._next_try:
                return False
            item = self.spool.peek()
            if item is None:
                break
            seq, payload = item
            if not self._send(payload, seq):
                return False
            self.spool.remove(seq)
        return True

    def _send(self, payload: bytes, seq: int) -> bool:
        try:
            self.bus.publish(self.topic, payload, target="iot", qos=self.qos)
        except Exception as exc:  # TransportError above all; any failure must spool, not lose
            self.failures += 1
            if self.online or not isinstance(exc, TransportError):
                log.warning("IoT Core unreachable, spooling telemetry (window %d): %s", seq, exc)
            self.online = False
            self._next_try = self._clock() + self._retry
            self._retry = min(self._retry * 2, self._retry_max)
            return False
        if not self.online:
            log.info("IoT Core reachable again: sending %d spooled window(s)", len(self.spool))
        self.online = True
        self._retry = self._retry_min
        self._next_try = 0.0
        self.published += 1
        return True

    def status(self) -> dict[str, Any]:
        return {
            "online": self.online,
            "published": self.published,
            "failures": self.failures,
            "pending": len(self.spool),
            "dropped": self.spool.dropped,
        }
