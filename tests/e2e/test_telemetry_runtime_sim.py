"""The runtime and the telemetry component together on the simulated core (tiny model, real IPC).

Results come from the runtime; windows from the telemetry component, through IoT Core (mosquitto).
The telemetry window's percentiles must match the latencies the results reported, within the
histogram's precision — the same run, seen from both ends.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from edgeinfer.messages import ErrorCode, Result, TelemetryWindow
from edgeinfer.model.samples import cat_image
from edgeinfer.sim import MosquittoBroker, Simulator
from edgeinfer.sim.testing import RUNTIME
from edgeinfer.telemetry.histogram import RELATIVE_PRECISION
from tests.e2e.conftest import running_device
from tests.helpers.wait import eventually

pytestmark = pytest.mark.e2e

TELEMETRY = "com.edgeinfer.Telemetry"
THING = "tele-rt-e2e"
INFER = f"edgeinfer/{THING}/infer"
RESULT = f"edgeinfer/{THING}/result"
WINDOW_S = 4.0


@pytest.fixture(scope="module")
def device(
    sim_broker: MosquittoBroker,
    tmp_path_factory: pytest.TempPathFactory,
    write_tiny_store: Callable[[Path], Path],
) -> Iterator[Simulator]:
    root = tmp_path_factory.mktemp("tele-rt")
    store = write_tiny_store(root / "store")
    config = {RUNTIME: {"maxBatchSize": 8, "maxQueueDelayUs": 5000}, TELEMETRY: {"windowSeconds": WINDOW_S}}
    with running_device(root, store, sim_broker, THING, config, telemetry=True) as sim:
        yield sim


def windows(inbox: Any) -> list[TelemetryWindow]:
    return [TelemetryWindow.from_dict(json.loads(m.payload)) for m in inbox.messages]


def counted(inbox: Any, since: int, n: int) -> Callable[[], bool]:
    """Whether the windows from the `since`-th on count `n` requests or more."""
    return lambda: sum(w.count for w in windows(inbox)[since:]) >= n


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def test_telemetry_matches_the_results_of_the_same_run(device: Simulator) -> None:
    cat = base64.b64encode(cat_image().read_bytes()).decode()
    cloud = device.cloud_client()
    tele = cloud.subscribe(f"edgeinfer/{THING}/telemetry")
    local = device.local_client()
    results_inbox = local.subscribe(RESULT)
    n = 40
    for attempt in range(4):
        # start right after a window boundary, so that the whole burst falls into one window
        seen = len(tele.messages)
        tele.wait_for(seen + 1, timeout=3 * WINDOW_S)
        results_inbox.clear()
        prefix = f"a{attempt}-"
        for i in range(n):
            local.publish(INFER, {"id": f"{prefix}{i}", "image": cat})
        local.publish(INFER, b"{not json")  # one error result, counted by code
        got = [Result.parse(m.payload) for m in results_inbox.wait_for(n + 1, timeout=60)]
        # The burst's timings reach telemetry after its results, in batches of their own: wait until
        # closed windows count all of them, not for some number of windows.
        eventually(counted(tele, seen, n + 1), 10 * WINDOW_S, "windows counting the burst")
        busy = [w for w in windows(tele)[seen:] if w.count]
        if len(busy) == 1:
            break
    else:
        pytest.fail(f"every burst straddled a window boundary: {[w.count for w in busy]}")
    (window,) = busy
    ok = [r for r in got if r.status == "ok"]
    assert len(ok) == n
    assert window.count == n + 1
    assert window.errors == {ErrorCode.BAD_REQUEST.value: 1}
    assert window.provider == ok[0].provider == "CPUExecutionProvider"
    assert window.batch["inferences"] == n
    assert 1 <= window.batch["executions"] <= n
    assert window.batch["mean_size"] == pytest.approx(n / window.batch["executions"], abs=1e-3)
    for stage in ("queue", "decode", "inference", "postprocess", "total"):
        values = [getattr(r.latency_ms, stage) for r in ok]
        for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
            want = nearest_rank(values, q)
            got_q = getattr(window.latency_ms[stage], name)
            assert abs(got_q - want) <= RELATIVE_PRECISION * want + 0.001, (stage, name, got_q, want)
        assert window.latency_ms[stage].max == pytest.approx(max(values), abs=0.0005)
    seqs = [w.seq for w in windows(tele)]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert device.state(TELEMETRY) == "RUNNING"
