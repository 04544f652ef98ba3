"""Capture's tally: exact under several threads, each increment handed on once."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping

from edgeinfer.capture.counts import CaptureCounts


def test_increments_from_several_threads_all_count_and_reach_the_sink() -> None:
    seen: Counter[str] = Counter()
    lock = threading.Lock()

    def sink(counts: Mapping[str, int]) -> None:
        with lock:
            seen.update(counts)

    tally = CaptureCounts(sink)
    threads = [threading.Thread(target=lambda: [tally.add("chosen") for _ in range(2000)]) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert tally["chosen"] == 16000
    assert seen == Counter({"chosen": 16000})
    tally.add("spooled", 0)  # nothing happened: nothing handed on
    assert "spooled" not in seen
    assert tally.totals()["spooled"] == 0
