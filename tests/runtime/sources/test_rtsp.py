"""Four RTSP streams from a real RTSP server (GStreamer's) on one runtime with the INT8 classifier:
every stream served, frames batched across streams, latency per stream reported; the server down
for ten seconds and back: every stream back, the outage counted; a stream that never returns is
tried again with backoff."""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.messages import TIMINGS_TOPIC
from edgeinfer.runtime.component import Component
from edgeinfer.runtime.config import SourceConfig, default_recipe_configuration
from edgeinfer.runtime.sources import SourceRunner
from edgeinfer.stats import quantile
from edgeinfer.telemetry.window import WindowAggregator
from edgeinfer.transport import MemoryBus
from tests.helpers.rtsp import RtspServer, rtsp_server  # noqa: F401  (the fixture)
from tests.helpers.wait import eventually

pytestmark = pytest.mark.slow  # the real classifier on four streams

THING = "c1"
OUTAGE_S = 10.0


def runtime(model_store: Path, tmp_path: Path, urls: list[str]) -> Component:
    config = default_recipe_configuration()
    config["executionProviders"] = ["cpu"]
    config["sources"] = [
        {"kind": "stream", "uri": url, "name": f"cam{i}", "rateHz": 10, "resultTopic": f"r/cam{i}"}
        for i, url in enumerate(urls)
    ]
    args = argparse.Namespace(model_dir=str(model_store), work_dir=str(tmp_path), thing=THING, option=[])
    return Component(MemoryBus(config=config), args)


def served(comp: Component) -> dict[str, int]:
    assert comp.sources is not None
    return {c.name: c.served for c in comp.sources.counters()}


def report(comp: Component, what: str) -> str:
    assert comp.sources is not None
    lines = [what]
    for name in sorted(comp.sources.runners):
        stats = comp.sources.runners[name].stats
        ms = stats.latencies()
        p50, p99 = (quantile(ms, q) for q in (0.5, 0.99)) if ms else (0.0, 0.0)
        lines.append(
            f"  {name}: served {stats.answered}, dropped {stats.dropped}, reconnects {stats.reconnects}, "
            f"outage {stats.outage_s:.1f} s, frame -> result p50 {p50:.1f} ms p99 {p99:.1f} ms"
        )
    return "\n".join(lines)


def test_four_streams_batched_across_and_back_after_the_server_returns(
    rtsp_server: RtspServer,  # noqa: F811
    model_store: Path,
    tmp_path: Path,
) -> None:
    comp = runtime(model_store, tmp_path, rtsp_server.urls)
    comp.start()
    try:
        bus = comp.bus
        assert isinstance(bus, MemoryBus)
        executed = len(comp.server.stats.batches)  # the self-test's before
        eventually(
            lambda: min(served(comp).values(), default=0) >= 30,
            timeout=120,
            what="30 frames of every stream served",
            detail=lambda: report(comp, "so far"),
        )
        batches = comp.server.stats.batches[executed:]
        mean_batch = float(np.mean(batches))
        print(report(comp, f"four streams at 10 fps: mean batch {mean_batch:.2f} over {len(batches)} runs"))
        assert mean_batch > 1
        for i in range(4):
            assert len(bus.messages_on(f"r/cam{i}")) >= 30

        stopped = time.monotonic()
        rtsp_server.stop()
        eventually(
            lambda: not any(c.connected for c in comp.sources.counters()),  # type: ignore[union-attr]
            timeout=30,
            what="every stream seen lost",
        )
        # the outage itself: the server stays down for its length
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - stopped)))
        before = served(comp)
        rtsp_server.start()
        back = time.monotonic()
        returned: dict[str, float] = {}

        def all_back() -> bool:
            for name, n in served(comp).items():
                if n > before[name] and name not in returned:
                    returned[name] = time.monotonic() - back
            return len(returned) == 4

        eventually(all_back, timeout=30, what="every stream back", detail=lambda: report(comp, "after"))
        print(
            report(
                comp, "after the outage: back in " + ", ".join(f"{n} {s:.1f} s" for n, s in returned.items())
            )
        )
        for counters in comp.sources.counters():  # type: ignore[union-attr]
            assert counters.reconnects == 1
            assert counters.outage_s > 0
        # and in telemetry: the timing batches the runtime published, folded into a window
        eventually(lambda: all(n == 1 for n in windowed(bus, "reconnects").values()), what="telemetry")
        window = windowed(bus, "outage_ms")
        print("telemetry outage per stream:", window)
        assert sorted(window) == [f"cam{i}" for i in range(4)]
        assert all(ms > 0 for ms in window.values())
    finally:
        comp.stop()


def windowed(bus: MemoryBus, counter: str) -> dict[str, int]:
    """One counter per source in a telemetry window of every timing batch published so far."""
    aggregator = WindowAggregator(THING)
    for message in bus.messages_on(TIMINGS_TOPIC):
        aggregator.add_payload(message.payload)
    return {name: counts.get(counter, 0) for name, counts in aggregator.flush().sources.items()}


class Sink:
    """Answers every frame at once."""

    def submit_frame(self, frame_id: str, image: np.ndarray, **kw: object) -> bool:
        on_done = kw.get("on_done")
        if callable(on_done):
            on_done()
        return True


def test_a_stream_that_never_returns_is_tried_again_ever_later(rtsp_server: RtspServer) -> None:  # noqa: F811
    cfg = SourceConfig(kind="stream", uri=rtsp_server.urls[0], rate_hz=10, name="gone", reconnect_max_s=8)
    runner = SourceRunner(cfg, Sink(), THING, 32)
    runner.start()
    try:
        eventually(lambda: runner.stats.answered >= 3, timeout=60, what="the stream served")
        rtsp_server.stop()
        eventually(lambda: runner.stats.attempts >= 4, timeout=60, what="four attempts after the loss")
        times = list(runner.stats.attempt_times)[:4]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        print("attempts spaced", ", ".join(f"{g:.2f} s" for g in gaps))
        assert gaps == sorted(gaps)
        assert runner.stats.lost_at is not None
        assert runner.stats.reconnects == 0
        assert runner._thread is not None
        assert runner._thread.is_alive()  # it never ends
    finally:
        runner.stop()
