"""What the canary watches: windows read from payloads, split by thing, a watch that ends on arrival."""

from __future__ import annotations

import threading
import time

import pytest

from edgeinfer_cloud.canary.windows import Deliver, RecordedWindows, WindowSource, read_window, watch
from tests.helpers.canary import fleet_windows, telemetry_window


def test_read_window_takes_the_figures_it_compares() -> None:
    w = read_window(telemetry_window("cam-1", 4, count=50, errors={"INTERNAL": 2}, p99_ms=210.0))
    assert w is not None
    assert (w.thing, w.requests, w.errors, w.p99_ms, w.low_confidence) == (
        "cam-1",
        50,
        {"INTERNAL": 2},
        210.0,
        None,
    )


def test_a_window_without_ok_requests_has_no_p99() -> None:
    w = read_window(telemetry_window("cam-1", 1, count=3, errors={"INTERNAL": 3}))
    assert w is not None
    assert w.p99_ms is None


@pytest.mark.parametrize(
    ("models", "expected"),
    [
        ([{"name": "m", "version": "2", "count": 40, "low_confidence": 6}], (6, 40)),
        ([{"name": "m", "count": 40, "low_confidence_share": 0.25}, {"name": "n", "count": 10}], (10, 40)),
        ([{"name": "m", "version": "2"}], None),  # identity only: no quality figures
    ],
)
def test_model_quality_is_read_where_the_window_carries_it(
    models: list[dict[str, object]], expected: tuple[int, int] | None
) -> None:
    w = read_window(telemetry_window("cam-1", 1, models=models))
    assert w is not None
    assert w.low_confidence == expected


@pytest.mark.parametrize("payload", [b"garbage", b"[1, 2]", b'{"thing": "x"}'])
def test_what_is_not_a_window_is_none(payload: bytes) -> None:
    assert read_window(payload) is None


def test_watch_splits_canary_from_fleet_and_counts_the_rest() -> None:
    payloads = fleet_windows(["f-1", "f-2"], 2) + fleet_windows(["c-1"], 2) + [b"garbage"]
    seen = watch(RecordedWindows(payloads), ["c-1"], duration_s=0.0)
    assert [w.thing for w in seen.canary] == ["c-1", "c-1"]
    assert sorted(w.thing for w in seen.fleet) == ["f-1", "f-1", "f-2", "f-2"]
    assert seen.ignored == 1


class Trickle(WindowSource):
    """Delivers from its own thread, as a broker's client does, one window at a time."""

    def __init__(self, payloads: list[bytes]) -> None:
        self.payloads = payloads
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self, deliver: Deliver) -> None:
        def run() -> None:
            for payload in self.payloads:
                if self.stopped.is_set():
                    return
                deliver(payload)

        self.thread = threading.Thread(target=run)
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        if self.thread is not None:
            self.thread.join()


def test_watch_ends_once_enough_windows_arrived_not_at_its_time() -> None:
    payloads = fleet_windows(["f-1"], 2) + fleet_windows(["c-1", "c-2"], 2)
    started = time.monotonic()
    seen = watch(Trickle(payloads), ["c-1", "c-2"], duration_s=60.0, windows_per_thing=2)
    assert time.monotonic() - started < 30
    assert len(seen.canary) == 4
    assert len(seen.fleet) == 2


def test_watch_ends_at_its_time_when_a_canary_stays_silent() -> None:
    seen = watch(
        Trickle(fleet_windows(["f-1", "c-1"], 3)), ["c-1", "c-2"], duration_s=0.2, windows_per_thing=2
    )
    assert 0.2 <= seen.seconds < 30
    assert len(seen.canary) == 3
    assert len(seen.fleet) == 3
