"""`edgeinfer demo`'s helpers (the demo itself is `make demo`)."""

from __future__ import annotations

import json
import threading

from edgeinfer.demo import _first_busy_window
from edgeinfer.sim.broker import Inbox
from edgeinfer.transport import Message


def window(seq: int, count: int) -> Message:
    return Message("edgeinfer/t/telemetry", json.dumps({"seq": seq, "count": count}).encode(), "iot")


def test_the_first_window_that_counted_requests_is_shown() -> None:
    inbox = Inbox()
    inbox.put(window(0, 0))  # closed while the runtime warmed up
    later = threading.Timer(0.05, lambda: (inbox.put(window(1, 0)), inbox.put(window(2, 53))))
    later.start()
    try:
        got = _first_busy_window(inbox, timeout=30)
    finally:
        later.join()
    assert got == {"seq": 2, "count": 53}


def test_no_busy_window_in_time_is_none() -> None:
    inbox = Inbox()
    inbox.put(window(0, 0))
    assert _first_busy_window(inbox, timeout=0.2) is None
