"""The processes `edgeinfer bench iot` starts and watches: mosquitto and the simulated nucleus with
the runtime deployed (Core), and their memory and CPU every SAMPLE_INTERVAL_S (Sampler)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from edgeinfer import procfs
from edgeinfer.errors import EdgeinferError

THING = "bench-iot"
PROCESSES = ("nucleus", "runtime", "broker")
SAMPLE_INTERVAL_S = 0.2
START_TIMEOUT_S = 180.0


def descendants(pid: int) -> Iterator[int]:
    """Every process below `pid` (children of each of its threads, recursively)."""
    todo = [pid]
    while todo:
        for child in procfs.children(todo.pop()):
            yield child
            todo.append(child)


def find_runtime(nucleus_pid: int) -> int | None:
    """The runtime component's process among the nucleus's descendants (its run script `exec`s it).
    None also while that exec is finishing (its argv reads empty then): the sampler asks again."""
    for pid in descendants(nucleus_pid):
        argv = procfs.cmdline(pid) or []
        if b"edgeinfer.runtime" in argv and b"-c" not in argv:
            return pid
    return None


class Sampler:
    """VmRSS and CPU seconds of the nucleus, the runtime and the broker every SAMPLE_INTERVAL_S. The
    runtime's pid is looked up again whenever it is gone (a restart); every pid it had is kept."""

    def __init__(self, nucleus: int, broker: int) -> None:
        self.pids: dict[str, int | None] = {
            "nucleus": nucleus,
            "runtime": find_runtime(nucleus),
            "broker": broker,
        }
        self.runtime_pids = {self.pids["runtime"]} - {None}
        self.samples: list[tuple[float, dict[str, int | None], dict[str, float]]] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="bench-iot-rss", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            self.sample()

    def sample(self) -> None:
        rss: dict[str, int | None] = {}
        cpu: dict[str, float] = {}
        for name in PROCESSES:
            pid = self.pids[name]
            value = procfs.process_rss_bytes(pid) if pid else None
            if value is None and name == "runtime":
                pid = self.pids["runtime"] = find_runtime(int(self.pids["nucleus"] or 0))
                if pid:
                    self.runtime_pids.add(pid)
                    value = procfs.process_rss_bytes(pid)
            rss[name] = value
            cpu[name] = procfs.process_cpu_s(pid) if pid else 0.0
        with self._lock:
            self.samples.append((time.time(), rss, cpu))

    def between(self, t0: float, t1: float) -> dict[str, Any]:
        """Peak and last RSS (MB) and the CPU share (cores) of each process in [t0, t1]."""
        with self._lock:
            inside = [s for s in self.samples if t0 <= s[0] <= t1]
        out: dict[str, Any] = {}
        for name in PROCESSES:
            values = [s[1][name] for s in inside if s[1][name] is not None]
            mb = [v / 2**20 for v in values if v is not None]
            share = None
            if len(inside) >= 2 and inside[-1][0] > inside[0][0]:
                spent = inside[-1][2][name] - inside[0][2][name]
                share = round(max(0.0, spent) / (inside[-1][0] - inside[0][0]), 3) if spent >= 0 else None
            out[name] = {
                "rss_peak_mb": round(max(mb), 1) if mb else None,
                "rss_last_mb": round(mb[-1], 1) if mb else None,
                "cpu_cores": share,
            }
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


class Core:
    """mosquitto and `edgeinfer sim up` (foreground, its own session) with the runtime deployed."""

    def __init__(self, root: Path, store: Path, runtime_config: dict[str, Any], nucleus: str) -> None:
        from edgeinfer.sim.broker import MosquittoBroker

        self.root = root
        self.store = store
        self.runtime_config = runtime_config
        self.nucleus = nucleus
        self.broker = MosquittoBroker(work_dir=root / "broker")
        self.proc: subprocess.Popen[bytes] | None = None
        self.broker_pid = 0

    def start(self) -> None:
        """Broker, then the nucleus, until the runtime reported RUNNING; `stop()` undoes any part."""
        from edgeinfer.sim.testing import RUNTIME, prepare_device

        root = self.root
        self.broker.start()
        conf = str(root / "broker" / "mosquitto.conf").encode()
        found = procfs.find_pids(lambda argv: conf in argv)
        if not found:
            raise EdgeinferError("the broker's process was not found in /proc")
        self.broker_pid = found[0]
        recipes, artifacts = prepare_device(root / "device", self.store)
        self.work = root / "core"
        argv = [sys.executable, "-m", "edgeinfer", "sim", "up", "--recipes", str(recipes)]
        argv += ["--artifacts", str(artifacts), "--work-dir", str(self.work), "--thing", THING]
        argv += ["--broker", f"{self.broker.host}:{self.broker.port}", "--nucleus", self.nucleus]
        argv += ["--config-merge", f"{RUNTIME}={json.dumps(self.runtime_config)}"]
        self.out = root / "sim.out"
        with self.out.open("wb") as out:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
            )
        self._wait_ready(RUNTIME)

    @property
    def address(self) -> tuple[str, int]:
        return self.broker.host, self.broker.port

    def _wait_ready(self, component: str) -> None:
        limit = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < limit:
            self.check()
            with contextlib.suppress(OSError, ValueError):
                status = json.loads((self.work / "status.json").read_text())
                info = status.get("components", {}).get(component, {})
                if info.get("reported") == "RUNNING":
                    return
                if info.get("state") == "BROKEN":
                    raise EdgeinferError(f"{component} is BROKEN: {self.log_tail(component)}")
            time.sleep(0.1)
        raise EdgeinferError(
            f"{component} did not report RUNNING in {START_TIMEOUT_S:g} s: {self.log_tail(component)}"
        )

    def log_tail(self, component: str, chars: int = 600) -> str:
        text = procfs.read(self.work / "logs" / f"{component}.log") or procfs.read(self.out) or ""
        return " | ".join(text[-chars:].strip().splitlines()[-5:])

    def check(self) -> None:
        """EdgeinferError once the nucleus or the broker is gone: the figures would mean nothing."""
        if self.proc is not None and self.proc.poll() is not None:
            raise EdgeinferError(
                f"`edgeinfer sim up` exited ({self.proc.returncode}): {self.log_tail('sim')}"
            )
        if self.broker_pid:
            state = procfs.stat(self.broker_pid)
            if state is None or state.state in ("Z", "X"):
                raise EdgeinferError("mosquitto exited during the run")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        """The nucleus stops its components; whatever is left of its session is killed."""
        from edgeinfer_bench.sim import sim_down

        proc, self.proc = self.proc, None
        if proc is not None:
            sim_down(proc)
        self.broker.stop()
