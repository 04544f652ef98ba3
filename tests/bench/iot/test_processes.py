"""edgeinfer_bench.iot.processes: the runtime found among a process's descendants, on real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from edgeinfer_bench.iot.processes import descendants, find_runtime

pytestmark = pytest.mark.skipif(
    not Path(f"/proc/self/task/{os.getpid()}/children").exists(), reason="needs /proc/<pid>/task/*/children"
)

SLEEP = "import time; time.sleep(60)"


def test_descendants_reach_a_grandchild() -> None:
    spawn = f"import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', {SLEEP!r}])"
    spawn += "; print(p.pid, flush=True)"
    child = subprocess.Popen([sys.executable, "-c", f"{spawn}; {SLEEP}"], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    grandchild = int(child.stdout.readline())
    try:
        assert {child.pid, grandchild} <= set(descendants(os.getpid()))
        assert list(descendants(grandchild)) == []
    finally:
        os.kill(grandchild, signal.SIGKILL)
        child.kill()
        child.wait()


def test_find_runtime_takes_the_runtime_not_a_shell_naming_it() -> None:
    # `python - edgeinfer.runtime` reads its script from stdin: argv names the runtime as
    # `python -m edgeinfer.runtime` does, without starting one; `python -c` with the name is a script
    shell = subprocess.Popen([sys.executable, "-c", SLEEP, "edgeinfer.runtime"])
    runtime = subprocess.Popen([sys.executable, "-", "edgeinfer.runtime"], stdin=subprocess.PIPE)
    try:
        assert runtime.stdin is not None
        runtime.stdin.write(SLEEP.encode())
        runtime.stdin.close()
        assert find_runtime(os.getpid()) == runtime.pid
        assert find_runtime(shell.pid) is None
    finally:
        for proc in (shell, runtime):
            proc.kill()
            proc.wait()
