"""The spool: an outage loses no window, `seq` stays continuous and ordered, the bound drops oldest."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from edgeinfer.messages import TelemetryWindow, TimingBatch, telemetry_topic
from edgeinfer.telemetry.spool import Spool, SpoolingPublisher, atomic_write
from edgeinfer.telemetry.window import WindowAggregator
from edgeinfer.transport import MemoryBus
from tests.helpers.clock import FakeClock
from tests.helpers.telemetry import make_record

TOPIC = telemetry_topic("dev")


def sent(bus: MemoryBus) -> list[TelemetryWindow]:
    return [TelemetryWindow.from_dict(json.loads(m.payload)) for m in bus.messages_on(TOPIC, "iot")]


def run(
    agg: WindowAggregator,
    pub: SpoolingPublisher,
    clock: FakeClock,
    seconds: float,
    rng: random.Random,
) -> None:
    """The component's loop: records arrive, the loop ticks every 0.25 s."""
    for _ in range(int(seconds * 4)):
        agg.add(TimingBatch("dev", [make_record(rng) for _ in range(3)]))
        clock.advance(0.25)
        for window in agg.poll():
            pub.submit(window)
        pub.pump()


@pytest.mark.parametrize("window_s", [1.0, 10.0])
def test_a_ten_second_outage_loses_no_window(tmp_path: Path, clock: FakeClock, window_s: float) -> None:
    rng = random.Random(4)
    bus = MemoryBus()
    pub = SpoolingPublisher(bus, TOPIC, Spool(tmp_path), clock=clock)
    agg = WindowAggregator("dev", window_s=window_s, clock=clock, first_seq=pub.next_seq)
    run(agg, pub, clock, 25, rng)
    bus.fail_publish = True
    run(agg, pub, clock, 10.5, rng)
    assert len(pub.spool) >= 1
    assert not pub.online
    bus.fail_publish = False
    run(agg, pub, clock, 40, rng)
    pub.submit(agg.flush())  # the still-open window, as at shutdown
    windows = sent(bus)
    seqs = [w.seq for w in windows]
    assert seqs == list(range(len(seqs)))  # continuous, in order, nothing twice
    assert len(seqs) == agg.next_seq
    assert sum(w.count for w in windows) == 3 * 4 * (25 + 10.5 + 40)  # every record in one window
    assert len(pub.spool) == 0
    assert all(w.system["spool"]["dropped"] == 0 for w in windows)


def test_retries_back_off_while_offline(tmp_path: Path, clock: FakeClock) -> None:
    bus = MemoryBus(fail_publish=True)
    attempts = 0
    real = bus.publish

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal attempts
        attempts += 1
        return real(*args, **kwargs)

    bus.publish = counting  # type: ignore[method-assign]
    pub = SpoolingPublisher(bus, TOPIC, Spool(tmp_path), clock=clock, retry_s=1, max_retry_s=8)
    agg = WindowAggregator("dev", window_s=1, clock=clock)
    for _ in range(240):  # a minute at 4 ticks a second
        clock.advance(0.25)
        for window in agg.poll():
            pub.submit(window)
        pub.pump()
    assert len(pub.spool) == 60
    assert attempts < 15  # 1, 2, 4, 8, 8, ... seconds apart, not once per tick or per window


def test_the_bound_drops_the_oldest_and_counts_them(tmp_path: Path, clock: FakeClock) -> None:
    bus = MemoryBus(fail_publish=True)
    pub = SpoolingPublisher(bus, TOPIC, Spool(tmp_path, max_windows=3), clock=clock)
    agg = WindowAggregator("dev", window_s=1, clock=clock)
    for _ in range(5):
        clock.advance(1)
        pub.submit(agg.poll()[0])
    assert pub.spool.seqs() == [2, 3, 4]
    assert pub.spool.dropped == 2
    bus.fail_publish = False
    clock.advance(30)
    pub.submit(agg.poll()[0])
    windows = sent(bus)
    assert [w.seq for w in windows] == [2, 3, 4, 5]
    assert windows[-1].system["spool"]["dropped"] == 2  # the loss is reported, and the seq gap shows it


def test_byte_bound(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=250)
    for seq in range(5):
        spool.put(seq, b"x" * 100)
    assert spool.seqs() == [3, 4]
    assert spool.dropped == 3
    big = Spool(tmp_path / "big", max_bytes=10)
    big.put(0, b"y" * 100)  # one window always fits
    assert big.seqs() == [0]


def test_a_restart_resends_the_spool_and_continues_seq(tmp_path: Path, clock: FakeClock) -> None:
    bus = MemoryBus(fail_publish=True)
    pub = SpoolingPublisher(bus, TOPIC, Spool(tmp_path), clock=clock)
    agg = WindowAggregator("dev", window_s=1, clock=clock, first_seq=pub.next_seq)
    for _ in range(4):
        clock.advance(1)
        pub.submit(agg.poll()[0])
    (tmp_path / ".000000000009.json.abc.tmp").write_bytes(b"{partial")  # a crash mid-write

    bus2 = MemoryBus()
    pub2 = SpoolingPublisher(bus2, TOPIC, Spool(tmp_path), clock=clock)
    assert pub2.next_seq == 4
    assert not list(tmp_path.glob(".*"))
    agg2 = WindowAggregator("dev", window_s=1, clock=clock, first_seq=pub2.next_seq)
    clock.advance(1)
    pub2.submit(agg2.poll()[0])
    assert [w.seq for w in sent(bus2)] == [0, 1, 2, 3, 4]
    # and the state survives an empty spool too
    assert Spool(tmp_path).next_seq == 5


def test_unreadable_state_is_ignored(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text("[not a dict")
    spool = Spool(tmp_path)
    assert spool.next_seq == 0
    assert len(spool) == 0


def test_atomic_write_leaves_no_partial_file(tmp_path: Path) -> None:
    target = tmp_path / "w.json"
    atomic_write(target, b"one")
    atomic_write(target, b"two")
    assert target.read_bytes() == b"two"
    assert [p.name for p in tmp_path.iterdir()] == ["w.json"]


def test_a_window_that_cannot_be_spooled_is_counted(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = MemoryBus(fail_publish=True)
    spool = Spool(tmp_path / "spool")
    pub = SpoolingPublisher(bus, TOPIC, spool, clock=clock)
    agg = WindowAggregator("dev", window_s=1, clock=clock)
    clock.advance(1)
    pub.submit(agg.poll()[0])
    with monkeypatch.context() as patch:

        def disk_full(seq: int, payload: bytes) -> None:
            raise OSError(28, "No space left on device")

        patch.setattr(spool, "put", disk_full)
        clock.advance(1)
        assert not pub.submit(agg.poll()[0])
    assert spool.dropped == 1
    bus.fail_publish = False
    clock.advance(30)
    pub.submit(agg.poll()[0])
    windows = sent(bus)
    assert [w.seq for w in windows] == [0, 2]
    assert windows[-1].system["spool"]["dropped"] == 1
