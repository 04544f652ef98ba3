"""Lifecycles as real processes: restarts and BROKEN, dependency order, variables, ZIP, stop, timeouts."""

from __future__ import annotations

import io
import os
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from edgeinfer.sim import SimError, Simulator
from tests.helpers.sim import BOTH_NUCLEI, PYTHON, Device
from tests.helpers.wait import wait_for


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is not alive for our purpose
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.mark.classic_only(
    "nucleus lite has no recover step (its steps: setenv, bootstrap, install, startup, run)"
)
def test_crashing_component_is_restarted_then_broken(
    simulator: Callable[..., Simulator], device: Device
) -> None:
    device.add(
        "com.example.Crash",
        lifecycle={
            "Install": "echo installed >> {work:path}/installs",
            "Run": "echo starting; exit 3",
            "Recover": "echo recovering",
        },
    )
    sim = simulator(device.recipes, device.artifacts, restart_delay=0.05, max_errors=3)
    assert sim.wait_for_state("com.example.Crash", "BROKEN", timeout=30) == "BROKEN"
    history = sim.history("com.example.Crash")
    assert history.count("ERRORED") == 3
    assert history.count("RUNNING") == 3
    assert history[-1] == "BROKEN"
    log = sim.logs("com.example.Crash")
    lines = log.splitlines()
    assert lines.count("starting") == 3
    assert lines.count("recovering") == 3
    assert "Run exited with 3" in log
    # Install runs again at every start
    installs = (sim.root / "work" / "com.example.Crash" / "installs").read_text().splitlines()
    assert installs == ["installed"] * 3


def test_waiting_on_a_component_that_goes_broken_fails_with_its_log_tail(
    simulator: Callable[..., Simulator], device: Device
) -> None:
    device.add("com.example.Crash", lifecycle={"install": "echo bad config; exit 3", "run": "sleep 60"})
    sim = simulator(device.recipes, device.artifacts, restart_delay=0.05, max_errors=1)
    # both waits end when the component is BROKEN, long before their (generous) timeouts
    with pytest.raises(SimError, match=r"(?s)com\.example\.Crash is BROKEN, not RUNNING.*bad config"):
        sim.wait_for_state("com.example.Crash", "RUNNING", timeout=600)
    with pytest.raises(
        SimError, match=r"(?s)com\.example\.Crash \(BROKEN\) did not report RUNNING.*bad config"
    ):
        sim.wait_for_report("com.example.Crash", "RUNNING", timeout=600)


@pytest.mark.classic_only(
    "nucleus lite fails a step naming another component's variables and never starts a HARD dependant"
    " of an install-only component (test_nucleus_lite.py)"
)
def test_dependency_chain_starts_in_order_with_variables_resolved_across_it(
    simulator: Callable[..., Simulator], device: Device, tmp_path: Path
) -> None:
    order = tmp_path / "order.txt"
    device.add(
        "com.example.Base",
        config={"port": 8080},
        files={"base.txt": "base artifact\n"},
        lifecycle={
            "Install": f"echo Base >> {order}; echo made-by-base > {{work:path}}/made.txt",
            "Run": f"{PYTHON} -c 'import time; time.sleep(60)'",
        },
    )
    device.add(
        "com.example.Mid",
        deps={"com.example.Base": {"VersionRequirement": "^1.0.0", "DependencyType": "HARD"}},
        files={"mid.txt": "mid artifact\n"},
        lifecycle={
            "Install": (
                f"echo Mid >> {order}; "
                "cat {com.example.Base:work:path}/made.txt {com.example.Base:artifacts:path}/base.txt "
                "> {work:path}/seen.txt; "
                "echo port={com.example.Base:configuration:/port} >> {work:path}/seen.txt"
            ),
        },
    )
    device.add(
        "com.example.Top",
        deps={"com.example.Mid": {"VersionRequirement": ">=1.0.0 <2.0.0"}},
        config={"who": "top"},
        lifecycle={
            "Setenv": {"GREETING": "hello {configuration:/who}"},
            "Run": {
                "Script": f"echo Top >> {order}; cat {{com.example.Mid:work:path}}/seen.txt; "
                "cat {com.example.Mid:artifacts:path}/mid.txt; echo $GREETING $STEP on {iot:thingName}",
                "Setenv": {"STEP": "run-step"},
            },
        },
    )
    sim = simulator(
        device.recipes,
        device.artifacts,
        thing="chain-thing",
        config_merge={"com.example.Base": {"port": 9090}},
    )
    assert sim.wait_for_state("com.example.Top", "FINISHED", timeout=60) == "FINISHED"
    assert order.read_text().split() == ["Base", "Mid", "Top"]
    assert sim.state("com.example.Base") == "RUNNING"
    assert sim.state("com.example.Mid") == "FINISHED"
    top_log = sim.logs("com.example.Top")
    assert "made-by-base" in top_log
    assert "base artifact" in top_log
    assert "port=9090" in top_log  # deployment-time merge reached the dependant's variable
    assert "mid artifact" in top_log
    assert "hello top run-step on chain-thing" in top_log


@pytest.mark.classic_only(
    "a local deployment on nucleus lite leaves ZIP artifacts packed (test_lite_limits.py)"
)
def test_unarchive_zip(simulator: Callable[..., Simulator], device: Device) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        info = zipfile.ZipInfo("bin/tool.sh")
        info.external_attr = 0o755 << 16
        zf.writestr(info, '#!/bin/sh\necho tool says $(cat "$(dirname "$0")/../data/msg.txt")\n')
        zf.writestr("data/msg.txt", "unzipped ok")
    device.add(
        "com.example.Zip",
        files={"bundle.zip": buf.getvalue()},
        artifacts=[{"URI": "s3://bucket/com.example.Zip/bundle.zip", "Unarchive": "ZIP"}],
        lifecycle={
            "Install": {"Script": "echo install-should-be-skipped", "SkipIf": "onpath sh"},
            "Run": "{artifacts:decompressedPath}/bundle/bin/tool.sh",
        },
    )
    sim = simulator(device.recipes, device.artifacts)
    assert sim.wait_for_state("com.example.Zip", "FINISHED", timeout=30) == "FINISHED"
    assert "tool says unzipped ok" in sim.logs("com.example.Zip")
    assert "install-should-be-skipped" not in sim.logs("com.example.Zip").splitlines()
    assert "lifecycle.Install: skipped (onpath sh)" in sim.logs("com.example.Zip")


@pytest.mark.classic_only("nucleus lite has no shutdown step")
def test_stop_runs_shutdown_and_kills_the_whole_process_tree(
    simulator: Callable[..., Simulator], device: Device, tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    device.add(
        "com.example.Daemon",
        lifecycle={
            "Startup": f"sleep 300 & echo $! >> {pids}; exit 0",
            "Shutdown": "echo bye > {work:path}/shutdown",
        },
    )
    device.add(
        "com.example.Tree",
        lifecycle={"Run": f"sh -c 'sleep 300 & echo $! >> {pids}; wait'; echo never"},
    )
    sim = simulator(device.recipes, device.artifacts)
    sim.wait_for_state("com.example.Daemon", "RUNNING", timeout=30)
    sim.wait_for_state("com.example.Tree", "RUNNING", timeout=30)
    assert wait_for(lambda: pids.exists() and len(pids.read_text().split()) == 2)
    children = [int(p) for p in pids.read_text().split()]
    assert all(_alive(p) for p in children)
    sim.stop()
    assert not any(_alive(p) for p in children)
    assert (sim.root / "work" / "com.example.Daemon" / "shutdown").read_text().strip() == "bye"
    assert sim.states() == {"com.example.Daemon": "FINISHED", "com.example.Tree": "FINISHED"}


def test_install_timeout_errors_and_update_state_errored_restarts(
    simulator: Callable[..., Simulator], device: Device
) -> None:
    device.add(
        "com.example.Slow", lifecycle={"install": {"Script": "sleep 30", "Timeout": 0.5}, "run": "true"}
    )
    script = (
        "import os, time\n"
        "from awsiot.greengrasscoreipc.clientv2 import GreengrassCoreIPCClientV2\n"
        "marker = os.path.join(os.getcwd(), 'started')\n"
        "first = not os.path.exists(marker)\n"
        "open(marker, 'a').write('x')\n"
        "ipc = GreengrassCoreIPCClientV2()\n"
        "if first: ipc.update_state(state='ERRORED')\n"
        "time.sleep(60)\n"
    )
    device.add(
        "com.example.Reporter", files={"r.py": script}, lifecycle={"run": f"{PYTHON} {{artifacts:path}}/r.py"}
    )
    sim = simulator(device.recipes, device.artifacts, restart_delay=0.05, max_errors=1)
    assert sim.wait_for_state("com.example.Slow", "BROKEN", timeout=30) == "BROKEN"
    assert "timed out after 0.5s" in sim.logs("com.example.Slow")
    # with max_errors=1 the first reported error is final too
    assert sim.wait_for_state("com.example.Reporter", "BROKEN", timeout=30) == "BROKEN"
    assert "UpdateState ERRORED" in sim.logs("com.example.Reporter")


def test_update_state_errored_restarts_the_component(
    simulator: Callable[..., Simulator], device: Device
) -> None:
    script = (
        "import os, time\n"
        "from awsiot.greengrasscoreipc.clientv2 import GreengrassCoreIPCClientV2\n"
        "first = not os.path.exists('started')\n"
        "open('started', 'a').write('x')\n"
        "ipc = GreengrassCoreIPCClientV2()\n"
        "print('run', flush=True)\n"
        "if first: ipc.update_state(state='ERRORED')\n"
        "time.sleep(60)\n"
    )
    device.add(
        "com.example.Reporter", files={"r.py": script}, lifecycle={"run": f"{PYTHON} {{artifacts:path}}/r.py"}
    )
    sim = simulator(device.recipes, device.artifacts, restart_delay=0.05)
    sim.wait_for_state("com.example.Reporter", "ERRORED", timeout=30)
    sim.wait_for_state("com.example.Reporter", "RUNNING", timeout=30)
    history = sim.history("com.example.Reporter")
    assert history.count("ERRORED") == 1
    assert history[history.index("ERRORED") :] == ["ERRORED", "INSTALLED", "STARTING", "RUNNING"]
    assert wait_for(lambda: sim.logs("com.example.Reporter").splitlines().count("run") == 2)


@pytest.mark.classic_only("nucleus lite has no shutdown step")
def test_restarts_on_request_on_a_lifecycle_changing_deployment_and_with_a_hard_dependency(
    simulator: Callable[..., Simulator], device: Device, tmp_path: Path
) -> None:
    flag = tmp_path / "fail-once"
    device.add(
        "com.example.Dep",
        lifecycle={
            "Run": f"if [ -e {flag} ]; then rm {flag}; echo failing; exit 1; fi; echo dep up; sleep 60"
        },
    )
    device.add(
        "com.example.User",
        config={"mode": "a"},
        deps={"com.example.Dep": {"DependencyType": "HARD"}},
        lifecycle={"Run": "echo mode={configuration:/mode}; sleep 60", "Shutdown": "echo shutdown"},
    )
    sim = simulator(device.recipes, device.artifacts, restart_delay=0.05)
    sim.wait_for_state("com.example.User", "RUNNING", timeout=30)
    # RUNNING comes with the process, before its shell has echoed: a restart then would leave one line.
    assert wait_for(lambda: "mode=a" in sim.logs("com.example.User").splitlines())

    sim.restart("com.example.User")
    sim.wait_for_state("com.example.User", "RUNNING", timeout=30)
    assert wait_for(lambda: sim.logs("com.example.User").splitlines().count("mode=a") == 2)
    assert sim.logs("com.example.User").splitlines().count("shutdown") == 1

    sim.update_configuration("com.example.User", merge={"mode": "b"})  # changes the Run script: restart
    assert wait_for(lambda: "mode=b" in sim.logs("com.example.User").splitlines())
    sim.update_configuration("com.example.User", merge={"unused": 1})  # same lifecycle: no restart
    assert sim.logs("com.example.User").splitlines().count("shutdown") == 2

    flag.touch()
    sim.restart("com.example.Dep")  # Dep errs once on the way up: its HARD dependant restarts too
    assert wait_for(lambda: sim.logs("com.example.Dep").splitlines().count("dep up") == 2)
    sim.wait_for_state("com.example.User", "RUNNING", timeout=30)
    # restarted with its dependency (maybe twice: Dep is RUNNING for a moment before it errs)
    assert wait_for(lambda: sim.logs("com.example.User").splitlines().count("mode=b") >= 2)
    history = sim.history("com.example.User")
    assert history[-4:] == ["STOPPING", "INSTALLED", "STARTING", "RUNNING"]


def test_a_process_that_exits_without_stop_takes_its_components_along(tmp_path: Path) -> None:
    import subprocess
    import sys
    import textwrap

    device = Device(tmp_path / "device", platform=BOTH_NUCLEI)
    pid_file = tmp_path / "sleeper.pid"
    device.add("com.example.Sleeper", lifecycle={"Run": f"sleep 300 & echo $! > {pid_file}; wait"})
    script = textwrap.dedent(
        f"""
        import pathlib, time
        from edgeinfer.sim import Simulator
        core = {str(tmp_path / "core")!r}
        sim = Simulator({str(device.recipes)!r}, {str(device.artifacts)!r}, work_dir=core)
        sim.start()
        pid_file = pathlib.Path({str(pid_file)!r})
        # The shell creates the file before `echo` writes into it: wait for the pid itself.
        while not (pid_file.exists() and pid_file.read_text().strip()):
            time.sleep(0.05)
        raise SystemExit(3)  # no stop(): a script that failed
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 3, done.stderr
    pid = int(pid_file.read_text())
    gone = wait_for(lambda: not _alive(pid), timeout=10)
    if not gone:
        os.kill(pid, 9)
    assert gone, "the component's process outlived the simulator's process"
