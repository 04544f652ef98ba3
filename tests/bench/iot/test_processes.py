"""edgeinfer_bench.iot.processes: the runtime found among a process's descendants, on real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from edgeinfer import procfs
from edgeinfer_bench.iot.processes import descendants, find_runtime
from tests.helpers.wait import eventually

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
    # Under a parent of their own, so that another test's runtime is not among the descendants.
    # `python - edgeinfer.runtime` reads its script from stdin: its argv names the runtime as
    # `python -m edgeinfer.runtime` does, without starting one; `python -c SCRIPT edgeinfer.runtime`
    # is a script naming it, as the runtime's run script does before it `exec`s.
    spawn = (
        "import subprocess, sys; "
        f"s = subprocess.Popen([sys.executable, '-c', {SLEEP!r}, 'edgeinfer.runtime']); "
        "r = subprocess.Popen([sys.executable, '-', 'edgeinfer.runtime'], stdin=subprocess.PIPE); "
        f"r.stdin.write({SLEEP!r}.encode()); r.stdin.close(); "
        "print(s.pid, r.pid, flush=True)"
    )
    parent = subprocess.Popen([sys.executable, "-c", f"{spawn}; {SLEEP}"], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    shell, runtime = (int(pid) for pid in parent.stdout.readline().split())
    try:
        # Popen returns once the child's exec has closed its descriptors, before the kernel has set
        # its new argv: /proc/<pid>/cmdline reads empty for a moment (seen on a loaded machine).
        eventually(
            lambda: all(b"edgeinfer.runtime" in (procfs.cmdline(pid) or []) for pid in (shell, runtime)),
            what="both children's exec",
        )
        assert find_runtime(parent.pid) == runtime
        assert find_runtime(shell) is None
    finally:
        for pid in (shell, runtime):
            os.kill(pid, signal.SIGKILL)
        parent.kill()
        parent.wait()
