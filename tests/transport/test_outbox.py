"""The outbox: bounded on disk, in order after an outage, across restarts; the Forwarder's thread."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from edgeinfer.transport import MemoryBus, UnauthorizedError
from edgeinfer.transport.outbox import Forwarder, Outbox, OutboxPublisher, Stored
from tests.helpers.clock import FakeClock
from tests.helpers.wait import eventually

TOPIC = "edgeinfer/dev/result"


def sent(bus: MemoryBus, topic: str = TOPIC) -> list[bytes]:
    return [m.payload for m in bus.messages_on(topic, "iot")]


def msg(i: int) -> bytes:
    return json.dumps({"id": f"r-{i}"}).encode()


def test_an_outage_keeps_every_message_and_sends_them_in_order(tmp_path: Path) -> None:
    clock = FakeClock()
    bus = MemoryBus()
    pub = OutboxPublisher(bus, TOPIC, Outbox(tmp_path), clock=clock, retry_s=1, max_retry_s=4)
    for i in range(5):
        assert pub.offer(pub.outbox.take_seq(), msg(i))
    bus.fail_publish = True
    for i in range(5, 25):
        clock.advance(0.5)
        assert not pub.offer(pub.outbox.take_seq(), msg(i))
    assert len(pub.outbox) == 20
    assert not pub.online
    bus.fail_publish = False
    clock.advance(10)  # past the back-off
    assert pub.offer(pub.outbox.take_seq(), msg(25))
    assert sent(bus) == [msg(i) for i in range(26)]  # in order, none lost, none twice
    assert pub.counters() == {"pending": 0, "spooled": 20, "sent": 20, "dropped": 0}


def test_messages_keep_their_own_topic(tmp_path: Path) -> None:
    clock = FakeClock()
    bus = MemoryBus(fail_publish=True)
    pub = OutboxPublisher(bus, TOPIC, Outbox(tmp_path), clock=clock)
    pub.offer(0, b"a", "edgeinfer/dev/result/cam\nera")  # any topic, a newline too
    pub.offer(1, b"b")
    bus.fail_publish = False
    clock.advance(60)
    assert pub.pump()
    assert sent(bus, "edgeinfer/dev/result/cam\nera") == [b"a"]
    assert sent(bus) == [b"b"]


def test_bounds_drop_the_oldest_and_count_why(tmp_path: Path) -> None:
    wall = FakeClock()
    box = Outbox(tmp_path / "n", max_items=3, wall=wall)
    for seq in range(5):
        box.put(seq, b"x")
    assert box.seqs() == [2, 3, 4]
    assert box.dropped_by["full"] == 2
    by_bytes = Outbox(tmp_path / "b", max_bytes=250, wall=wall)
    for seq in range(5):
        by_bytes.put(seq, b"x" * 100)
    assert by_bytes.seqs() == [3, 4]
    aged = Outbox(tmp_path / "a", max_age_s=60, wall=wall)
    for seq in range(4):
        aged.put(seq, b"x")
        wall.advance(30)
    # written at 0, 30, 60, 90 s; now 120 s: the first two are over a minute old
    item = aged.peek()
    assert item is not None
    assert item.seq == 2
    assert aged.dropped_by["age"] == 2
    assert aged.dropped == 2
    assert Outbox(tmp_path / "a").dropped_by["age"] == 2  # the count survives a restart


def test_a_restart_resends_what_waits_then_goes_on(tmp_path: Path) -> None:
    clock = FakeClock()
    down = MemoryBus(fail_publish=True)
    pub = OutboxPublisher(down, TOPIC, Outbox(tmp_path), clock=clock)
    for i in range(4):
        pub.offer(pub.outbox.take_seq(), msg(i), TOPIC)
    (tmp_path / ".000000000009.msg.abc.tmp").write_bytes(b"partial")  # a crash mid-write

    bus = MemoryBus()
    again = OutboxPublisher(bus, TOPIC, Outbox(tmp_path), clock=clock)
    assert not list(tmp_path.glob(".*"))
    assert len(again.outbox) == 4
    seq = again.outbox.take_seq()
    assert seq == 4  # after the newest kept
    assert again.offer(seq, msg(4))
    assert sent(bus) == [msg(i) for i in range(5)]
    assert again.counters()["spooled"] == 4  # counted before the restart


def test_an_unreadable_message_is_dropped_and_counted(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    box.put(0, b"a", "t/0")
    box.put(1, b"b", "t/1")
    (tmp_path / "000000000000.msg").write_bytes(b"not json\nb")
    item = box.peek()
    assert item is not None
    assert (item.seq, item.topic) == (1, "t/1")
    assert box.dropped_by["unreadable"] == 1


def test_the_forwarder_never_blocks_its_caller_and_sends_all_in_order(tmp_path: Path) -> None:
    bus = MemoryBus(fail_publish=True)
    counters: list[dict[str, int]] = []
    pub = OutboxPublisher(bus, TOPIC, Outbox(tmp_path), retry_s=0.01, max_retry_s=0.05)
    fwd = Forwarder(pub, on_change=counters.append, tick_s=0.01, report_s=0.0).start()
    try:
        for i in range(30):
            fwd.submit(msg(i), TOPIC)
        eventually(lambda: len(pub.outbox) == 30, 30, "every message kept while IoT Core is away")
        bus.fail_publish = False
        eventually(lambda: len(sent(bus)) == 30 and len(pub.outbox) == 0, 30, "all sent once back")
        assert sent(bus) == [msg(i) for i in range(30)]
        final = {"pending": 0, "spooled": 30, "sent": 30, "dropped": 0}
        eventually(lambda: bool(counters) and counters[-1] == final, 30, "the final counters reported")
    finally:
        fwd.stop()


def test_stop_keeps_what_is_queued(tmp_path: Path) -> None:
    bus = MemoryBus()
    gate = threading.Event()
    real = bus.publish

    def slow(*args, **kwargs):  # type: ignore[no-untyped-def]
        gate.wait(30)  # the nucleus does not answer until the test says so
        return real(*args, **kwargs)

    bus.publish = slow  # type: ignore[method-assign]
    pub = OutboxPublisher(bus, TOPIC, Outbox(tmp_path))
    fwd = Forwarder(pub, tick_s=0.01).start()
    fwd.submit(msg(0))
    eventually(lambda: fwd.queued() == 0, 30, "the first message taken by the forwarder's thread")
    for i in range(1, 6):
        fwd.submit(msg(i))
    stopper = threading.Thread(target=fwd.stop)
    stopper.start()
    eventually(fwd.stopping, 30, "the forwarder told to stop")
    gate.set()
    stopper.join(30)
    assert sent(bus) == [msg(0)]
    # the rest wait on disk for the next start, in order
    box = Outbox(tmp_path)
    kept = []
    while (item := box.peek()) is not None:
        kept.append(item.payload)
        box.remove(item.seq)
    assert kept == [msg(i) for i in range(1, 6)]


def test_a_full_queue_drops_the_oldest_queued_and_counts_it(tmp_path: Path) -> None:
    pub = OutboxPublisher(MemoryBus(fail_publish=True), TOPIC, Outbox(tmp_path))
    fwd = Forwarder(pub, max_queued=3)  # not started: nothing drains the queue
    for i in range(5):
        fwd.submit(msg(i))
    assert fwd.queued() == 3
    fwd.start()
    fwd.stop()
    assert pub.outbox.dropped_by["overflow"] == 2
    assert len(pub.outbox) == 3


class RefusingBus(MemoryBus):
    """A nucleus that does not let the component publish on `forbidden/...` (as accessControl would)."""

    def publish(self, topic, payload, *, target="local", qos=0, properties=None):  # type: ignore[no-untyped-def]
        if topic.startswith("forbidden/"):
            raise UnauthorizedError(f"not authorized to publish to {topic}")
        return super().publish(topic, payload, target=target, qos=qos, properties=properties)


def test_a_refused_topic_is_dropped_and_counted_never_retried(tmp_path: Path) -> None:
    clock = FakeClock()
    bus = RefusingBus(fail_publish=True)
    pub = OutboxPublisher(bus, TOPIC, Outbox(tmp_path), clock=clock)
    pub.offer(0, msg(0))
    pub.offer(1, msg(1), "forbidden/x")
    pub.offer(2, msg(2))
    bus.fail_publish = False
    clock.advance(60)
    assert pub.pump()  # the refused one does not hold up the one behind it
    assert pub.offer(3, msg(3), "forbidden/x") is False
    assert sent(bus) == [msg(0), msg(2)]
    assert pub.outbox.dropped_by["refused"] == 2
    assert len(pub.outbox) == 0


class HangingBus(MemoryBus):
    """A nucleus that does not answer a publish until the test opens `gate`; `entered` tells that one
    is waiting."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.entered = threading.Event()

    def publish(self, topic, payload, *, target="local", qos=0, properties=None):  # type: ignore[no-untyped-def]
        self.entered.set()
        self.gate.wait(60)
        return super().publish(topic, payload, target=target, qos=qos, properties=properties)


def kept_payloads(folder: Path) -> list[bytes]:
    box = Outbox(folder)
    kept = []
    while (item := box.peek()) is not None:
        kept.append(item.payload)
        box.remove(item.seq)
    return kept


def test_stop_writes_the_queue_while_a_publish_hangs_and_counts_the_one_it_holds(tmp_path: Path) -> None:
    bus = HangingBus()
    fwd = Forwarder(OutboxPublisher(bus, TOPIC, Outbox(tmp_path)), tick_s=0.01).start()
    try:
        fwd.submit(msg(0))
        eventually(bus.entered.is_set, 30, "the forwarder's thread publishing the first message")
        for i in range(1, 6):
            fwd.submit(msg(i))
        # the nucleus never answers within the stop's wait: the queue must be on disk all the same
        assert fwd.stop(timeout=0.01) is False
        assert kept_payloads(tmp_path) == [msg(i) for i in range(1, 6)]
        state = json.loads((tmp_path / "state.json").read_text())
        assert state["dropped_by"]["stopped"] == 1  # the one in the unanswered publish, not on disk
        assert state["spooled"] == 5
    finally:
        bus.gate.set()


def test_a_stop_during_a_resend_keeps_the_order(tmp_path: Path) -> None:
    bus = HangingBus()
    box = Outbox(tmp_path)
    box.put(box.take_seq(), msg(0))  # waiting from an earlier outage
    fwd = Forwarder(OutboxPublisher(bus, TOPIC, box), tick_s=0.01)
    fwd.submit(msg(1))  # queued before the thread starts, so it is taken before any idle resend
    fwd.start()
    stopper = threading.Thread(target=fwd.stop, kwargs={"timeout": 60})
    try:
        eventually(bus.entered.is_set, 30, "the forwarder's thread resending the waiting message")
        fwd.submit(msg(2))
        fwd.submit(msg(3))
        stopper.start()
        eventually(lambda: len(list(tmp_path.glob("0*.json"))) == 3, 30, "the queue written beside the first")
    finally:
        bus.gate.set()
    stopper.join(60)
    assert sent(bus) == [msg(0), msg(1)]  # what the thread held, after the older one, never after newer
    assert kept_payloads(tmp_path) == [msg(2), msg(3)]


def test_put_many_keeps_a_batch_in_order_across_a_restart(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    box.put(box.take_seq(), b"a")
    box.put_many([Stored(box.take_seq(), b"b"), Stored(box.take_seq(), b"c", "t/c")])
    assert not list(tmp_path.glob(".*"))
    again = Outbox(tmp_path)
    assert again.spooled == 3
    items = []
    while (item := again.peek()) is not None:
        items.append((item.payload, item.topic))
        again.remove(item.seq)
    assert items == [(b"a", None), (b"b", None), (b"c", "t/c")]
