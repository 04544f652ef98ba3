"""The IoT bridge's limits: message size, the spooler, publishes in flight, order, the outage."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from awsiot.greengrasscoreipc.model import QOS, ServiceError

from edgeinfer.greengrass.nuclei import CLASSIC
from edgeinfer.sim import MosquittoBroker, Simulator
from edgeinfer.sim.iot_bridge import IotBridge, PublishRefusedError
from tests.helpers.sim import ALLOW_ALL, Device
from tests.helpers.wait import wait_for

A = "com.example.A"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[MosquittoBroker]:
    with MosquittoBroker(work_dir=tmp_path / "broker") as b:
        yield b


@pytest.mark.classic_only("nucleus lite closes the IPC connection instead (test_lite_limits.py)")
def test_publish_to_iot_core_of_140000_bytes_is_refused_before_the_network(
    simulator: Callable[..., Simulator], device: Device, ipc_clients: Any
) -> None:
    device.add(A, access=ALLOW_ALL)
    sim = simulator(device.recipes, device.artifacts, thing="big")
    inbox = sim.cloud_client().subscribe("big/#")
    a = ipc_clients(sim, A)
    with pytest.raises(ServiceError) as refused:
        a.publish_to_iot_core(topic_name="big/x", qos=QOS.AT_LEAST_ONCE, payload=b"x" * 140_000)
    assert refused.value.message == (
        "Publish to topic big/x failed with error com.aws.greengrass.mqttclient.MqttRequestException: "
        "The publishing message size 140000 bytes exceeds the configured limit of 131072 bytes"
    )
    a.publish_to_iot_core(topic_name="big/y", qos=QOS.AT_LEAST_ONCE, payload=b"y" * 131_071)
    assert [m.topic for m in inbox.wait_for(1)] == ["big/y"]


def test_at_most_five_in_flight_the_rest_spooled_in_order(broker: MosquittoBroker) -> None:
    bridge = IotBridge(broker.host, broker.port, client_id="bridge-inflight", profile=CLASSIC)
    cloud: list[int] = []
    try:
        from edgeinfer.sim.broker import CloudClient

        with CloudClient(broker.host, broker.port) as watcher:
            inbox = watcher.subscribe("seq")
            assert broker._proc is not None
            os.kill(broker._proc.pid, signal.SIGSTOP)  # the broker acknowledges nothing
            try:
                for i in range(20):
                    assert bridge.publish("seq", str(i).encode(), 1).done()  # accepted once spooled
                assert wait_for(lambda: bridge.in_flight() == 5)
                time.sleep(0.2)
                assert bridge.in_flight() == 5
                assert bridge.pending() == (20, sum(len(str(i)) for i in range(20)))
            finally:
                os.kill(broker._proc.pid, signal.SIGCONT)
            cloud = [int(m.payload) for m in inbox.wait_for(20)]
            assert wait_for(lambda: bridge.pending() == (0, 0))
    finally:
        bridge.close()
    assert cloud == list(range(20))


@pytest.mark.classic_only("nucleus lite has no spooler")
def test_publish_to_iot_core_is_answered_once_spooled_without_waiting_for_the_puback(
    simulator: Callable[..., Simulator], device: Device, ipc_clients: Any, broker: MosquittoBroker
) -> None:
    # The classic nucleus answers once `MqttClient.publish` has stored the message in its spool;
    # the spooler sends it later, at most `maxInFlightPublishes` unacknowledged.
    device.add(A, access=ALLOW_ALL)
    sim = simulator(device.recipes, device.artifacts, thing="ans", broker=broker.address)
    assert sim._nucleus is not None
    bridge = sim._nucleus.bridge
    assert bridge is not None
    inbox = sim.cloud_client().subscribe("ans/seq")
    a = ipc_clients(sim, A)
    assert broker._proc is not None
    os.kill(broker._proc.pid, signal.SIGSTOP)  # no PUBACK can come
    try:
        for i in range(12):
            a.publish_to_iot_core(topic_name="ans/seq", qos=QOS.AT_LEAST_ONCE, payload=str(i).encode())
            assert bridge.pending()[0] == i + 1  # the spool held it before the answer came
            assert bridge.in_flight() <= 5
        assert wait_for(lambda: bridge.in_flight() == 5)
        time.sleep(0.2)
        assert bridge.in_flight() == 5
    finally:
        os.kill(broker._proc.pid, signal.SIGCONT)
    assert [int(m.payload) for m in inbox.wait_for(12)] == list(range(12))
    assert wait_for(lambda: bridge.pending() == (0, 0))


def test_publishes_from_many_threads_keep_each_ones_order_and_all_arrive(broker: MosquittoBroker) -> None:
    # Spooled messages are handed to the client by whichever thread spooled one or got a PUBACK.
    bridge = IotBridge(broker.host, broker.port, client_id="bridge-threads", profile=CLASSIC)
    threads, each = 4, 150
    try:
        from edgeinfer.sim.broker import CloudClient

        with CloudClient(broker.host, broker.port) as watcher:
            inbox = watcher.subscribe("mt/#")

            def send(t: int) -> None:
                for i in range(each):
                    bridge.publish(f"mt/{t}", str(i).encode(), 1)

            workers = [threading.Thread(target=send, args=(t,)) for t in range(threads)]
            for w in workers:
                w.start()
            for w in workers:
                w.join(30)
            got = inbox.wait_for(threads * each, timeout=30)
            assert wait_for(lambda: bridge.pending() == (0, 0))
    finally:
        bridge.close()
    for t in range(threads):
        assert [int(m.payload) for m in got if m.topic == f"mt/{t}"] == list(range(each))


def test_the_spooler_drops_qos0_first_then_refuses(broker: MosquittoBroker) -> None:
    bridge = IotBridge(broker.host, broker.port, client_id="bridge-spool", profile=CLASSIC)
    assert broker._proc is not None
    os.kill(broker._proc.pid, signal.SIGSTOP)
    try:
        chunk = b"x" * 100_000
        for _ in range(5):  # in flight, unacknowledged
            bridge.publish("t", chunk, 1)
        assert wait_for(lambda: bridge.in_flight() == 5)
        for _ in range(3):
            bridge.publish("t", b"0" * 5_000, 0)
        for _ in range(21):  # 2.615 MB of the 2.62 MiB spool
            bridge.publish("t", chunk, 1)
        assert bridge.pending() == (29, 2_615_000)
        bridge.publish("t", b"y" * 10_000, 1)  # room made by the oldest QoS 0 message going
        assert bridge.pending() == (29, 2_620_000)
        with pytest.raises(PublishRefusedError, match=r"Message spool is full\. Message could not be added"):
            bridge.publish("t", b"y" * 30_000, 1)
        assert bridge.pending() == (27, 2_610_000)
    finally:
        os.kill(broker._proc.pid, signal.SIGCONT)
        bridge.close()


def test_offline_qos1_waits_and_qos0_is_refused(broker: MosquittoBroker) -> None:
    from edgeinfer.sim.broker import CloudClient

    bridge = IotBridge(broker.host, broker.port, client_id="bridge-offline", profile=CLASSIC)
    try:
        with CloudClient(broker.host, broker.port) as watcher:
            inbox = watcher.subscribe("up")
            bridge.go_offline()
            with pytest.raises(PublishRefusedError, match=r"Device is offline\. Dropping QoS 0 message"):
                bridge.publish("up", b"q0", 0)
            bridge.publish("up", b"kept", 1)
            time.sleep(0.2)
            assert len(inbox) == 0
            bridge.go_online()
            assert [m.payload for m in inbox.wait_for(1)] == [b"kept"]
    finally:
        bridge.close()


@pytest.mark.classic_only("nucleus lite drops MQTT 5 properties (test_lite_limits.py)")
def test_mqtt5_properties_pass_through_both_ways(
    simulator: Callable[..., Simulator], device: Device, ipc_clients: Any
) -> None:
    from awsiot.greengrasscoreipc.model import UserProperty

    from edgeinfer.transport.base import MqttProperties

    device.add(A, access=ALLOW_ALL)
    sim = simulator(device.recipes, device.artifacts, thing="props")
    cloud = sim.cloud_client()
    up = cloud.subscribe("props/up")
    a = ipc_clients(sim, A)
    a.publish_to_iot_core(
        topic_name="props/up",
        qos=QOS.AT_LEAST_ONCE,
        payload=b"{}",
        content_type="application/json",
        correlation_data=b"c-1",
        response_topic="props/reply",
        user_properties=[UserProperty(key="k", value="v")],
    )
    [message] = up.wait_for(1)
    assert message.properties is not None
    assert message.properties.content_type == "application/json"
    assert message.properties.correlation_data == b"c-1"
    assert message.properties.response_topic == "props/reply"
    assert message.properties.user_properties == (("k", "v"),)

    got: list[Any] = []
    a.subscribe_to_iot_core(topic_name="props/down", qos=QOS.AT_LEAST_ONCE, on_stream_event=got.append)
    cloud.publish(
        "props/down",
        b"x",
        qos=1,
        properties=MqttProperties(content_type="image/jpeg", correlation_data=b"c-2"),
    )
    assert wait_for(lambda: len(got) == 1)
    assert got[0].message.content_type == "image/jpeg"
    assert got[0].message.correlation_data == b"c-2"


def test_a_flood_into_a_held_subscriber_waits_in_the_broker_while_publishes_are_acknowledged(
    broker: MosquittoBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from edgeinfer.sim import iot_bridge
    from edgeinfer.sim.broker import CloudClient

    monkeypatch.setattr(iot_bridge, "INBOX_MAX_MESSAGES", 32)
    monkeypatch.setattr(iot_bridge, "INBOX_MAX_BYTES", 64 * 1024)
    flood, size = 2000, 1024  # 2 MB: far above the inbox's 32 messages / 64 KiB
    bridge = IotBridge(broker.host, broker.port, client_id="bridge-flood", profile=CLASSIC)
    gate = threading.Event()
    got: list[int] = []

    def held(message: Any) -> None:
        got.append(int.from_bytes(message.payload[:4], "big"))
        gate.wait(60)

    try:
        bridge.subscribe("down", held, 1)
        with CloudClient(broker.host, broker.port) as cloud:
            up = cloud.subscribe("up")
            body = b"x" * (size - 4)
            for i in range(flood):
                cloud.pubsub.publish("down", i.to_bytes(4, "big") + body, qos=1, wait=False)
            assert wait_for(lambda: bridge.inbox_stats()["waits"] >= 1, timeout=30)
            # Held inbound, the other connection still gets its PUBACKs: the spool drains.
            for i in range(20):
                bridge.publish("up", str(i).encode(), 1)
            assert [int(m.payload) for m in up.wait_for(20, timeout=30)] == list(range(20))
            assert wait_for(lambda: bridge.pending() == (0, 0))
            assert wait_for(lambda: len(got) == 1)  # the inbox may fill before the handler is reached
            stats = bridge.inbox_stats()
            assert stats["peak_messages"] <= 32
            assert stats["peak_bytes"] <= 64 * 1024
            gate.set()
            assert wait_for(lambda: len(got) >= flood, timeout=60)
            time.sleep(0.3)  # room for a duplicate to show
        assert got == list(range(flood))
        assert bridge.inbox_stats()["peak_messages"] <= 32
    finally:
        gate.set()
        bridge.close()
