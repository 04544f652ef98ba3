"""System figures for each telemetry window: CPU, memory, and GPU through NVML when there is one.

Linux only (Greengrass cores are Linux here), read straight from `/proc` so the device needs no extra
package: system CPU busy % between samples (`/proc/stat`), load average, memory total/available
(`/proc/meminfo`), and the RSS and CPU % of the device's own processes — every process whose command
line contains one of `match` (default `edgeinfer.`: the runtime, the telemetry component, the
installer's tools). The `/proc` root is a parameter so the parsing is tested on a fake tree.

GPU: NVIDIA's NVML through the optional `nvidia-ml-py` package (module `pynvml`, in the `gpu` extra).
Absent module, absent driver or no device → no `gpus` key; NVML is never required. (Jetson boards have
no NVML; their GPU figures would need tegrastats and are not reported.)
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from edgeinfer import procfs
from edgeinfer.procfs import parse_meminfo, parse_stat_cpu, parse_status_rss

__all__ = ["Nvml", "SystemSampler"]

log = logging.getLogger(__name__)

_MB = 1024 * 1024


class Nvml:
    """GPU utilisation and memory per device through NVML; `available` is False without it."""

    def __init__(self, module: ModuleType | Any | None = None) -> None:
        self._nv: Any = None
        self.error: str | None = None
        try:
            nv: Any = module
            if nv is None:
                import pynvml

                nv = pynvml
            nv.nvmlInit()
            self.count = int(nv.nvmlDeviceGetCount())
            self._nv = nv
        except Exception as exc:  # ImportError, NVMLError (no driver, no device), anything else
            self.error = f"{type(exc).__name__}: {exc}"
            log.debug("NVML unavailable: %s", self.error)
            self.count = 0

    @property
    def available(self) -> bool:
        return self._nv is not None and self.count > 0

    def sample(self) -> list[dict[str, Any]]:
        if not self.available:
            return []
        nv = self._nv
        out: list[dict[str, Any]] = []
        for index in range(self.count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                name = nv.nvmlDeviceGetName(handle)
                util = nv.nvmlDeviceGetUtilizationRates(handle)
                mem = nv.nvmlDeviceGetMemoryInfo(handle)
            except Exception as exc:  # a device that fell off the bus: report the others
                log.warning("NVML failed on GPU %d: %s", index, exc)
                continue
            out.append(
                {
                    "index": index,
                    "name": name.decode() if isinstance(name, bytes) else str(name),
                    "util_percent": float(util.gpu),
                    "mem_used_mb": round(mem.used / _MB, 1),
                    "mem_total_mb": round(mem.total / _MB, 1),
                }
            )
        return out

    def close(self) -> None:
        if self._nv is not None:
            with contextlib.suppress(Exception):
                self._nv.nvmlShutdown()
            self._nv = None


class SystemSampler:
    """Callable that returns the window's `system` figures; CPU % are averages since the last call."""

    def __init__(
        self,
        *,
        proc: Path | str = "/proc",
        match: Sequence[str] = ("edgeinfer.",),
        gpu: bool = True,
        nvml: Nvml | None = None,
        clock: Callable[[], float] = time.monotonic,
        clk_tck: int | None = None,
        pid: int | None = None,
    ) -> None:
        self.proc = Path(proc)
        self.match = tuple(m for m in match if m)
        self._clock = clock
        self._tck = clk_tck or procfs.clock_ticks()
        self._pid = pid if pid is not None else os.getpid()
        self.nvml = nvml if nvml is not None else (Nvml() if gpu else None)
        self._cpu_prev = self._cpu_times()
        self._proc_prev: dict[int, int] = {}
        self._proc_prev_at = clock()
        self._ncpu = os.cpu_count() or 1
        self._device_processes()  # prime the per-process CPU counters

    def _cpu_times(self) -> tuple[int, int] | None:
        return procfs.cpu_times(self.proc)

    def _device_processes(self) -> tuple[int, int, float | None]:
        """(count, rss bytes, cpu % of one core summed) over the device's processes."""
        now = self._clock()
        elapsed = now - self._proc_prev_at
        count = rss = 0
        jiffies: dict[int, int] = {}
        try:
            entries = [p for p in self.proc.iterdir() if p.name.isdigit()]
        except OSError:
            entries = []
        for entry in entries:
            pid = int(entry.name)
            if pid != self._pid:
                cmd = procfs.read(entry / "cmdline")
                if not cmd or not any(m in cmd for m in self.match):
                    continue
            status = procfs.read(entry / "status")
            stat = procfs.read(entry / "stat")
            if status is None or stat is None:
                continue  # exited meanwhile
            count += 1
            rss += parse_status_rss(status) or 0
            cpu = parse_stat_cpu(stat)
            if cpu is not None:
                jiffies[pid] = cpu
        cpu_pct: float | None = None
        if elapsed > 0 and self._proc_prev:
            used = sum(j - self._proc_prev.get(pid, j) for pid, j in jiffies.items())
            cpu_pct = 100.0 * used / self._tck / elapsed
        self._proc_prev = jiffies
        self._proc_prev_at = now
        return count, rss, cpu_pct

    def __call__(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        cpu = self._cpu_times()
        if cpu is not None and self._cpu_prev is not None:
            busy = cpu[0] - self._cpu_prev[0]
            total = cpu[1] - self._cpu_prev[1]
            if total > 0:
                out["cpu_percent"] = round(100.0 * busy / total, 1)
        self._cpu_prev = cpu
        out["cpu_count"] = self._ncpu
        load = procfs.read(self.proc / "loadavg")
        if load:
            with contextlib.suppress(ValueError, IndexError):
                out["load_1m"] = float(load.split()[0])
        mem_text = procfs.read(self.proc / "meminfo")
        if mem_text:
            mem = parse_meminfo(mem_text)
            if "MemTotal" in mem:
                out["mem_total_mb"] = round(mem["MemTotal"] / _MB, 1)
            if "MemAvailable" in mem:
                out["mem_available_mb"] = round(mem["MemAvailable"] / _MB, 1)
        count, rss, proc_cpu = self._device_processes()
        if count:
            out["processes"] = count
            out["rss_mb"] = round(rss / _MB, 1)
        if proc_cpu is not None:
            out["process_cpu_percent"] = round(proc_cpu, 1)
        if self.nvml is not None and self.nvml.available:
            gpus = self.nvml.sample()
            if gpus:
                out["gpus"] = gpus
                out["gpu_util_percent"] = max(g["util_percent"] for g in gpus)
                out["gpu_mem_used_mb"] = round(sum(g["mem_used_mb"] for g in gpus), 1)
        return out

    def close(self) -> None:
        if self.nvml is not None:
            self.nvml.close()
