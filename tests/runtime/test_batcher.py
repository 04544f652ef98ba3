"""The dynamic batcher's rules, driven by a fake clock (no sleeping)."""

from __future__ import annotations

import threading

import pytest

from edgeinfer.runtime.batcher import DynamicBatcher
from tests.helpers.clock import FakeClock


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def make(**kw: int) -> tuple[DynamicBatcher[str], Clock]:
    clock = Clock()
    opts = {"max_batch_size": 4, "max_queue_delay_us": 1000, "max_queue_size": 8, **kw}
    return DynamicBatcher(clock=clock, **opts), clock


def put(b: DynamicBatcher[str], item: str, deadline: float | None = None) -> None:
    assert b.admit()
    b.put(item, deadline)


def test_idle_engine_does_not_wait_when_nothing_is_on_its_way() -> None:
    b, clock = make()
    put(b, "a")
    poll = b.poll(clock())
    assert [q.item for q in poll.batch] == ["a"]
    assert poll.wait_s is None


def test_waits_up_to_the_queue_delay_for_requests_being_decoded() -> None:
    b, clock = make()
    put(b, "a")
    assert b.admit()  # "b" is being decoded
    poll = b.poll(clock())
    assert poll.batch == []
    assert poll.wait_s is not None
    assert 0 < poll.wait_s <= 0.001
    clock.t += 0.0004
    b.put("b")
    poll = b.poll(clock())  # nothing else incoming: go now with both
    assert [q.item for q in poll.batch] == ["a", "b"]


def test_queue_delay_expiry_dispatches_a_partial_batch() -> None:
    b, clock = make()
    put(b, "a")
    assert b.admit()  # still decoding, forever
    clock.t += 0.0011
    assert [q.item for q in b.poll(clock()).batch] == ["a"]


def test_full_batch_goes_at_once_in_fifo_order() -> None:
    b, clock = make()
    for i in range(6):
        put(b, str(i))
    assert b.admit()
    assert [q.item for q in b.poll(clock()).batch] == ["0", "1", "2", "3"]
    clock.t += 0.002
    assert [q.item for q in b.poll(clock()).batch] == ["4", "5"]


def test_bounded_queue_refuses_and_frees_slots() -> None:
    b, clock = make(max_queue_size=3)
    for i in range(3):
        put(b, str(i))
    assert not b.admit()
    assert b.outstanding == 3
    assert len(b.poll(clock()).batch) == 3
    assert b.outstanding == 0
    assert b.admit()
    b.release()
    assert b.outstanding == 0
    assert b.incoming == 0


def test_expired_items_leave_without_being_batched() -> None:
    b, clock = make()
    put(b, "late", deadline=clock() + 0.001)
    put(b, "fine", deadline=clock() + 10)
    put(b, "none")
    clock.t += 0.002
    poll = b.poll(clock())
    assert [q.item for q in poll.expired] == ["late"]
    assert [q.item for q in poll.batch] == ["fine", "none"]
    assert b.outstanding == 0


def test_no_waiting_that_would_miss_a_deadline() -> None:
    b, clock = make(max_queue_delay_us=100_000)
    put(b, "a", deadline=clock() + 0.5)
    assert b.admit()
    assert b.poll(clock()).batch == []  # 100 ms of delay fits in its 500 ms
    put(b, "b", deadline=clock() + 0.01)
    assert b.admit()
    assert [q.item for q in b.poll(clock()).batch] == ["a", "b"]


def test_zero_delay_never_waits_and_live_reconfigure() -> None:
    b, clock = make(max_queue_delay_us=0)
    put(b, "a")
    assert b.admit()
    assert len(b.poll(clock()).batch) == 1
    b.configure(max_batch_size=1, max_queue_size=2)
    b.put("b")
    put(b, "c")
    assert [q.item for q in b.poll(clock()).batch] == ["b"]


def test_get_blocks_until_put_and_close_returns_leftovers() -> None:
    b: DynamicBatcher[str] = DynamicBatcher(max_batch_size=2, max_queue_delay_us=0)
    got: list[list[str]] = []

    def consumer() -> None:
        got.append([q.item for q in b.get(timeout=30).batch])

    t = threading.Thread(target=consumer)
    t.start()
    assert b.admit()
    b.put("x")
    t.join(30)
    assert got == [["x"]]
    b.put("y", admitted=False)
    assert [q.item for q in b.close()] == ["y"]
    assert not b.admit()
    assert b.get(timeout=0).batch == []


def test_put_take_alone_hands_the_batch_to_the_caller_at_an_idle_runtime() -> None:
    b, _ = make()
    assert b.idle
    assert b.admit()
    poll = b.put_take("a", alone=True)
    assert poll is not None
    assert [q.item for q in poll.batch] == ["a"]
    assert not b.idle  # running until done()
    assert b.admit()
    later = b.put_take("b", alone=True)
    assert later is not None
    assert later.batch == []  # one batch at a time: "b" waits in the queue
    assert b.get(timeout=0).batch == []  # … for the engine thread too
    b.done(poll.slots)
    assert [q.item for q in b.get(timeout=0).batch] == ["b"]
    b.done()
    assert b.idle


def test_put_take_without_alone_leaves_the_batch_to_the_engine_threads() -> None:
    b, _ = make()
    assert b.admit()
    poll = b.put_take("a")  # a decode worker: it goes back to decoding
    assert poll is not None
    assert poll.batch == []
    assert [q.item for q in b.get(timeout=0).batch] == ["a"]


def test_put_take_waits_for_items_still_being_decoded_and_refuses_after_close() -> None:
    b, _ = make()
    assert b.admit()
    assert b.admit()
    first = b.put_take("a", alone=True)  # "b" is still being decoded: leave "a" for the batch to come
    assert first is not None
    assert first.batch == []
    second = b.put_take("b", alone=True)
    assert second is not None
    assert [q.item for q in second.batch] == ["a", "b"]
    b.done(second.slots)
    b.close()
    assert b.admit() is False
    assert b.put_take("c") is None


def test_lanes_hand_out_batches_side_by_side_and_alone_holds_them_all() -> None:
    clock = Clock()
    # Contention 1.0: the burst below would otherwise count as load (see the next test).
    b: DynamicBatcher[str] = DynamicBatcher(
        2, 1000, 16, clock=clock, lanes=2, full_session_max_contention=1.0, lane_batch_size=2
    )
    for item in "abcde":
        put(b, item)
    first, second = b.get(timeout=0), b.get(timeout=0)
    assert [q.item for q in first.batch] == ["a", "b"]
    assert [q.item for q in second.batch] == ["c", "d"]
    assert (first.slots, second.slots) == (1, 1)
    assert not first.alone
    assert b.get(timeout=0).batch == []  # both lanes taken
    b.done(first.slots)
    assert b.get(timeout=0).batch == []  # beside a running lane, a partial batch waits to fill …
    clock.t += 0.0011
    third = b.get(timeout=0)  # … up to the queue delay
    assert [q.item for q in third.batch] == ["e"]
    assert third.slots == 1  # another lane still runs
    b.done(second.slots)
    b.done(third.slots)
    assert b.idle
    assert b.admit()
    alone = b.put_take("f", alone=True)  # arrived at an idle runtime: every lane
    assert alone is not None
    assert alone.slots == 2
    assert alone.alone
    assert b.admit()
    waiting = b.put_take("g")
    assert waiting is not None
    assert waiting.batch == []  # nothing beside a batch that runs alone
    b.done(alone.slots)
    assert [q.item for q in b.get(timeout=0).batch] == ["g"]


def test_under_load_a_batch_at_a_momentarily_idle_runtime_takes_one_lane() -> None:
    b, clock = make(lanes=2, max_batch_size=8, max_queue_size=16)
    assert b.quiet
    for item in "abcdefgh":  # a burst: each arrival after the first finds work in flight
        put(b, item)
    burst, beside = b.get(timeout=0), b.get(timeout=0)
    assert [len(burst.batch), len(beside.batch)] == [4, 4]  # under load: a lane's share each
    b.done(burst.slots)
    b.done(beside.slots)
    assert b.idle
    assert not b.quiet  # idle this moment, but under load
    assert b.contention > b.full_session_max_contention
    assert b.admit()
    poll = b.put_take("i", alone=True)
    assert poll is not None
    assert [q.item for q in poll.batch] == ["i"]
    assert poll.slots == 1  # a lane, not every core: the next arrival may come at any moment
    assert not poll.alone
    b.done(poll.slots)
    for _ in range(12):  # then requests one at a time, each finding the runtime idle
        assert b.admit()
        one = b.put_take("j", alone=True)
        assert one is not None
        b.done(one.slots)
    assert b.quiet
    assert one.alone  # quiet again: the whole session
    for item in "klmnop":  # another burst …
        put(b, item)
    b.done(b.get(timeout=0).slots)
    assert not b.quiet
    clock.t += 3.0  # … then nothing for a few seconds: the burst is forgotten
    assert b.admit()
    late = b.put_take("q", alone=True)
    assert late is not None
    assert late.alone
    b.done(late.slots)
    b.configure(full_session_max_contention=0.0)
    assert not b.quiet  # 0: never the whole session
    b.configure(lanes=1)
    assert b.quiet  # one lane: nothing could run beside it, idle is enough


def test_alone_only_when_nothing_else_is_coming() -> None:
    b, _ = make(lanes=2)
    assert b.admit()
    assert b.admit()  # a second request is being decoded
    first = b.put_take("a", alone=True)
    assert first is not None
    assert first.batch == []  # wait for it: the queue delay rule
    poll = b.put_take("b", alone=True)
    assert poll is not None
    assert [q.item for q in poll.batch] == ["a", "b"]
    assert poll.slots == 2
    b.done(poll.slots)


def test_alone_refused_while_items_stay_queued() -> None:
    b, _ = make(lanes=2, max_batch_size=2, lane_batch_size=2)
    for item in "abc":
        put(b, item)
    poll = b.get(timeout=0)  # an engine thread at an idle runtime, but "c" is left behind
    assert [q.item for q in poll.batch] == ["a", "b"]
    assert poll.slots == 1
    assert not poll.alone
    last = b.get(timeout=0)  # beside a running lane: "c" waits to fill, then goes on a lane
    assert last.batch == []


def test_a_lane_batch_holds_its_share_and_a_batch_with_every_lane_may_be_full() -> None:
    b, clock = make(lanes=2, max_batch_size=8, max_queue_size=32)
    assert b.lane_batch_size == 4  # 0: the lanes together hold one full batch
    for item in "abcdefgh":  # queued while nothing is being decoded, at a quiet idle runtime
        b.put(item, admitted=False)
    b.contention = 0.0
    whole = b.get(timeout=0)
    assert len(whole.batch) == 8  # may hold every lane: a full batch
    assert whole.alone
    b.done(whole.slots)
    for item in "ijklmn":
        b.put(item, admitted=False)
    b.contention = 1.0  # under load: lanes
    first = b.get(timeout=0)
    assert [q.item for q in first.batch] == list("ijkl")  # full for a lane: goes at once
    assert first.slots == 1
    assert b.get(timeout=0).batch == []  # "mn" wait beside the running lane to fill …
    clock.t += 0.0011
    assert [q.item for q in b.get(timeout=0).batch] == ["m", "n"]  # … up to the queue delay
    b.configure(lane_batch_size=3)
    assert b.lane_batch_size == 3
    b.configure(lane_batch_size=100)
    assert b.lane_batch_size == 8  # never more than max_batch_size
    b.configure(lanes=1, lane_batch_size=0)
    assert b.lane_batch_size == 8  # one lane: the whole batch
    b.configure(lane_batch_size=4)
    assert b.lane_batch_size == 8  # … whatever the setting: every batch holds the one lane


def test_one_lane_batches_are_full_under_load_whatever_the_lane_setting() -> None:
    b, _ = make(lanes=1, max_batch_size=8, max_queue_size=32, lane_batch_size=4)
    for item in "abcdefghij":
        b.put(item, admitted=False)
    b.contention = 1.0
    poll = b.get(timeout=0)
    assert len(poll.batch) == 8
    assert poll.alone  # the whole session, as a one-lane runtime runs every batch


def test_expired_items_do_not_count_against_a_batch_with_every_lane() -> None:
    b, clock = make(lanes=2, max_batch_size=8, max_queue_size=32)
    b.put("late", clock.t + 0.001, admitted=False)
    for item in "abcdefgh":
        b.put(item, admitted=False)
    b.contention = 0.0
    clock.t += 0.002
    poll = b.get(timeout=0)
    assert [q.item for q in poll.expired] == ["late"]
    assert len(poll.batch) == 8  # nine queued, one expired: one full batch with every lane
    assert poll.alone
    assert b.outstanding == 0


def test_the_wait_floor_counts_full_batches_ahead_that_will_still_run() -> None:
    b, clock = make(max_queue_size=16)
    assert b.wait_floor_s(0.010) == 0.0  # nothing ahead
    for i in range(3):
        put(b, f"q{i}")
    assert b.wait_floor_s(0.010) == 0.0  # not one full batch ahead: its own batch may hold them
    put(b, "q3")
    assert b.wait_floor_s(0.010) == 0.010
    for i in range(4):  # two more full batches' worth, due in 15 ms: the first four run in time,
        put(b, f"due{i}", deadline=clock() + 0.015)  # the next four only start 10 ms in: they do too
    for i in range(4):
        put(b, f"soon{i}", deadline=clock() + 0.005)  # … these start 20 ms in: they expire, never run
    assert b.wait_floor_s(0.010) == pytest.approx(0.020)
    assert b.admit()  # one being decoded counts too (it will queue), …
    for _ in range(3):
        assert b.admit()
    assert b.wait_floor_s(0.010) == pytest.approx(0.030)
    b.configure(lanes=2, lane_batch_size=4)  # … and lanes run batches side by side: 8 a round
    assert b.wait_floor_s(0.010) == pytest.approx(0.010)


# ------------------------------------------------------------- a batch's own run time and its deadlines


def timed(**kw: int) -> tuple[DynamicBatcher[str], FakeClock]:
    """A batcher that has seen one lone request run in 10 ms: it expects 10 ms an item."""
    clock = FakeClock()
    opts = {"max_batch_size": 4, "max_queue_delay_us": 1000, "max_queue_size": 8, **kw}
    b: DynamicBatcher[str] = DynamicBatcher(clock=clock, **opts)
    b.observe_run(1, 0.010, alone=True)
    return b, clock


def test_a_batch_that_would_end_late_leaves_its_doomed_behind_and_the_rest_run_smaller() -> None:
    b, clock = timed()
    assert b.expected_run_s(4, alone=True) == pytest.approx(0.040)
    put(b, "a", deadline=clock() + 0.035)  # misses in a batch of 4 (40 ms), makes it in one of 3
    put(b, "b")
    put(b, "c", deadline=clock() + 0.100)
    put(b, "d", deadline=clock() + 0.015)  # misses in any batch with others
    poll = b.poll(clock())
    assert [q.item for q in poll.batch] == ["a", "b", "c"]  # queue order
    assert [q.item for q in poll.doomed] == ["d"]
    assert poll.run_s == pytest.approx(0.040)  # what "d" was judged by: a batch of 4
    assert poll.expired == []
    assert b.outstanding == 0


def test_nothing_is_doomed_before_a_run_of_that_kind_was_seen() -> None:
    b, clock = make()
    put(b, "a", deadline=clock() + 0.001)
    put(b, "b", deadline=clock() + 0.002)
    poll = b.poll(clock())
    assert [q.item for q in poll.batch] == ["a", "b"]
    assert poll.doomed == []
    b2, _ = timed(lanes=2)  # a batch with every lane ran; a lane's batch has no estimate yet
    assert b2.expected_run_s(2, alone=False) == 0.0
    assert b2.expected_run_s(2, alone=True) == pytest.approx(0.020)


def test_the_early_partial_batch_counts_its_own_run_time() -> None:
    for seen, goes in ((False, False), (True, True)):
        b, clock = timed(max_queue_delay_us=100_000) if seen else make(max_queue_delay_us=100_000)
        put(b, "a", deadline=clock() + 0.105)  # 100 ms of delay fits, 100 ms + its 10 ms run does not
        assert b.admit()  # another on its way: without the deadline it would wait for it
        poll = b.poll(clock())
        assert bool(poll.batch) is goes
        assert poll.doomed == []


def test_a_lone_doomed_item_is_answered_at_once_and_holds_no_lane() -> None:
    b, clock = timed(lanes=2)
    b.observe_run(1, 0.010, alone=False)
    put(b, "x", deadline=clock() + 0.005)  # less than one run left
    poll = b.get(timeout=0)
    assert poll.batch == []
    assert [q.item for q in poll.doomed] == ["x"]
    assert poll.slots == 0
    assert b.idle


class _CountingLock:
    """A reentrant lock that counts how often it is taken."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.taken = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        self.taken += 1
        return self.lock.acquire(blocking, timeout)

    def release(self) -> None:
        self.lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_idle_is_read_under_the_lock_a_batch_taken_holds() -> None:
    # Taking a batch moves its items from admitted to running in two steps: read between them
    # unlocked, a busy batcher looks idle and the repository's eviction unloads its model.
    b: DynamicBatcher[int] = DynamicBatcher()
    counting = _CountingLock()
    b._cond = threading.Condition(counting)  # type: ignore[arg-type]
    assert b.idle
    assert counting.taken == 1
