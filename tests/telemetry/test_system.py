"""System figures: /proc parsing on a fake tree, the real /proc, and NVML present, absent or failing."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from edgeinfer.procfs import parse_stat_cpu
from edgeinfer.telemetry.system import Nvml, SystemSampler
from tests.helpers.clock import FakeClock


def write_proc(root: Path, busy: int, idle: int, procs: dict[int, tuple[str, int, int]]) -> None:
    root.mkdir(exist_ok=True)
    (root / "stat").write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 1 2 3 4\nintr 5\n")
    (root / "meminfo").write_text("MemTotal:  8000000 kB\nMemFree: 1000 kB\nMemAvailable:  6000000 kB\n")
    (root / "loadavg").write_text("0.52 0.40 0.30 2/300 12345\n")
    for pid, (cmd, rss_kb, jiffies) in procs.items():
        d = root / str(pid)
        d.mkdir(exist_ok=True)
        (d / "cmdline").write_text(cmd.replace(" ", "\0"))
        (d / "status").write_text(f"Name:\tpython\nVmRSS:\t  {rss_kb} kB\nThreads: 4\n")
        fields = ["S"] + ["0"] * 10 + [str(jiffies), "0"] + ["0"] * 30
        (d / "stat").write_text(f"{pid} (py thon) (x) " + " ".join(fields))


def test_fake_proc_tree(tmp_path: Path, clock: FakeClock) -> None:
    proc = tmp_path / "proc"
    runtime = "/venv/bin/python -m edgeinfer.runtime"
    write_proc(proc, 100, 900, {10: (runtime, 200_000, 50), 11: ("/usr/sbin/sshd", 9000, 7)})
    sampler = SystemSampler(proc=proc, gpu=False, clock=clock, clk_tck=100, pid=999)
    clock.advance(2.0)
    write_proc(proc, 400, 1600, {10: (runtime, 300_000, 150), 11: ("/usr/sbin/sshd", 9000, 99)})
    figures = sampler()
    assert figures["cpu_percent"] == 30.0  # 300 busy of 1000 jiffies
    assert figures["load_1m"] == 0.52
    assert figures["mem_total_mb"] == pytest.approx(8_000_000 / 1024, abs=0.1)
    assert figures["mem_available_mb"] == pytest.approx(6_000_000 / 1024, abs=0.1)
    assert figures["processes"] == 1  # sshd does not match
    assert figures["rss_mb"] == pytest.approx(300_000 / 1024, abs=0.1)
    assert figures["process_cpu_percent"] == 50.0  # 100 jiffies at 100/s over 2 s
    assert "gpus" not in figures


def test_missing_proc_gives_what_it_can(tmp_path: Path) -> None:
    figures = SystemSampler(proc=tmp_path / "nothing", gpu=False, pid=999)()
    assert set(figures) == {"cpu_count"}


def test_stat_with_odd_command_names() -> None:
    assert parse_stat_cpu("1 (a) b) S " + " ".join(["0"] * 10 + ["7", "5"] + ["0"] * 5)) == 12
    assert parse_stat_cpu("garbage") is None


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs Linux /proc")
def test_real_proc_reports_this_process() -> None:
    sampler = SystemSampler(gpu=False)
    sum(i * i for i in range(200_000))
    figures = sampler()
    assert figures["processes"] >= 1
    assert figures["rss_mb"] > 1
    assert 0 <= figures["cpu_percent"] <= 100
    assert figures["mem_total_mb"] >= figures["mem_available_mb"] > 0


class FakeNvml:
    """The subset of pynvml's API that `Nvml` uses."""

    def __init__(self, count: int = 2, fail_on: int | None = None) -> None:
        self.count = count
        self.fail_on = fail_on
        self.shut = False

    def nvmlInit(self) -> None:  # noqa: N802 (NVML's names)
        pass

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        if index == self.fail_on:
            raise RuntimeError("GPU is lost")
        return index

    def nvmlDeviceGetName(self, handle: int) -> Any:  # noqa: N802
        return b"NVIDIA H200" if handle == 0 else "NVIDIA L4"

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:  # noqa: N802
        return SimpleNamespace(gpu=40 + handle * 20, memory=5)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:  # noqa: N802
        return SimpleNamespace(used=(handle + 1) * 1024**3, total=16 * 1024**3, free=0)

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.shut = True


def test_nvml_figures(tmp_path: Path) -> None:
    fake = FakeNvml()
    sampler = SystemSampler(proc=tmp_path, nvml=Nvml(fake), pid=999)
    figures = sampler()
    assert figures["gpus"] == [
        {
            "index": 0,
            "name": "NVIDIA H200",
            "util_percent": 40.0,
            "mem_used_mb": 1024.0,
            "mem_total_mb": 16384.0,
        },
        {
            "index": 1,
            "name": "NVIDIA L4",
            "util_percent": 60.0,
            "mem_used_mb": 2048.0,
            "mem_total_mb": 16384.0,
        },
    ]
    assert figures["gpu_util_percent"] == 60.0
    assert figures["gpu_mem_used_mb"] == 3072.0
    sampler.close()
    assert fake.shut


def test_one_failing_gpu_does_not_hide_the_others() -> None:
    assert [g["index"] for g in Nvml(FakeNvml(count=3, fail_on=1)).sample()] == [0, 2]


def test_nvml_absent(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    nvml = Nvml()
    assert not nvml.available
    assert nvml.error is not None
    assert "ModuleNotFoundError" in nvml.error
    assert nvml.sample() == []
    assert "gpus" not in SystemSampler(proc=tmp_path, nvml=nvml, pid=999)()


def test_nvml_without_driver() -> None:
    class NoDriver(FakeNvml):
        def nvmlInit(self) -> None:  # noqa: N802
            raise OSError("NVML Shared Library Not Found")

    nvml = Nvml(NoDriver())
    assert not nvml.available
    assert nvml.error == "OSError: NVML Shared Library Not Found"


def test_nvml_with_no_devices() -> None:
    assert not Nvml(FakeNvml(count=0)).available
