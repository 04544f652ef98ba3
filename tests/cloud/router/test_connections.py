"""A router process with several connections under more offloads than one connection may carry, on a
broker that logs every publish with its client: each offload answered once, and no connection over its
limits in any second, either way, nor over its unacknowledged messages.

The limits are IoT Core's scaled down (`--pacing-scale`), so the load stays light on a small machine.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from edgeinfer.messages import OffloadOrigin, OffloadRequest, Request, Result, iso_utc
from edgeinfer.sim.broker import _user, find_mosquitto, free_port, wait_for_port
from edgeinfer.transport import Message
from edgeinfer.transport.mqtt import MqttPubSub
from edgeinfer_cloud.router.pacer import IOT_CORE_BYTES_PER_S, IOT_CORE_PUBLISHES_PER_S
from tests.helpers.router import jpeg
from tests.helpers.wait import wait_for

SCALE = 0.1  # the broker stands in for IoT Core at a tenth of its limits
RECEIVE_MAXIMUM = 1  # with the scaled inbound rate and burst, 1 + 8 + 1 publishes fit in 10 a second
LIMIT_PUBLISHES = IOT_CORE_PUBLISHES_PER_S * SCALE
LIMIT_BYTES = IOT_CORE_BYTES_PER_S * SCALE
CONNECTIONS = 3
ROUTER = "scale-router"

# `1796291753: Received PUBLISH from dev (d0, q1, r0, m1, 'edgeinfer/x/offload', ... (1000 bytes))`
PUBLISH = re.compile(
    r"^(\d+): (Received|Sending) PUBLISH (?:from|to) (\S+) "
    r"\(d\d, q(\d), r\d, m(\d+), '([^']*)', .*\((\d+) bytes\)\)"
)
PUBACK_IN = re.compile(r"^(\d+): Received PUBACK from (\S+) \(Mid: ?(\d+)")


@dataclass
class LoggedBroker:
    host: str
    port: int
    log: Path


@pytest.fixture
def logged_broker(tmp_path: Path) -> Iterator[LoggedBroker]:
    """mosquitto logging everything, each line stamped with its second."""
    port = free_port()
    log = tmp_path / "mosquitto.log"
    conf = tmp_path / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\nuser {_user()}\n"
        "max_queued_messages 100000\nset_tcp_nodelay true\n"
        # IoT Core holds a connection to its unacknowledged QoS 1 messages; so does this broker,
        # at the Receive Maximum the router asks for (mosquitto 2.0.11 honours that only loosely).
        f"max_inflight_messages {RECEIVE_MAXIMUM}\n"
        f"log_dest file {log}\nlog_type all\nlog_timestamp true\nlog_timestamp_format %s\n"
    )
    proc = subprocess.Popen(
        [find_mosquitto(), "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        assert wait_for_port("127.0.0.1", port, timeout=10), "mosquitto did not start"
        yield LoggedBroker("127.0.0.1", port, log)
    finally:
        proc.terminate()
        proc.wait(10)


def per_second(log: Path, prefix: str) -> dict[tuple[str, str], Counter[int]]:
    """(client, 'in'|'out') -> publishes and bytes per second, for clients named `prefix`*; `in`
    is what the broker sent the client, `out` what the client published."""
    counts: dict[tuple[str, str], Counter[int]] = defaultdict(Counter)
    sizes: dict[tuple[str, str], Counter[int]] = defaultdict(Counter)
    for line in log.read_text(errors="replace").splitlines():
        m = PUBLISH.match(line)
        if m is None or not m.group(3).startswith(prefix):
            continue
        second, way = int(m.group(1)), "out" if m.group(2) == "Received" else "in"
        counts[(m.group(3), way)][second] += 1
        sizes[(m.group(3), f"{way}-bytes")][second] += int(m.group(7)) + len(m.group(6))
    return {**counts, **sizes}


def most_unacked(log: Path, prefix: str) -> dict[str, int]:
    """The most QoS 1 messages the broker had sent each client without its PUBACK."""
    open_ids: dict[str, set[str]] = defaultdict(set)
    most: dict[str, int] = defaultdict(int)
    for line in log.read_text(errors="replace").splitlines():
        m = PUBLISH.match(line)
        if m is not None and m.group(2) == "Sending" and m.group(3).startswith(prefix) and m.group(4) == "1":
            open_ids[m.group(3)].add(m.group(5))
            most[m.group(3)] = max(most[m.group(3)], len(open_ids[m.group(3)]))
            continue
        a = PUBACK_IN.match(line)
        if a is not None and a.group(2).startswith(prefix):
            open_ids[a.group(2)].discard(a.group(3))
    return dict(most)


class Device:
    def __init__(self, broker: LoggedBroker, thing: str) -> None:
        self.thing = thing
        self.client = MqttPubSub.connect_tcp(broker.host, broker.port, client_id=f"device-{thing}")
        self.answers: Counter[str] = Counter()
        self.codes: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.client.subscribe(f"edgeinfer/{thing}/offload/result", self._on, qos=1)

    def _on(self, message: Message) -> None:
        result = Result.parse(message.payload)
        with self.lock:
            self.answers[result.id or ""] += 1
            self.codes[result.error.code.value if result.error else "ok"] += 1

    def send(self, rid: str, image: bytes) -> None:
        request = OffloadRequest(
            Request(id=rid, image=image, top_k=1), OffloadOrigin(self.thing, 60_000, iso_utc(time.time()))
        )
        self.client.publish(f"edgeinfer/{self.thing}/offload", request.to_json(), qos=1)


def test_a_router_with_several_connections_stays_within_each_connections_limits(
    tiny_store: Path, logged_broker: LoggedBroker
) -> None:
    router = subprocess.Popen(
        [
            sys.executable, "-m", "edgeinfer", "cloud", "router",
            "--broker", f"{logged_broker.host}:{logged_broker.port}",
            "--model-dir", str(tiny_store), "--threads", "1",
            "--connections", str(CONNECTIONS), "--client-id", ROUTER,
            "--pacing", "on", "--pacing-scale", str(SCALE), "--receive-maximum", str(RECEIVE_MAXIMUM),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    devices = [Device(logged_broker, f"dev-{i}") for i in range(4)]
    try:
        last = f"Sending SUBACK to {ROUTER}-{CONNECTIONS - 1}"
        assert wait_for(lambda: last in logged_broker.log.read_text(errors="replace"), timeout=60)
        image = jpeg(size=64)  # a few KB: bytes bind as well as counts
        n = 80  # more than one connection's inbound limit carries in the few seconds it takes
        for i in range(n):
            devices[i % len(devices)].send(f"o{i}", image)
        assert wait_for(lambda: sum(sum(d.answers.values()) for d in devices) >= n, timeout=60)
        time.sleep(0.5)  # a duplicate would have come by now
    finally:
        router.send_signal(signal.SIGINT)
        _, err = router.communicate(timeout=30)
        for d in devices:
            d.client.close()
    assert router.returncode == 0, err
    assert sum(f"router: connection {i}: " in err for i in range(CONNECTIONS)) == CONNECTIONS
    for k, d in enumerate(devices):
        assert d.answers == Counter({f"o{i}": 1 for i in range(k, n, len(devices))})  # each once
    assert sum((d.codes for d in devices), Counter()) == Counter(ok=n)

    seconds = per_second(logged_broker.log, ROUTER)
    routers = {client for client, _ in seconds}
    assert routers == {f"{ROUTER}-{i}" for i in range(CONNECTIONS)}
    for (client, way), by_second in seconds.items():
        limit = LIMIT_BYTES if way.endswith("bytes") else LIMIT_PUBLISHES
        assert max(by_second.values()) <= limit, (client, way, sorted(by_second.items()))
    # the load needed more than one connection's inbound limit, and the connections shared it
    inbound = {c: sum(seconds[(c, "in")].values()) for c in routers}
    assert all(count >= n / CONNECTIONS / 3 for count in inbound.values()), inbound
    assert all(v <= RECEIVE_MAXIMUM for v in most_unacked(logged_broker.log, ROUTER).values())
