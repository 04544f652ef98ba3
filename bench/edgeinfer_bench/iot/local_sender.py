"""A flood on local pub/sub: another component's process that publishes requests to the runtime over
Greengrass IPC (the real awsiotsdk client, `GreengrassIpcBus`), open loop, as a camera component
publishing faster than the device serves would.

The sender keeps at most `max_inflight` PublishToTopic calls unanswered by the nucleus: a component
that hands the client every publish without waiting would hold the whole backlog in its own memory
once the nucleus stops reading it (its connection's buffer is full), so the bound is the sender's
own, and a request it could not hand over in time is not sent (counted, as `not_sent`), never
queued without end. Every request sent carries its id (`label-i`) and `sent_at`; the report names
every id sent.
"""

from __future__ import annotations

import array
import os
import resource
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from edgeinfer.errors import EdgeinferError
from edgeinfer_bench.iot.spawned import SpawnedSender
from edgeinfer_bench.requests import Template

__all__ = ["LocalFlood", "LocalSpec"]

ACK_TIMEOUT_S = 60.0  # the sender waits this long for the nucleus to answer its last publishes
MAX_INFLIGHT = 256


@dataclass(frozen=True)
class LocalSpec:
    """`rate` req/s for `seconds` on `topic`, as the component whose IPC socket and token are given."""

    socket: str
    token: str
    topic: str
    parts: list[Template]
    label: str
    rate: float
    seconds: float
    max_inflight: int = MAX_INFLIGHT


def sender_main(conn: Connection, spec: LocalSpec) -> None:
    """The flood in its own process: says `ready`, waits for `go`, sends, says `ended` at its last
    hand-off and `done` with its figures once the nucleus answered every publish."""
    from edgeinfer.transport.ipc import GreengrassIpcBus

    bus = GreengrassIpcBus.connect(spec.socket, spec.token)
    try:
        _warm_up(bus, spec)
        conn.send(("ready", None))
        if conn.poll(120) and conn.recv()[0] == "go":
            _send(conn, bus, spec)
    except KeyboardInterrupt:
        pass
    finally:
        bus.close()
        conn.close()


def _warm_up(bus: Any, spec: LocalSpec) -> None:
    """A window's worth of publishes on a topic nobody reads: the client's buffers and this process's
    lazy set-up are spent here, so that its memory before the flood is what it holds in one."""
    done = threading.Semaphore(0)
    body = spec.parts[0].body("warm-up", time.time())
    for _ in range(spec.max_inflight):
        bus.publish_nowait(f"{spec.topic}/warm-up", body, on_done=lambda _exc: done.release())
    for _ in range(spec.max_inflight):
        if not done.acquire(timeout=ACK_TIMEOUT_S):
            raise EdgeinferError("the nucleus did not answer the flood's warm-up publishes")


def _send(conn: Connection, bus: Any, spec: LocalSpec) -> None:
    from edgeinfer import procfs

    me = os.getpid()
    room = threading.Semaphore(spec.max_inflight)
    lock = threading.Lock()
    acked = [0, 0]  # answered, of which refused

    def on_done(exc: Exception | None) -> None:
        with lock:
            acked[0] += 1
            acked[1] += exc is not None
        room.release()

    sent = array.array("q")  # the indices of the requests sent (`label-i`): compact, as the flood grows
    not_sent = 0
    rss_peak = 0
    t0 = time.monotonic()
    start_wall = time.time()
    for i in range(round(spec.rate * spec.seconds)):
        due = t0 + i / spec.rate
        now = time.monotonic()
        if now >= t0 + spec.seconds:
            break
        if due > now:
            time.sleep(due - now)
        # Wait for room until the next request is due; past that, this one is not sent.
        if not room.acquire(timeout=max(0.0, due + 1 / spec.rate - time.monotonic())):
            not_sent += 1
            continue
        body = spec.parts[i % len(spec.parts)].body(f"{spec.label}-{i}", time.time())
        bus.publish_nowait(spec.topic, body, on_done=on_done)
        sent.append(i)
        if i % 200 == 0:
            rss_peak = max(rss_peak, procfs.process_rss_bytes(me) or 0)
    end_wall = time.time()
    conn.send(("ended", end_wall))
    limit = time.monotonic() + ACK_TIMEOUT_S
    while time.monotonic() < limit:
        with lock:
            if acked[0] >= len(sent):
                break
        time.sleep(0.05)
    with lock:
        report = {
            "sent": [f"{spec.label}-{i}" for i in sent],
            "start": start_wall,
            "end": end_wall,
            "target": round(spec.rate * spec.seconds),
            "not_sent": not_sent,
            "publish_refused": acked[1],
            "publish_unanswered": len(sent) - acked[0],
            "cpu_s": time.process_time(),
            "rss_peak_mb": max(rss_peak, procfs.process_rss_bytes(me) or 0) / 2**20,
            "rss_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
    conn.send(("done", report))


class LocalFlood(SpawnedSender):
    """The sender's process."""

    def __init__(self, spec: LocalSpec) -> None:
        super().__init__(
            sender_main, spec, name="local-flood", who="the flood's process", limit=spec.seconds + 60
        )

    def report(self) -> dict[str, Any]:
        report: dict[str, Any] = self._expect("done", ACK_TIMEOUT_S + 10)
        return report
