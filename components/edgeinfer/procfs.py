"""Reading Linux's /proc: CPU times, memory, and a process's state, CPU time and command line.

The one place that knows /proc's formats, for telemetry's system figures, the runtime's start time,
the simulator's process groups and the benchmarks' CPU accounting. Every reader takes the /proc root
as a parameter so that parsing is tested on a fake tree; a file that is gone (the process exited)
reads as None, never as an error. Field positions are those of proc(5).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "PROC",
    "SATURATING_INT8",
    "ProcStat",
    "children",
    "clock_ticks",
    "cmdline",
    "core_times",
    "cpu_flags",
    "cpu_times",
    "find_pids",
    "int8_saturating_host",
    "parse_core_times",
    "parse_cpu_times",
    "parse_meminfo",
    "parse_stat",
    "parse_stat_cpu",
    "parse_status_rss",
    "pids",
    "process_age_s",
    "process_cpu_s",
    "process_rss_bytes",
    "process_ticks",
    "read",
    "saturating_int8_here",
    "stat",
    "uptime_s",
]

PROC = Path("/proc")


def read(path: Path) -> str | None:
    """A /proc file's text, or None when it cannot be read (gone, no permission, not Linux)."""
    try:
        return path.read_text("utf-8", errors="replace")
    except OSError:
        return None


def clock_ticks() -> int:
    """Clock ticks per second, the unit of /proc's CPU times."""
    return os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


# ----------------------------------------------------------------------------------- /proc/stat


def _busy_total(fields: list[str]) -> tuple[int, int]:
    ticks = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal (guest is in user)
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    return sum(ticks) - idle, sum(ticks)


def parse_cpu_times(stat_text: str) -> tuple[int, int] | None:
    """(busy, total) ticks of all cores together, from the `cpu` line of /proc/stat."""
    for line in stat_text.splitlines():
        if line.startswith("cpu "):
            return _busy_total(line.split()[1:])
    return None


def parse_core_times(stat_text: str) -> dict[int, tuple[int, int]]:
    """Per core: (busy, total) ticks, from the `cpuN` lines of /proc/stat."""
    out: dict[int, tuple[int, int]] = {}
    for line in stat_text.splitlines():
        name, *fields = line.split() or [""]
        if name.startswith("cpu") and name[3:].isdigit():
            out[int(name[3:])] = _busy_total(fields)
    return out


def cpu_times(proc: Path = PROC) -> tuple[int, int] | None:
    text = read(proc / "stat")
    return parse_cpu_times(text) if text else None


def core_times(proc: Path = PROC) -> dict[int, tuple[int, int]]:
    text = read(proc / "stat")
    return parse_core_times(text) if text else {}


def uptime_s(proc: Path = PROC) -> float | None:
    """Seconds since boot (/proc/uptime)."""
    text = read(proc / "uptime")
    try:
        return float(text.split()[0]) if text else None
    except (ValueError, IndexError):
        return None


def parse_meminfo(text: str) -> dict[str, int]:
    """Fields of /proc/meminfo in bytes."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            scale = 1024 if len(parts) > 1 and parts[1] == "kB" else 1
            out[name.strip()] = int(parts[0]) * scale
    return out


# ------------------------------------------------------------------------------- /proc/cpuinfo

# The host class on which ONNX Runtime's U8S8 integer kernels saturate: x86-64 without VNNI adds
# pairs of u8 × s8 products in int16 (pmaddubsw). VNNI (AVX-512 or AVX) and ARM's dot products are exact.
SATURATING_INT8 = "x86_64-without-vnni"
_VNNI = frozenset({"avx512_vnni", "avx_vnni"})


def cpu_flags(cpuinfo_text: str) -> frozenset[str]:
    """The first core's feature flags (`flags` on x86, `Features` on ARM) of /proc/cpuinfo."""
    for line in cpuinfo_text.splitlines():
        name, sep, rest = line.partition(":")
        if sep and name.strip() in ("flags", "Features"):
            return frozenset(rest.split())
    return frozenset()


def int8_saturating_host(machine: str, cpuinfo_text: str | None) -> str | None:
    """SATURATING_INT8 when this host's U8S8 kernels saturate (x86-64 whose /proc/cpuinfo shows no
    VNNI, or cannot be read), else None. `machine` is platform.machine()."""
    if machine.lower() not in ("x86_64", "amd64", "x64"):
        return None
    return None if cpu_flags(cpuinfo_text or "") & _VNNI else SATURATING_INT8


def saturating_int8_here(proc: Path = PROC) -> str | None:
    """int8_saturating_host for the machine this runs on."""
    return int8_saturating_host(platform.machine(), read(proc / "cpuinfo"))


# ------------------------------------------------------------------------------------ processes


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/<pid>/stat that edgeinfer reads."""

    state: str  # R, S, D, Z (zombie), X (dead), …
    pgid: int
    cpu_ticks: int  # utime + stime, every thread of the process
    start_ticks: int | None  # when it started, in ticks after boot


def parse_stat(text: str) -> ProcStat | None:
    """/proc/<pid>/stat; the command in parentheses may itself hold spaces and parentheses."""
    _, paren, rest = text.rpartition(")")
    fields = rest.split()
    if not paren or len(fields) < 13:
        return None
    try:
        start = int(fields[19]) if len(fields) > 19 else None
        return ProcStat(fields[0], int(fields[2]), int(fields[11]) + int(fields[12]), start)
    except ValueError:
        return None


def parse_stat_cpu(text: str) -> int | None:
    """utime + stime ticks of /proc/<pid>/stat."""
    parsed = parse_stat(text)
    return parsed.cpu_ticks if parsed else None


def parse_status_rss(text: str) -> int | None:
    """VmRSS of /proc/<pid>/status in bytes (None for kernel threads and zombies)."""
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return None


def stat(pid: int | str, proc: Path = PROC) -> ProcStat | None:
    """A process's stat (`pid` may be `self`, or `PID/task/TID` for one thread); None once it is gone."""
    text = read(proc / str(pid) / "stat")
    return parse_stat(text) if text else None


def process_age_s(pid: int | str = "self", proc: Path = PROC) -> float | None:
    """Seconds since a process started (None where /proc cannot tell)."""
    parsed, up = stat(pid, proc), uptime_s(proc)
    if parsed is None or parsed.start_ticks is None or up is None:
        return None
    return max(0.0, up - parsed.start_ticks / clock_ticks())


def process_ticks(pid: int | str, proc: Path = PROC) -> int:
    """User + system CPU ticks of a process so far, all its threads (0 when it is gone)."""
    parsed = stat(pid, proc)
    return parsed.cpu_ticks if parsed else 0


def process_cpu_s(pid: int | str, proc: Path = PROC) -> float:
    """User + system CPU seconds of a process so far (0 when it is gone)."""
    return process_ticks(pid, proc) / clock_ticks()


def process_rss_bytes(pid: int | str, proc: Path = PROC) -> int | None:
    """Resident memory (VmRSS) of a process in bytes; None once it is gone, or for a kernel thread."""
    text = read(proc / str(pid) / "status")
    return parse_status_rss(text) if text else None


def cmdline(pid: int | str, proc: Path = PROC) -> list[bytes] | None:
    """A process's argv (empty for kernel threads), or None once it is gone."""
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    return raw.rstrip(b"\0").split(b"\0") if raw else []


def children(pid: int | str, proc: Path = PROC) -> list[int]:
    """The direct children of a process, those of every one of its threads (a child belongs to the
    thread that forked it); empty once the process is gone or where the kernel has no `children`."""
    try:
        tasks = sorted(os.listdir(proc / str(pid) / "task"))
    except OSError:
        return []
    found: list[int] = []
    for tid in tasks:
        for word in (read(proc / str(pid) / "task" / tid / "children") or "").split():
            if word.isdigit():
                found.append(int(word))
    return found


def pids(proc: Path = PROC) -> Iterator[int]:
    """The processes there are now (none where /proc cannot be listed)."""
    try:
        names = os.listdir(proc)
    except OSError:
        return
    for name in names:
        if name.isdigit():
            yield int(name)


def find_pids(wanted: Callable[[list[bytes]], bool], proc: Path = PROC) -> list[int]:
    """The processes whose argv `wanted` accepts, in pid order."""
    found = []
    for pid in sorted(pids(proc)):
        argv = cmdline(pid, proc)
        if argv and wanted(argv):
            found.append(pid)
    return found
