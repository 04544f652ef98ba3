"""edgeinfer_bench.iot.spawned: a sender's process spoken to over its pipe, on real spawned processes."""

from __future__ import annotations

import sys
from multiprocessing.connection import Connection

import pytest

from edgeinfer.errors import EdgeinferError
from edgeinfer_bench.iot.spawned import SpawnedSender


def says_each_in_turn(conn: Connection, last: float) -> None:
    conn.send(("ready", None))
    if conn.poll(60) and conn.recv()[0] == "go":
        conn.send(("ended", last))
        conn.send(("done", {"sent": 3}))
    conn.close()


def exits(conn: Connection, code: int) -> None:
    sys.exit(code)


def says_done_first(conn: Connection, _: None) -> None:
    conn.send(("done", None))
    conn.close()


def test_ready_go_and_ended_in_turn() -> None:
    sender = SpawnedSender(says_each_in_turn, 12.5, name="test-sender", who="the test sender", limit=60)
    try:
        assert sender.pid == sender.proc.pid
        sender.ready()
        assert sender.go() == 12.5
    finally:
        sender.close()
    assert not sender.proc.is_alive()


def test_a_process_that_ends_without_a_word_is_one_error_with_its_exit_status() -> None:
    sender = SpawnedSender(exits, 3, name="test-sender", who="the test sender", limit=60)
    try:
        with pytest.raises(EdgeinferError, match=r"^the test sender ended before ready \(exit 3\)$"):
            sender.ready()
    finally:
        sender.close()


def test_a_word_out_of_turn_is_named() -> None:
    sender = SpawnedSender(says_done_first, None, name="test-sender", who="the test sender", limit=60)
    try:
        with pytest.raises(EdgeinferError, match=r"^the test sender said done, not ready$"):
            sender.ready()
    finally:
        sender.close()
