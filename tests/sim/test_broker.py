"""The "IoT Core" broker: MQTT 5 shared subscriptions, and persistent sessions across a restart."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from awscrt import mqtt

from edgeinfer.sim import CloudClient, MosquittoBroker


def _persistent(broker: MosquittoBroker, got: list[bytes], done: threading.Event) -> mqtt.Connection:
    conn = mqtt.Connection(
        client=mqtt.Client(None, None),
        host_name=broker.host,
        port=broker.port,
        client_id="persistent-cloud-app",
        clean_session=False,
    )

    def on_message(topic: str, payload: bytes, **_: Any) -> None:
        got.append(payload)
        if len(got) >= 3:
            done.set()

    conn.on_message(on_message)
    return conn


def test_a_persistent_session_gets_what_was_published_while_the_broker_restarted(tmp_path: Path) -> None:
    broker = MosquittoBroker(work_dir=tmp_path / "mqtt").start()
    try:
        got: list[bytes] = []
        done = threading.Event()
        conn = _persistent(broker, got, done)
        conn.connect().result(10)
        conn.subscribe("fleet/+/telemetry", mqtt.QoS.AT_LEAST_ONCE)[0].result(10)
        conn.disconnect().result(10)
        port = broker.port
        broker.stop()
        broker.start()
        assert broker.port == port
        with CloudClient(broker.host, broker.port) as device:
            for i in range(3):
                device.publish(f"fleet/d{i}/telemetry", b"w%d" % i, qos=1)
        conn.connect().result(10)
        assert done.wait(10), got
        assert got == [b"w0", b"w1", b"w2"]
        conn.disconnect().result(10)
    finally:
        broker.stop()


def test_mqtt5_shared_subscriptions(sim_broker: MosquittoBroker) -> None:
    workers = [CloudClient(*sim_broker.address) for _ in range(2)]
    inboxes = [w.subscribe("$share/routers/jobs/#") for w in workers]
    with CloudClient(*sim_broker.address) as producer:
        for i in range(20):
            producer.publish(f"jobs/{i}", b"job", qos=1)
    deadline = 50
    while sum(len(inbox) for inbox in inboxes) < 20 and deadline:
        threading.Event().wait(0.1)
        deadline -= 1
    counts = [len(inbox) for inbox in inboxes]
    assert sum(counts) == 20  # each job exactly once across the group
    for w in workers:
        w.close()
