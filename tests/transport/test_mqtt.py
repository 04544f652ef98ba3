"""MqttPubSub against a real mosquitto with the real awsiotsdk/awscrt MQTT 5 client."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest

from edgeinfer.sim.broker import Inbox
from edgeinfer.transport import Message, TransportError
from edgeinfer.transport.mqtt import REFUSED_GRACE_S, MqttPubSub, parse_broker, subscription_topic_filter
from tests.helpers.wait import wait_for


def payloads(messages: Iterable[Message]) -> list[bytes]:
    return [m.payload for m in messages]


@pytest.fixture
def connect(broker: Any) -> Iterator[Callable[..., MqttPubSub]]:
    clients: list[MqttPubSub] = []

    def _connect(**kwargs: Any) -> MqttPubSub:
        client = MqttPubSub.connect_tcp(broker.host, broker.port, **kwargs)
        clients.append(client)
        return client

    yield _connect
    for client in clients:
        client.close()


def test_publish_subscribe_roundtrip_qos0_and_qos1(connect: Callable[..., MqttPubSub]) -> None:
    a, b = connect(), connect()
    inbox = Inbox()
    b.subscribe("edgeinfer/+/result", inbox.put, qos=1)
    a.publish("edgeinfer/dev-1/result", b'{"id":"1"}', qos=0)
    a.publish("edgeinfer/dev-2/result", b'{"id":"2"}', qos=1)
    a.publish("edgeinfer/dev-2/other", b"not for b", qos=1)
    got = inbox.wait_for(2)
    assert sorted(payloads(got)) == [b'{"id":"1"}', b'{"id":"2"}']
    assert {m.topic for m in got} == {"edgeinfer/dev-1/result", "edgeinfer/dev-2/result"}
    assert all(m.target == "iot" for m in got)


def test_shared_subscription_splits_messages_without_duplicates(connect: Callable[..., MqttPubSub]) -> None:
    w1, w2, pub = connect(), connect(), connect()
    in1, in2 = Inbox(), Inbox()
    w1.subscribe("$share/workers/jobs/+/offload", in1.put, qos=1)
    w2.subscribe("$share/workers/jobs/+/offload", in2.put, qos=1)
    sent = [f"{i}".encode() for i in range(40)]
    for i, payload in enumerate(sent):
        pub.publish(f"jobs/dev-{i % 3}/offload", payload, qos=1)
    assert wait_for(lambda: len(in1) + len(in2) == len(sent))
    time.sleep(0.2)  # any duplicate would have arrived by now
    got = payloads(in1.messages + in2.messages)
    assert sorted(got) == sorted(sent)  # every message once, none twice
    assert len(in1)  # both members of the group got work
    assert len(in2)


def test_handler_may_publish_and_wait_for_puback(connect: Callable[..., MqttPubSub]) -> None:
    server, client = connect(), connect()
    replies = Inbox()
    client.subscribe("rpc/reply", replies.put, qos=1)

    def echo(message: Message) -> None:
        server.publish("rpc/reply", message.payload.upper(), qos=1)  # QoS 1 waits for the PUBACK

    server.subscribe("rpc/call", echo, qos=1)
    for i in range(5):
        client.publish("rpc/call", f"hello {i}".encode(), qos=1)
    assert sorted(payloads(replies.wait_for(5))) == [f"HELLO {i}".encode() for i in range(5)]


def test_subscription_close_stops_delivery(connect: Callable[..., MqttPubSub]) -> None:
    a = connect()
    inbox, other = Inbox(), Inbox()
    sub = a.subscribe("t/x", inbox.put, qos=1)
    a.subscribe("t/#", other.put, qos=1)
    a.publish("t/x", b"1", qos=1)
    inbox.wait_for(1)
    other.wait_for(1)
    sub.close()
    sub.close()
    a.publish("t/x", b"2", qos=1)
    assert b"2" in payloads(other.wait_for(2))
    time.sleep(0.1)
    assert payloads(inbox.messages) == [b"1"]


def test_handler_exception_does_not_kill_the_client(connect: Callable[..., MqttPubSub]) -> None:
    a = connect()
    inbox = Inbox()

    def boom(message: Message) -> None:
        raise RuntimeError("handler bug")

    a.subscribe("t/boom", boom, qos=1)
    a.subscribe("t/ok", inbox.put, qos=1)
    a.publish("t/boom", b"x", qos=1)
    a.publish("t/ok", b"y", qos=1)
    assert payloads(inbox.wait_for(1)) == [b"y"]


def test_connect_to_closed_port_raises_transport_error(broker: Any) -> None:
    broker.stop()
    with pytest.raises(TransportError, match="cannot connect"):
        MqttPubSub.connect_tcp(broker.host, broker.port, timeout_s=1.0)


def test_a_refused_connection_fails_without_waiting_the_whole_timeout(broker: Any) -> None:
    import re

    broker.stop()
    with pytest.raises(TransportError, match="CONNECTION_REFUSED") as err:
        MqttPubSub.connect_tcp(broker.host, broker.port, timeout_s=30.0)
    waited = float(re.search(r"within (\d+\.\d) s", str(err.value)).group(1))  # type: ignore[union-attr]
    assert waited < REFUSED_GRACE_S + 10  # the refusal ended the wait, not the 30 s timeout


def test_outage_publish_fails_then_reconnects_and_resubscribes(
    broker: Any, connect: Callable[..., MqttPubSub]
) -> None:
    a, b = connect(), connect()
    inbox = Inbox()
    states: list[bool] = []
    b.on_connection_change(states.append)
    b.subscribe("t/outage", inbox.put, qos=1)
    broker.stop()
    assert wait_for(lambda: not a.is_connected and not b.is_connected)
    with pytest.raises(TransportError, match="not connected"):
        a.publish("t/outage", b"lost", qos=1)
    broker.start()  # same port
    assert a.wait_connected(15)
    assert b.wait_connected(15)
    # the subscription was renewed after the reconnect (clean session): delivery works again
    assert wait_for(lambda: _publish_ok(a, "t/outage", b"back") and len(inbox) > 0)
    assert set(payloads(inbox.messages)) == {b"back"}
    assert wait_for(lambda: False in states and states[-1] is True)
    assert states.index(False) < len(states) - 1  # a loss, then a reconnect


def _publish_ok(client: MqttPubSub, topic: str, payload: bytes) -> bool:
    try:
        client.publish(topic, payload, qos=1)
    except TransportError:
        return False
    return True


def test_close_is_idempotent_and_publish_after_close_raises(connect: Callable[..., MqttPubSub]) -> None:
    a = connect()
    a.close()
    a.close()
    assert not a.is_connected
    with pytest.raises(TransportError, match="closed"):
        a.publish("t", b"x")
    with pytest.raises(TransportError, match="closed"):
        a.subscribe("t", lambda m: None)


def test_qos2_is_refused(connect: Callable[..., MqttPubSub]) -> None:
    a = connect()
    with pytest.raises(TransportError, match="QoS 2"):
        a.publish("t", b"x", qos=2)


def test_iot_core_with_missing_certificate_is_a_clear_error(tmp_path: Any) -> None:
    with pytest.raises(TransportError, match=r"certificate file .* does not exist"):
        MqttPubSub.connect_iot_core(
            "example-ats.iot.eu-west-1.amazonaws.com",
            cert_filepath=str(tmp_path / "missing.pem.crt"),
            pri_key_filepath=str(tmp_path / "missing.pem.key"),
        )


def test_parse_broker() -> None:
    assert parse_broker("127.0.0.1:1884") == ("127.0.0.1", 1884)
    assert parse_broker("broker") == ("broker", 1883)
    assert parse_broker("[::1]:1885") == ("::1", 1885)
    for bad in ("", ":1883", "host:port", "host:0", "host:70000"):
        with pytest.raises(ValueError, match="broker address"):
            parse_broker(bad)


def test_subscription_topic_filter() -> None:
    assert subscription_topic_filter("$share/g/edgeinfer/+/offload") == "edgeinfer/+/offload"
    assert subscription_topic_filter("edgeinfer/+/offload") == "edgeinfer/+/offload"
    assert subscription_topic_filter("$share/") == "$share/"


def test_nagle_is_off_on_the_clients_socket(broker: Any, connect: Callable[..., MqttPubSub]) -> None:
    import os
    import socket

    connect()
    found = []
    for fd in map(int, os.listdir("/proc/self/fd")):
        try:
            sock = socket.socket(fileno=fd)
        except OSError:
            continue
        try:
            if sock.family == socket.AF_INET and sock.getpeername()[1] == broker.port:
                found.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        except OSError:
            pass
        finally:
            sock.detach()
    assert found
    assert all(found)


def test_inline_handlers_run_on_the_crt_thread_before_the_dispatcher(
    connect: Callable[..., MqttPubSub],
) -> None:
    import threading

    a, b = connect(), connect()
    inline, queued = Inbox(), Inbox()
    threads: set[str] = set()

    def on_inline(message: Message) -> None:
        threads.add(threading.current_thread().name)
        inline.put(message)

    b.subscribe("edgeinfer/+/result", on_inline, qos=1, inline=True)
    b.subscribe("edgeinfer/#", queued.put, qos=1)
    a.publish("edgeinfer/dev-1/result", b"r", qos=1)
    assert payloads(inline.wait_for(1)) == [b"r"]
    assert payloads(queued.wait_for(1)) == [b"r"]
    assert not any(name.startswith("mqtt-dispatch") for name in threads)


def test_mqtt5_properties_travel_both_ways(connect: Callable[..., MqttPubSub]) -> None:
    from edgeinfer.transport import MqttProperties

    sender, receiver = connect(client_id="props-tx"), connect(client_id="props-rx")
    got: queue.Queue[Message] = queue.Queue()
    receiver.subscribe("p/req", got.put, qos=1)
    props = MqttProperties(
        content_type="image/jpeg",
        correlation_data=b"\x00\xffid",
        response_topic="p/resp/1",
        user_properties=(("top_k", "3"), ("id", "r1")),
        message_expiry_s=30,
        payload_format="bytes",
    )
    sender.publish("p/req", b"\xff\xd8raw", qos=1, properties=props)
    msg = got.get(timeout=10)
    assert msg.payload == b"\xff\xd8raw"
    assert msg.properties is not None
    assert msg.properties.content_type == "image/jpeg"
    assert msg.properties.correlation_data == b"\x00\xffid"
    assert msg.properties.response_topic == "p/resp/1"
    assert msg.properties.user("top_k") == "3"
    assert msg.properties.user("id") == "r1"
    assert msg.properties.message_expiry_s is not None
    assert 0 < msg.properties.message_expiry_s <= 30  # what is left of it
    sender.publish("p/req", b"plain", qos=1)
    assert got.get(timeout=10).properties is None


def test_receive_maximum_keeps_a_slow_handlers_backlog_in_the_broker(
    broker: Any, connect: Callable[..., MqttPubSub]
) -> None:
    import threading

    slow = connect(client_id="flow-slow", receive_maximum=8)
    gate = threading.Event()
    seen: list[bytes] = []

    def handler(message: Message) -> None:
        seen.append(message.payload)
        gate.wait(30)

    slow.subscribe("flow/t", handler, qos=1)
    fast = connect(client_id="flow-fast")
    for i in range(100):
        fast.publish("flow/t", str(i).encode(), qos=1)  # the broker acknowledges these itself
    assert wait_for(lambda: len(seen) == 1)
    time.sleep(0.5)  # room for more than the receive maximum to show
    # One in the handler, the rest of the 8 unacknowledged ones waiting: the other 92 are the broker's.
    assert len(seen) == 1
    assert slow._inbox.qsize() <= 7
    gate.set()
    deadline = time.monotonic() + 30
    while len(seen) < 100 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert seen == [str(i).encode() for i in range(100)]


def test_a_bounded_inbox_holds_a_flood_in_the_broker_and_delivers_each_message_once(
    tmp_path: Any,
) -> None:
    import threading

    from edgeinfer.sim import MosquittoBroker

    # The simulator's broker: it keeps every queued QoS 1 message (the fixture's keeps 1,000). The
    # receive maximum lets 64 through unacknowledged; the inbox takes 16 (8 KiB): the socket waits.
    with MosquittoBroker(work_dir=tmp_path / "broker") as keeper:
        slow = MqttPubSub.connect_tcp(
            keeper.host, keeper.port, receive_maximum=64, inbox_max_messages=16, inbox_max_bytes=8 * 1024
        )
        fast = MqttPubSub.connect_tcp(keeper.host, keeper.port)
        gate = threading.Event()
        seen: list[int] = []

        def handler(message: Message) -> None:
            seen.append(int.from_bytes(message.payload[:4], "big"))
            gate.wait(60)

        try:
            slow.subscribe("bound/t", handler, qos=1)
            body = b"b" * 1020
            for i in range(3000):  # 3 MB
                fast.publish("bound/t", i.to_bytes(4, "big") + body, qos=1, wait=False)
            assert wait_for(lambda: slow.inbox_stats()["waits"] >= 1, timeout=30)
            stats = slow.inbox_stats()
            assert stats["peak_messages"] <= 16
            assert stats["peak_bytes"] <= 8 * 1024
            assert wait_for(lambda: len(seen) == 1)  # the inbox may fill before the handler is reached
            gate.set()
            assert wait_for(lambda: len(seen) >= 3000, timeout=60)
            time.sleep(0.3)
            assert seen == list(range(3000))
            assert slow.inbox_stats()["peak_messages"] <= 16
        finally:
            gate.set()
            slow.close()
            fast.close()


def test_a_full_inbox_holds_the_producer_until_a_get_or_close() -> None:
    import threading

    from edgeinfer.transport.mqtt import _Inbox

    box = _Inbox(max_messages=2, max_bytes=100)
    assert box.put("a", 60)
    assert box.put("b", 30)  # 2 messages, 90 bytes
    box.put_control(True)  # connection events are not counted and never wait
    results: list[bool] = []
    producer = threading.Thread(target=lambda: results.append(box.put("c", 20)))
    producer.start()
    producer.join(0.2)
    assert producer.is_alive()  # full by count
    assert box.get() == "a"
    producer.join(10)
    assert results == [True]
    assert (box.messages, box.bytes, box.peak_messages, box.waits) == (2, 50, 2, 1)
    big = threading.Thread(target=lambda: results.append(box.put("d", 60)))
    big.start()
    big.join(0.2)
    assert big.is_alive()  # full by bytes (50 + 60 > 100)
    box.close()
    big.join(10)
    assert results == [True, False]  # dropped, unacknowledged
    assert [box.get(), box.get(), box.get()] == ["b", True, "c"]
    lone = _Inbox(max_messages=1, max_bytes=10)
    assert lone.put("huge", 1000)  # one message always fits
