"""Store and forward to IoT Core: a bounded on-disk outbox, sent in order once IoT Core is back.

The one spool for messages bound for IoT Core: telemetry's windows (`edgeinfer.telemetry.spool`) and
the runtime's source results (`edgeinfer.runtime.forward`) both go through it. Neither nucleus keeps
a component's publishes on disk: the classic one holds QoS 1 publishes in an in-memory spooler
(`mqtt.spooler.maxSizeInBytes`, lost on a restart of the nucleus) and refuses them once it is full;
nucleus lite has no spooler, and a publish while it is offline fails (aws-greengrass-lite issue #1175;
iotcored's `iotcored_mqtt_publish` answers an error when coreMQTT is not connected).

`Outbox`: a folder with one file per message named by its `seq`, which orders them. A message with
no topic of its own is the payload alone (`<seq>.json`: what the telemetry spool always wrote); one
with a topic (`<seq>.msg`) starts with a JSON line naming it. Bounded by messages, bytes and age:
the oldest go first, each counted by why (`dropped_by`); the counts, how many were ever spooled and
the next `seq` are kept in `state.json`, so they survive restarts. Every file is written to a
temporary name in the same folder, synced and renamed: a crash never leaves a partial message.

`OutboxPublisher`: publishes at once when nothing waits, else behind what waits (a failed publish
spools the message), so IoT Core receives them in `seq` order; `pump()` resends the oldest first,
backing off between failed attempts, and stops at the first failure. A message leaves the outbox
only once the nucleus accepted its publish, so a crash between the two sends it again: delivery is
at least once (QoS 1), never lost for want of a retry once it is on disk.

`Forwarder`: an `OutboxPublisher` on its own thread behind a bounded queue, for a caller that must
never wait on the bus or the disk (the runtime's answering thread). What waits in that queue is in
memory only: `stop()` writes it to the outbox in one batch, with one sync, before it waits on a
publish under way; a crash loses it (at most `max_queued` messages, and the one being published).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import functools
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from edgeinfer.files import atomic_write
from edgeinfer.transport.base import PubSub, TransportError, UnauthorizedError

__all__ = ["DROP_REASONS", "Forwarder", "Outbox", "OutboxPublisher", "Stored"]

log = logging.getLogger(__name__)

_STATE = "state.json"
_PLAIN = ".json"  # the payload alone, for the publisher's own topic
_TOPICAL = ".msg"  # a JSON line {"topic": ...}, then the payload
# Why a message was dropped: the bound on messages or bytes, the bound on age, a file that could not
# be read back, one that could not be written, a topic the nucleus does not let the component publish
# to (retrying would never help, and would hold up every later message), or (a Forwarder's) a queue
# the disk did not keep up with, or a publish the nucleus had not answered when the Forwarder stopped.
DROP_REASONS = ("full", "age", "unreadable", "unwritable", "refused", "overflow", "stopped")
_SENT, _LATER, _REFUSED = "sent", "later", "refused"  # what `OutboxPublisher._send` did

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _locked(method: Callable[Concatenate[Outbox, _P], _R]) -> Callable[Concatenate[Outbox, _P], _R]:
    def run(self: Outbox, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self._lock:
            return method(self, *args, **kwargs)

    functools.update_wrapper(run, method)
    return run


def _sync_filesystem(folder: Path) -> None:
    """Make everything written under `folder` durable in one call: a batch's files, their data and
    their names. A folder's own fsync would keep the names but not what the files hold."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        syncfs = getattr(ctypes.CDLL(None, use_errno=True), "syncfs", None)  # Linux; not in `os`
        if syncfs is None:
            os.sync()
        elif syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), str(folder))
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Stored:
    """A message in the outbox: its place in the order, its topic (None: the publisher's) and payload."""

    seq: int
    payload: bytes
    topic: str | None = None


@dataclass
class _Entry:
    size: int
    suffix: str
    stamp: float  # wall time it was written


class Outbox:
    """A bounded on-disk FIFO of messages, keyed by `seq`. One owner drives it; its methods hold a lock,
    so that a Forwarder's `stop` can write the queue while its thread waits on a publish."""

    def __init__(
        self,
        directory: Path | str,
        *,
        max_items: int = 8640,
        max_bytes: int = 50_000_000,
        max_age_s: float | None = None,
        name: str = "outbox",
        wall: Callable[[], float] = time.time,
    ) -> None:
        if max_items < 1:
            raise ValueError("max_items must be at least 1")
        self.dir = Path(directory)  # made when the first message or count must be kept
        self.max_items = max_items
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.name = name  # what the log lines call it
        self.wall = wall
        self.dropped_by = dict.fromkeys(DROP_REASONS, 0)
        self.spooled = 0  # messages ever written here (counts that survive restarts)
        self.sent = 0  # messages sent from here
        self.next_seq = 0
        # In `seq` order (kept so by `put`), so the oldest is the first: no search per message.
        self._entries: dict[int, _Entry] = {}
        self._bytes = 0
        self._lock = threading.RLock()
        self._load()

    def _load(self) -> None:
        if not self.dir.is_dir():
            return
        self._load_state()
        for path in self.dir.iterdir():
            if path.name.startswith("."):  # a temporary file a crash left behind
                with contextlib.suppress(OSError):
                    path.unlink()
                continue
            if path.suffix not in (_PLAIN, _TOPICAL) or not path.stem.isdigit():
                continue
            st = path.stat()
            self._entries[int(path.stem)] = _Entry(st.st_size, path.suffix, st.st_mtime)
        self._entries = dict(sorted(self._entries.items()))
        self._bytes = sum(e.size for e in self._entries.values())
        if self._entries:
            self.next_seq = max(self.next_seq, max(self._entries) + 1)
        self._enforce_bounds()

    def _load_state(self) -> None:
        state = self.dir / _STATE
        if not state.exists():
            return
        try:
            doc = json.loads(state.read_text("utf-8"))
            self.next_seq = int(doc.get("next_seq", 0))
            self.spooled = int(doc.get("spooled", 0))
            self.sent = int(doc.get("sent", 0))
            by = doc.get("dropped_by")
            if isinstance(by, dict):
                for reason in DROP_REASONS:
                    self.dropped_by[reason] = int(by.get(reason, 0))
            else:  # a state written before drops had reasons: every one was the bound's
                self.dropped_by["full"] = int(doc.get("dropped", 0))
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            log.warning("ignoring an unreadable %s state %s: %s", self.name, state, exc)

    # -------------------------------------------------------------------------------------- queries

    @_locked
    def __len__(self) -> int:
        return len(self._entries)

    @property
    @_locked
    def dropped(self) -> int:
        """Messages lost, whatever the reason."""
        return sum(self.dropped_by.values())

    @property
    @_locked
    def size(self) -> int:
        return self._bytes

    @_locked
    def seqs(self) -> list[int]:
        return list(self._entries)

    def _oldest(self) -> int:
        return next(iter(self._entries))

    def _path(self, seq: int, suffix: str) -> Path:
        return self.dir / f"{seq:012d}{suffix}"

    # ------------------------------------------------------------------------------------ mutations

    @_locked
    def take_seq(self) -> int:
        """The next `seq`, for a caller without an order of its own. Not persisted on its own: a
        restart goes on after the newest file, and an empty outbox may start anywhere."""
        seq = self.next_seq
        self.next_seq += 1
        return seq

    @_locked
    def put(self, seq: int, payload: bytes, topic: str | None = None) -> None:
        """Write a message (raises OSError when the disk will not take it)."""
        self._write(seq, payload, topic, fsync=True)
        self._enforce_bounds(keep=seq)

    @_locked
    def put_many(self, items: Sequence[Stored]) -> int:
        """Write several messages, then one sync for them all rather than one per file (a stop's
        queue). How many were written; one the disk will not take is dropped and counted."""
        written, failed, last = 0, 0, None
        for item in items:
            try:
                self._write(item.seq, item.payload, item.topic, fsync=False)
                written, last = written + 1, item.seq
            except OSError as exc:
                failed += 1
                log.error("cannot keep message %d in the %s: %s", item.seq, self.name, exc)
        if written:
            try:
                _sync_filesystem(self.dir)
            except OSError as exc:  # written all the same: only a power cut would lose them now
                log.warning("cannot sync the %s's batch of %d: %s", self.name, written, exc)
        if failed:
            self.drop("unwritable", failed)
        self._enforce_bounds(keep=last)
        return written

    def _write(self, seq: int, payload: bytes, topic: str | None, *, fsync: bool) -> None:
        if topic is None:
            data, suffix = payload, _PLAIN
        else:
            data, suffix = json.dumps({"topic": topic}).encode() + b"\n" + payload, _TOPICAL
        self.dir.mkdir(parents=True, exist_ok=True)
        atomic_write(self._path(seq, suffix), data, mode=None, fsync=fsync)
        self._bytes -= self._entries[seq].size if seq in self._entries else 0
        newest = next(reversed(self._entries)) if self._entries else None
        self._entries[seq] = _Entry(len(data), suffix, self.wall())
        self._bytes += len(data)
        if newest is not None and seq < newest:  # out of order (a stop's batch is behind it): re-sort
            self._entries = dict(sorted(self._entries.items()))
        self.spooled += 1
        self.next_seq = max(self.next_seq, seq + 1)

    @_locked
    def peek(self) -> Stored | None:
        """The oldest message, or None. One too old is dropped, an unreadable one too; both counted."""
        self._expire()
        while self._entries:
            seq = self._oldest()
            try:
                return self._read(seq, self._entries[seq].suffix)
            except (OSError, ValueError) as exc:
                log.warning("dropping an unreadable message %d from the %s: %s", seq, self.name, exc)
                self.remove(seq)
                self.drop("unreadable")
        return None

    def _read(self, seq: int, suffix: str) -> Stored:
        data = self._path(seq, suffix).read_bytes()
        if suffix == _PLAIN:
            return Stored(seq, data)
        head, sep, payload = data.partition(b"\n")
        topic = json.loads(head).get("topic") if sep else None
        if not isinstance(topic, str):
            raise ValueError("no topic in its first line")
        return Stored(seq, payload, topic)

    @_locked
    def remove(self, seq: int) -> None:
        entry = self._entries.pop(seq, None)
        if entry is not None:
            self._bytes -= entry.size
            with contextlib.suppress(FileNotFoundError):
                self._path(seq, entry.suffix).unlink()

    @_locked
    def sent_one(self, seq: int) -> None:
        """`seq` went out: remove it and count it."""
        self.remove(seq)
        self.sent += 1
        if not self._entries or self.sent % 64 == 0:
            self.save_state()

    @_locked
    def drop(self, reason: str, n: int = 1) -> None:
        """Count `n` messages lost for `reason` (one of DROP_REASONS), persisted at once."""
        self.dropped_by[reason] += n
        self.save_state()

    @_locked
    def note_seq(self, next_seq: int) -> None:
        """Remember the next sequence number (persisted with the state)."""
        if next_seq > self.next_seq:
            self.next_seq = next_seq
            self.save_state()

    @_locked
    def save_state(self) -> None:
        doc = {
            "next_seq": self.next_seq,
            "dropped": self.dropped,
            "dropped_by": self.dropped_by,
            "spooled": self.spooled,
            "sent": self.sent,
        }
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            atomic_write(self.dir / _STATE, json.dumps(doc).encode("utf-8"), mode=None)
        except OSError as exc:  # the counts live on in memory; the next write may succeed
            log.warning("cannot write the %s state: %s", self.name, exc)

    def _expire(self) -> None:
        if self.max_age_s is None or not self._entries:
            return
        oldest_kept = self.wall() - self.max_age_s
        stale = []
        for seq, entry in self._entries.items():  # oldest first: stop at the first young enough
            if entry.stamp >= oldest_kept:
                break
            stale.append(seq)
        for seq in stale:
            self.remove(seq)
        if stale:
            log.warning("%s: dropped %d message(s) older than %.0f s", self.name, len(stale), self.max_age_s)
            self.drop("age", len(stale))

    def _enforce_bounds(self, keep: int | None = None) -> None:
        self._expire()
        dropped = 0
        while self._entries and (len(self._entries) > self.max_items or self._bytes > self.max_bytes):
            oldest = self._oldest()
            if oldest == keep and len(self._entries) == 1:
                break  # one message always fits, whatever max_bytes says
            self.remove(oldest)
            dropped += 1
        if dropped:
            log.warning("%s full: dropped the %d oldest message(s)", self.name, dropped)
            self.drop("full", dropped)
        elif keep is not None:
            self.save_state()  # beside the message's own file: the count of kept ones stays exact


class OutboxPublisher:
    """Publishes to IoT Core in `seq` order, through the outbox while a publish fails."""

    def __init__(
        self,
        bus: PubSub,
        topic: str,
        outbox: Outbox,
        *,
        qos: int = 1,
        clock: Callable[[], float] = time.monotonic,
        retry_s: float = 1.0,
        max_retry_s: float = 15.0,
    ) -> None:
        self.bus = bus
        self.topic = topic  # for messages without a topic of their own
        self.outbox = outbox
        self.qos = qos
        self._clock = clock
        self._retry_min = retry_s
        self._retry_max = max_retry_s
        self._retry = retry_s
        self._next_try = 0.0
        self.published = 0  # messages the nucleus accepted, straight or from the outbox
        self.failures = 0
        self.online = True

    def offer(self, seq: int, payload: bytes, topic: str | None = None) -> bool:
        """Publish now, or keep in the outbox; True when it (and everything before it) went out."""
        # Older messages go first; only when none is left waiting may this one skip the outbox. Newer
        # ones (a stopping Forwarder's queue, written meanwhile) wait behind it.
        if self.pump(before=seq) and self._clock() >= self._next_try:
            outcome = self._send(seq, payload, topic)
            if outcome != _LATER:
                return outcome == _SENT
        try:
            if topic is None:
                self.outbox.put(seq, payload)
            else:
                self.outbox.put(seq, payload, topic)
        except OSError as exc:  # a full or read-only disk: the message is lost, and counted
            self.outbox.drop("unwritable")
            log.error("cannot keep message %d in the %s: %s", seq, self.outbox.name, exc)
            return False
        log.debug("kept message %d in the %s (%d waiting)", seq, self.outbox.name, len(self.outbox))
        return False

    def pump(self, before: int | None = None) -> bool:
        """Resend waiting messages oldest first (only those before `seq` `before`, if given); False
        when some of them are still waiting."""
        while len(self.outbox):
            if self._clock() < self._next_try:
                return False
            item = self.outbox.peek()
            if item is None or (before is not None and item.seq >= before):
                break
            outcome = self._send(item.seq, item.payload, item.topic)
            if outcome == _LATER:
                return False
            if outcome == _SENT:
                self.outbox.sent_one(item.seq)
            else:
                self.outbox.remove(item.seq)
        return True

    def _send(self, seq: int, payload: bytes, topic: str | None) -> str:
        try:
            self.bus.publish(topic or self.topic, payload, target="iot", qos=self.qos)
        except UnauthorizedError as exc:
            log.error(
                "%s: the nucleus refuses message %d on %s: %s",
                self.outbox.name,
                seq,
                topic or self.topic,
                exc,
            )
            self.outbox.drop("refused")
            return _REFUSED
        except Exception as exc:  # TransportError above all; any failure must keep it, not lose it
            self.failures += 1
            if self.online or not isinstance(exc, TransportError):
                log.warning(
                    "IoT Core unreachable, keeping messages in the %s (%d): %s", self.outbox.name, seq, exc
                )
            self.online = False
            self._next_try = self._clock() + self._retry
            self._retry = min(self._retry * 2, self._retry_max)
            return _LATER
        if not self.online:
            log.info(
                "IoT Core reachable again: sending %d message(s) from the %s",
                len(self.outbox),
                self.outbox.name,
            )
        self.online = True
        self._retry = self._retry_min
        self._next_try = 0.0
        self.published += 1
        return _SENT

    def status(self) -> dict[str, Any]:
        return {
            "online": self.online,
            "published": self.published,
            "failures": self.failures,
            "pending": len(self.outbox),
            "dropped": self.outbox.dropped,
        }

    def counters(self) -> dict[str, int]:
        """What a telemetry window reports: waiting now; ever spooled, sent from the outbox, dropped."""
        return {
            "pending": len(self.outbox),
            "spooled": self.outbox.spooled,
            "sent": self.outbox.sent,
            "dropped": self.outbox.dropped,
        }


class Forwarder:
    """An `OutboxPublisher` on its own thread: `submit` only queues, so its caller never waits on the
    bus or the disk. The queue holds at most `max_queued` messages; beyond that the oldest queued is
    dropped and counted (`overflow`). The thread takes one message at a time, its `seq` given as it is
    taken, so what is still queued is always newer than anything it holds. `stop()` writes what is
    queued to the outbox, then waits for the thread."""

    def __init__(
        self,
        publisher: OutboxPublisher,
        *,
        max_queued: int = 10_000,
        on_change: Callable[[dict[str, int]], None] | None = None,
        tick_s: float = 0.25,
        report_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.publisher = publisher
        self.outbox = publisher.outbox
        self.max_queued = max_queued
        # Called on the forwarder's thread when the counters change, and by `stop` at the end.
        self.on_change = on_change
        self.tick_s = tick_s  # how often an idle forwarder looks at the outbox again
        self.report_s = report_s  # counters go to `on_change` at most this often (and at the end)
        self._clock = clock
        self._last_report = -float("inf")
        self._queue: collections.deque[tuple[bytes, str | None]] = collections.deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._overflow = 0
        self._held: Stored | None = None  # taken from the queue, neither published nor on disk yet
        self._thread: threading.Thread | None = None
        self._reported: dict[str, int] | None = None
        self._report_lock = threading.Lock()

    def start(self) -> Forwarder:
        self._thread = threading.Thread(target=self._run, name=f"edgeinfer-{self.outbox.name}", daemon=True)
        self._thread.start()
        return self

    def submit(self, payload: bytes, topic: str | None = None) -> None:
        with self._cond:
            late = self._stopping
            if not late:
                if len(self._queue) >= self.max_queued:
                    self._queue.popleft()
                    self._overflow += 1
                self._queue.append((payload, topic))
                self._cond.notify()
        if late:  # nothing takes it any more; only a caller that outlives the stop gets here
            log.warning("%s: a message submitted after the stop dropped", self.outbox.name)
            self.outbox.drop("stopped")

    def queued(self) -> int:
        with self._cond:
            return len(self._queue)

    def stopping(self) -> bool:
        with self._cond:
            return self._stopping

    def stop(self, timeout: float = 10.0) -> bool:
        """Write what is queued to the outbox (one batch, one sync: no publish the nucleus is slow to
        answer holds it up), then wait up to `timeout` for the thread to finish what it holds. False
        when it did not: the one message it holds, in a publish not yet answered and not on disk, is
        counted as dropped (`stopped`), even if that publish is answered in the moment after."""
        with self._cond:
            self._stopping = True
            queued = list(self._queue)
            self._queue.clear()
            overflow, self._overflow = self._overflow, 0
            self._cond.notify()
        # The thread takes no more now, so these `seq`s come after whatever it holds.
        batch = [Stored(self.outbox.take_seq(), payload, topic) for payload, topic in queued]
        self._count_overflow(overflow)
        if batch:
            self.outbox.put_many(batch)
        ended = self._join(timeout)
        self.outbox.save_state()
        self._report(force=True)
        return ended

    def _join(self, timeout: float) -> bool:
        thread, self._thread = self._thread, None
        if thread is None:
            return True
        thread.join(timeout)
        if not thread.is_alive():
            return True
        with self._cond:
            held, self._held = self._held, None
        log.error(
            "%s: the forwarder did not stop within %.3g s; %d message in a publish not yet answered dropped",
            self.outbox.name,
            timeout,
            0 if held is None else 1,
        )
        if held is not None:
            self.outbox.drop("stopped")
        return False

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._queue and not self._stopping:
                    self._cond.wait(self.tick_s)
                if self._stopping:  # `stop` wrote what was queued
                    return
                item = None
                if self._queue:
                    payload, topic = self._queue.popleft()
                    item = Stored(self.outbox.take_seq(), payload, topic)
                self._held = item
                overflow, self._overflow = self._overflow, 0
            try:
                self._step(item, overflow)
            except Exception:  # the thread must outlive any one failure: the outbox keeps the rest
                log.exception("the %s's forwarder failed a step", self.outbox.name)
            with self._cond:
                self._held = None

    def _step(self, item: Stored | None, overflow: int) -> None:
        self._count_overflow(overflow)
        if item is not None:
            self.publisher.offer(item.seq, item.payload, item.topic)
        else:
            self.publisher.pump()
        self._report()

    def _count_overflow(self, overflow: int) -> None:
        if overflow:
            log.warning(
                "%s: %d message(s) dropped, the queue to the disk was full", self.outbox.name, overflow
            )
            self.outbox.drop("overflow", overflow)

    def counters(self) -> dict[str, int]:
        return self.publisher.counters()

    def _report(self, *, force: bool = False) -> None:
        with self._report_lock:  # `stop` reports too, maybe while the thread is still in a step
            if self.on_change is None or (not force and self._clock() - self._last_report < self.report_s):
                return
            now = self.counters()
            if now == self._reported:
                return
            self._reported = now
            self._last_report = self._clock()
            try:
                self.on_change(now)
            except Exception:
                log.exception("reporting the %s's counters failed", self.outbox.name)
