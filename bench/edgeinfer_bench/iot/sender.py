"""The load of `edgeinfer bench iot`: a sender process of its own (its own MQTT 5 connection) that
publishes one load's requests open loop and names every request it sent once the broker acknowledged
them, so that the accounting knows what it waits for."""

from __future__ import annotations

import gc
import os
import resource
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from edgeinfer_bench.iot.spawned import SpawnedSender
from edgeinfer_bench.requests import Template

ACK_TIMEOUT_S = 60.0  # the sender waits this long for its last PUBACKs


@dataclass(frozen=True)
class LoadSpec:
    """What a sender process sends: `rate` req/s for `seconds` (or all rate × seconds requests)."""

    address: tuple[str, int]
    topic: str
    parts: list[Template]
    label: str
    rate: float
    seconds: float
    all_requests: bool
    expiry_s: int | None = None  # MQTT 5 message expiry on every request


def request_properties(expiry_s: int | None) -> Any:
    """The publish properties of a request: MQTT 5 message expiry when one is asked for."""
    from edgeinfer.transport.base import MqttProperties

    return MqttProperties(message_expiry_s=expiry_s) if expiry_s is not None else None


def sender_main(conn: Connection, spec: LoadSpec) -> None:
    """The load: its own process and MQTT 5 connection. Says `ready`, waits for `go`, sends open loop
    (request i due at start + i / rate), says `ended` at its last hand-off, then `done` with every
    request id and its `sent_at` once the broker acknowledged them all (or ACK_TIMEOUT_S passed)."""
    from edgeinfer.transport.mqtt import MqttPubSub

    client = MqttPubSub.connect_tcp(*spec.address, client_id=f"bench-iot-sender-{spec.label}-{os.getpid()}")
    try:
        _send_load(conn, client, spec)
    except KeyboardInterrupt:  # Ctrl-C reaches the whole group: the parent reports it
        pass
    finally:
        client.close()
        conn.close()


def _send_load(conn: Connection, client: Any, spec: LoadSpec) -> None:
    from concurrent.futures import Future

    from edgeinfer.transport import TransportError

    # The first publish and the first body cost this process its lazy set-up: spent here,
    # not in request 0's latency.
    client.publish("bench-iot/warm-up", spec.parts[0].body("warm-up", time.time()), qos=1)
    conn.send(("ready", None))
    if not conn.poll(120) or conn.recv()[0] != "go":
        return
    acked: list[float] = []
    failed: list[float] = []
    lock = threading.Lock()

    def on_ack(fut: Future[None]) -> None:
        now = time.time()
        with lock:
            if fut.exception() is not None:
                failed.append(now)
            acked.append(now)

    sent: list[tuple[str, float]] = []
    not_sent = 0
    most_behind = 0.0
    rate, seconds, parts = spec.rate, spec.seconds, spec.parts
    props = request_properties(spec.expiry_s)
    target = round(rate * seconds)
    gc.disable()  # a collection's pause would send a burst behind it
    t0 = time.monotonic()
    start_wall = time.time()
    for i in range(target):
        due = t0 + i / rate
        now = time.monotonic()
        if not spec.all_requests and now >= t0 + seconds:
            break
        if due > now:
            time.sleep(due - now)
        else:
            most_behind = max(most_behind, now - due)
        rid = f"{spec.label}-{i}"
        sent_at = time.time()
        try:
            fut = client.publish_future(
                spec.topic, parts[i % len(parts)].body(rid, sent_at), qos=1, properties=props
            )
        except TransportError:
            not_sent += 1  # never handed to the client: not counted as sent
            continue
        sent.append((rid, sent_at))
        fut.add_done_callback(on_ack)
    end_wall = time.time()
    gc.enable()
    conn.send(("ended", end_wall))
    limit = time.monotonic() + ACK_TIMEOUT_S
    while time.monotonic() < limit:
        with lock:
            if len(acked) >= len(sent):
                break
        time.sleep(0.05)
    with lock:
        report = {
            "sent": sent,
            "start": start_wall,
            "end": end_wall,
            "target": target,
            "not_sent": not_sent,
            "puback_failed": len(failed),
            "puback_missing": len(sent) - len(acked),
            "last_puback": max(acked, default=end_wall),
            "most_behind_s": most_behind,
            # the load generator's own cost: it shares the machine with what it measures
            "cpu_s": time.process_time(),
            "rss_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
    conn.send(("done", report))


class Sender(SpawnedSender):
    """One load's sender process."""

    def __init__(self, spec: LoadSpec) -> None:
        limit = spec.seconds * (20 if spec.all_requests else 1) + ACK_TIMEOUT_S + 60
        super().__init__(
            sender_main, spec, name=f"bench-iot-sender-{spec.label}", who="the sender process", limit=limit
        )

    def report(self, timeout: float = 0.0) -> dict[str, Any] | None:
        """The sender's figures once it has them (its PUBACKs are in), else None."""
        if not self._conn.poll(timeout):
            return None
        report: dict[str, Any] = self._expect("done", 0)
        return report
