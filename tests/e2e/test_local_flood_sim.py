"""A flood on local pub/sub: another component's process publishes requests to the runtime's real
component process on the simulated core (`--sim-nucleus` names the nucleus) at 2,000 req/s for
10 s through the real awsiotsdk IPC client. Every request sent is answered exactly once (OVERLOADED
is an answer), a fresh request is answered after it, and no process grows without bound: the
nucleus (this process), the runtime and the flooder each stay within a bound of their RSS before
the flood. How soon after the flood a fresh request is answered in its normal time (against its own
baseline, measured first) is printed, not asserted: a time is a benchmark's to judge
(`edgeinfer bench iot`), never a test's.

On nucleus lite no IPC message may pass 10,000 bytes: the requests are sized to fit it as framed
(the request's JSON base64-encoded again in the binary message), on both nuclei alike.
"""

from __future__ import annotations

import base64
import os
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from edgeinfer import procfs
from edgeinfer.messages import Result, infer_topic, result_topic
from edgeinfer.sim import Simulator
from edgeinfer.sim.broker import Inbox
from edgeinfer.sim.testing import CLIENT, RUNTIME, prepare_device, wait_ready
from edgeinfer_bench.iot.local_sender import LocalFlood, LocalSpec
from edgeinfer_bench.iot.processes import find_runtime
from edgeinfer_bench.requests import timed_templates
from tests.helpers.wait import eventually

pytestmark = pytest.mark.e2e

THING = "local-flood"
RATE = 2000.0
SECONDS = 10.0
JPEG_BYTES = 4500  # a request of ~9 KB as framed: under nucleus lite's 10,000-byte IPC message
# How much a process may grow over its RSS before the flood. Unbounded, the backlog would be the
# flood's requests themselves (~9 KB each, some 20,000 of them: ~180 MB), far above this.
RSS_GROWTH = 1.5
# "In its normal time": within this many times its baseline's median (the machine is shared); the
# probes go on for at most PROBE_S after the flood's end.
SLOWER = 20.0
PROBE_S = 35.0


def image(max_bytes: int) -> bytes:
    """A noisy JPEG just under `max_bytes` (noise, so that it does not compress to nothing)."""
    rng = np.random.default_rng(5)
    side = 96
    while True:
        img = cv2.GaussianBlur(rng.integers(0, 255, (side, side, 3), dtype=np.uint8), (0, 0), 1.5)
        ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 80])
        assert ok
        if len(buf) <= max_bytes:
            return bytes(buf)
        side -= 8


class Rss:
    """Each process's VmRSS every 0.1 s, until closed."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.samples: dict[str, list[int]] = {name: [] for name in pids}
        self.cpu: dict[str, list[tuple[float, float]]] = {name: [] for name in pids}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.1):
            for name, pid in self.pids.items():
                value = procfs.process_rss_bytes(pid)
                if value:
                    self.samples[name].append(value)
                    self.cpu[name].append((time.monotonic(), procfs.process_cpu_s(pid) or 0.0))

    def mark(self) -> dict[str, int]:
        """How many samples each has now (a start for `peak`)."""
        return {name: len(s) for name, s in self.samples.items()}

    def last(self, name: str) -> int:
        return self.samples[name][-1]

    def peak(self, name: str, since: dict[str, int]) -> int:
        return max(self.samples[name][since[name] :], default=0)

    def cores(self, name: str, since: dict[str, int], until: dict[str, int]) -> float:
        """The CPU (cores) the process used between two marks."""
        (t0, c0), (t1, c1) = self.cpu[name][since[name]], self.cpu[name][until[name] - 1]
        return round((c1 - c0) / (t1 - t0), 2) if t1 > t0 else 0.0

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


class Answers:
    """The results received so far, read once each: each id's answers, as "ok" or the error's code
    (only those, so that this process's own bookkeeping stays small beside what it measures)."""

    def __init__(self, inbox: Inbox) -> None:
        self.inbox = inbox
        self.ids: dict[str | None, list[str]] = {}
        self._read = 0

    def update(self) -> dict[str | None, list[str]]:
        messages = self.inbox.messages
        for m in messages[self._read :]:
            r = Result.parse(m.payload)
            self.ids.setdefault(r.id, []).append(r.error.code.value if r.error is not None else r.status)
        self._read = len(messages)
        return self.ids


class Probe:
    """Fresh requests from a test component, one at a time, and how long each took to its answer."""

    def __init__(self, sim: Simulator, answers: Answers, body: Callable[[str], dict[str, Any]]) -> None:
        self.local = sim.local_client()
        self.answers = answers
        self.body = body
        self.n = 0

    def send(self) -> tuple[str, float]:
        self.n += 1
        rid = f"probe-{self.n}"
        self.local.publish(infer_topic(THING), self.body(rid))
        return rid, time.monotonic()

    def answer(self, rid: str, timeout: float) -> str | None:
        limit = time.monotonic() + timeout
        while time.monotonic() < limit:
            got = self.answers.update().get(rid)
            if got:
                return got[0]
            time.sleep(0.002)
        return None

    def once(self, timeout: float = 30.0) -> tuple[str | None, float]:
        rid, t0 = self.send()
        result = self.answer(rid, timeout)
        return result, time.monotonic() - t0


def test_a_local_flood_is_answered_exactly_once_and_recovers_with_bounded_memory(
    simulator: Callable[..., Simulator], write_tiny_store: Callable[[Path], Path], tmp_path: Path
) -> None:
    store = write_tiny_store(tmp_path / "store")
    recipes, artifacts = prepare_device(tmp_path / "device", store)
    config = {"executionProviders": ["CPUExecutionProvider"], "subscribeIot": False}
    sim = simulator(recipes, artifacts, thing=THING, config_merge={RUNTIME: config})
    wait_ready(sim, timeout=120)
    runtime = find_runtime(os.getpid())
    assert runtime is not None

    jpeg = base64.b64encode(image(JPEG_BYTES)).decode()
    parts = timed_templates([base64.b64decode(jpeg)], deadline_ms=2000, top_k=1)
    env = sim.ipc_env(CLIENT)
    spec = LocalSpec(
        socket=env["AWS_GG_NUCLEUS_DOMAIN_SOCKET_FILEPATH_FOR_COMPONENT"],
        token=env["SVCUID"],
        topic=infer_topic(THING),
        parts=parts,
        label="flood",
        rate=RATE,
        seconds=SECONDS,
    )
    answers = Answers(sim.local_client().subscribe(result_topic(THING)))
    probe = Probe(sim, answers, lambda rid: {"id": rid, "image": jpeg, "top_k": 1, "deadline_ms": 10_000})
    flood = LocalFlood(spec)
    rss: Rss | None = None
    try:
        flood.ready()
        # The baseline: fresh requests one at a time on the idle runtime (the first warms the path).
        probe.once()
        baseline = []
        for _ in range(10):
            code, took = probe.once()
            assert code == "ok"
            baseline.append(took)
        normal = statistics.median(baseline)

        rss = Rss({"nucleus": os.getpid(), "runtime": runtime, "flooder": flood.pid})
        eventually(lambda: all(rss.samples.values()), 10, "a first RSS sample of each process")
        before = {name: rss.last(name) for name in rss.pids}
        mark = rss.mark()
        ended = flood.go()
        flood_end = rss.mark()
        ended_mono = time.monotonic() - (time.time() - ended)

        # A fresh request every 0.1 s until one is answered ok in its normal time (or the probes'
        # time is up: then the test still asks that one was answered ok at all).
        recovered: float | None = None
        answered_ok = False
        after: list[tuple[float, float]] = []
        while recovered is None and time.monotonic() - ended_mono < PROBE_S:
            sent_after = time.monotonic() - ended_mono
            code, took = probe.once(timeout=30)
            after.append((round(sent_after, 2), round(took / normal, 1)))
            answered_ok = answered_ok or code == "ok"
            if code == "ok" and took <= SLOWER * normal:
                recovered = sent_after
            else:
                time.sleep(0.1)

        report = flood.report()
        sent = set(report["sent"])
        eventually(
            lambda: sent <= answers.update().keys(),
            60,
            "an answer to every request of the flood",
        )
        peaks = {name: rss.peak(name, mark) for name in rss.pids}
        cores = {name: rss.cores(name, mark, flood_end) for name in rss.pids}
    finally:
        if rss is not None:
            rss.close()
        flood.close()

    got = {rid: results for rid, results in answers.update().items() if rid in sent}
    codes: dict[str, int] = {}
    for answered in got.values():
        codes[answered[0]] = codes.get(answered[0], 0) + 1
    reached = len(sent) / max(1e-9, report["end"] - report["start"])
    figures = {name: (round(before[name] / 2**20), round(peaks[name] / 2**20)) for name in before}
    print(
        f"\nlocal flood on {sim.nucleus.name}: {len(sent)} sent at {reached:.0f} req/s "
        f"({report['not_sent']} not sent, the sender's window full), answers {codes}; "
        f"baseline {normal * 1000:.1f} ms, recovered {recovered} s after the end (probes: sent s, "
        f"× baseline {after}); RSS MB before/peak {figures}; CPU cores in the flood {cores}; "
        f"load {os.getloadavg()[0]:.1f}"
    )
    assert set(got) == sent
    assert all(len(results) == 1 for results in got.values()), "a request answered more than once"
    assert report["publish_refused"] == 0
    assert answered_ok, after  # the runtime serves again after the flood
    for name, rss_before in before.items():
        assert peaks[name] <= RSS_GROWTH * rss_before, (name, figures)
