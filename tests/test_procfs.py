"""/proc reading: on a fake tree (formats, odd command names, processes that are gone) and on the real one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgeinfer import procfs


def write_process(
    proc: Path, pid: int, argv: list[str], *, state: str = "S", pgid: int = 1, cpu: int = 0
) -> None:
    folder = proc / str(pid)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    fields = [state, "1", str(pgid)] + ["0"] * 8 + [str(cpu), "0"] + ["0"] * 6 + ["250"] + ["0"] * 30
    (folder / "stat").write_text(f"{pid} (py (x) thon) " + " ".join(fields))


def test_cpu_lines(tmp_path: Path) -> None:
    (tmp_path / "stat").write_text(
        "cpu  10 0 5 80 5 0 0 0 0 0\ncpu0 4 0 1 40 5 0 0 0\ncpu1 6 0 4 40 0 0 0 0\nintr 1\n"
    )
    assert procfs.cpu_times(tmp_path) == (15, 100)
    assert procfs.core_times(tmp_path) == {0: (5, 50), 1: (10, 50)}
    assert procfs.cpu_times(tmp_path / "none") is None
    assert procfs.core_times(tmp_path / "none") == {}


def test_meminfo_and_status() -> None:
    assert procfs.parse_meminfo("MemTotal:  8 kB\nHugePages_Total: 3\nbad line\n") == {
        "MemTotal": 8192,
        "HugePages_Total": 3,
    }
    assert procfs.parse_status_rss("Name:\tx\nVmRSS:\t  12 kB\n") == 12 * 1024
    assert procfs.parse_status_rss("Name:\tkthreadd\n") is None


def test_stat_with_odd_command_names(tmp_path: Path) -> None:
    write_process(tmp_path, 7, ["python", "-m", "edgeinfer.runtime"], state="Z", pgid=42, cpu=9)
    assert procfs.stat(7, tmp_path) == procfs.ProcStat("Z", 42, 9, 250)
    assert procfs.parse_stat("garbage") is None
    assert procfs.stat(8, tmp_path) is None  # gone
    assert procfs.process_cpu_s(8, tmp_path) == 0.0
    (tmp_path / "7" / "status").write_text("Name:\tpython\nVmRSS:\t  12 kB\n")
    assert procfs.process_rss_bytes(7, tmp_path) == 12 * 1024
    assert procfs.process_rss_bytes(8, tmp_path) is None


def test_find_pids(tmp_path: Path) -> None:
    write_process(tmp_path, 10, ["python", "-m", "edgeinfer.runtime"])
    write_process(tmp_path, 11, ["sshd"])
    (tmp_path / "self").mkdir()
    assert procfs.find_pids(lambda argv: b"edgeinfer.runtime" in argv, tmp_path) == [10]
    assert procfs.cmdline(10, tmp_path) == [b"python", b"-m", b"edgeinfer.runtime"]
    assert procfs.cmdline(12, tmp_path) is None
    assert list(procfs.pids(tmp_path / "none")) == []


def test_children_of_every_thread(tmp_path: Path) -> None:
    for tid, text in (("20", "21 22 \n"), ("23", "24\n"), ("25", "")):
        (tmp_path / "20" / "task" / tid).mkdir(parents=True)
        (tmp_path / "20" / "task" / tid / "children").write_text(text)
    (tmp_path / "20" / "task" / "26").mkdir()  # a thread that ended between the listing and the read
    assert procfs.children(20, tmp_path) == [21, 22, 24]
    assert procfs.children(30, tmp_path) == []  # gone


@pytest.mark.skipif(
    not Path(f"/proc/self/task/{os.getpid()}/children").exists(), reason="needs /proc/<pid>/task/*/children"
)
def test_real_children_of_this_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert child.pid in procfs.children(os.getpid())
        assert child.pid in procfs.children("self")
        assert procfs.children(child.pid) == []
    finally:
        child.kill()
        child.wait()
    assert child.pid not in procfs.children(os.getpid())


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs Linux /proc")
def test_real_proc_knows_this_process() -> None:
    sum(i * i for i in range(200_000))
    assert procfs.process_cpu_s(os.getpid()) > 0
    assert os.getpid() in procfs.pids()
    age = procfs.process_age_s()
    assert age is not None
    assert age >= 0
    own = procfs.stat("self")
    assert own is not None
    assert own.pgid == os.getpgid(0)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_real_rss_of_this_process_grows_with_what_it_holds() -> None:
    before = procfs.process_rss_bytes(os.getpid())
    assert before is not None
    held = b"\1" * (64 * 2**20)  # written, so resident
    after = procfs.process_rss_bytes("self")
    assert after is not None
    assert after - before >= 32 * 2**20
    del held


# Recorded /proc/cpuinfo lines (one core each): the AMD EPYC this project builds on (AVX2, no VNNI),
# an Ice Lake Xeon (AVX-512 VNNI), an Alder Lake (AVX-VNNI only) and a Raspberry Pi 4 (aarch64).
EPYC_AVX2 = (
    "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B12\n"
    "flags\t\t: fpu vme sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2 sha_ni\n\n"
    "processor\t: 1\nflags\t\t: fpu sse2 avx2\n"
)
XEON_VNNI = "processor\t: 0\nflags\t\t: sse4_2 avx2 avx512f avx512bw avx512vl avx512_vnni\n"
ALDER_LAKE = "processor\t: 0\nflags\t\t: sse4_2 avx2 avx_vnni\n"
PI4 = "processor\t: 0\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm crc32 cpuid\nCPU part\t: 0xd08\n"


def test_cpu_flags_and_the_int8_host_class() -> None:
    assert procfs.cpu_flags(XEON_VNNI) >= {"avx2", "avx512_vnni"}
    assert "asimd" in procfs.cpu_flags(PI4)
    assert procfs.cpu_flags("") == frozenset()
    assert procfs.int8_saturating_host("x86_64", EPYC_AVX2) == procfs.SATURATING_INT8
    assert procfs.int8_saturating_host("x86_64", XEON_VNNI) is None
    assert procfs.int8_saturating_host("AMD64", ALDER_LAKE) is None
    assert procfs.int8_saturating_host("aarch64", PI4) is None  # ARM's int8 dot products are exact
    assert procfs.int8_saturating_host("x86_64", None) == procfs.SATURATING_INT8  # unreadable: the worst
