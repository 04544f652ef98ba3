"""`edgeinfer sim up --detach / status / logs / down` as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from edgeinfer.sim import MosquittoBroker
from tests.helpers.sim import Device


def edgeinfer(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edgeinfer", *args],
        check=False,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_up_status_logs_down(device: Device, tmp_path: Path, sim_broker: MosquittoBroker) -> None:
    device.add(
        "com.example.Echo",
        config={"word": "default"},
        lifecycle={"Run": "echo word={configuration:/word}; sleep 60"},
    )
    work = tmp_path / "core"
    common = ["--work-dir", str(work)]
    up = edgeinfer(
        "sim",
        "up",
        "--detach",
        "--recipes",
        str(device.recipes),
        "--artifacts",
        str(device.artifacts),
        "--thing",
        "cli-thing",
        "--config-merge",
        'com.example.Echo={"word": "merged"}',
        "--broker",
        f"{sim_broker.host}:{sim_broker.port}",
        *common,
        cwd=tmp_path,
    )
    try:
        assert up.returncode == 0, up.stderr
        assert "running" in up.stdout
        again = edgeinfer("sim", "up", "--recipes", str(device.recipes), *common, cwd=tmp_path)
        assert again.returncode == 2
        assert "already runs" in again.stderr
        status = edgeinfer("sim", "status", "--json", *common, cwd=tmp_path)
        assert status.returncode == 0, (status.stderr, (work / "status.json").read_text())
        data = json.loads(status.stdout)
        assert data["running"] is True
        assert data["thing"] == "cli-thing"
        assert data["components"]["com.example.Echo"]["state"] in ("STARTING", "RUNNING")
        for _ in range(100):
            logs = edgeinfer("sim", "logs", "com.example.Echo", *common, cwd=tmp_path)
            if "word=merged" in logs.stdout:
                break
        assert "word=merged" in logs.stdout
        assert edgeinfer("sim", "logs", "com.example.Nope", *common, cwd=tmp_path).returncode == 2
    finally:
        down = edgeinfer("sim", "down", *common, cwd=tmp_path)
    assert down.returncode == 0
    assert "stopped" in down.stdout
    status = edgeinfer("sim", "status", *common, cwd=tmp_path)
    assert status.returncode == 1
    assert "FINISHED" in status.stdout


def test_bad_recipe_is_one_line_and_exit_2(device: Device, tmp_path: Path) -> None:
    device.add("com.example.App", deps={"com.example.Ghost": {}})
    result = edgeinfer(
        "sim", "up", "--recipes", str(device.recipes), "--work-dir", str(tmp_path / "c"), cwd=tmp_path
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "ComponentDependencies.com.example.Ghost: unknown dependency" in lines[0]


def test_empty_recipe_folder_bad_thing_and_bad_work_dir_exit_2(tmp_path: Path) -> None:
    (tmp_path / "recipes").mkdir()
    work = str(tmp_path / "c")
    empty = edgeinfer("sim", "up", "--recipes", "recipes", "--work-dir", work, cwd=tmp_path)
    assert empty.returncode == 2
    assert (
        empty.stderr.strip()
        == "edgeinfer: error: recipes: no recipes in this folder (*.yaml, *.yml or *.json)"
    )
    thing = edgeinfer("sim", "up", "--thing", "a/b", "--work-dir", work, cwd=tmp_path)
    assert thing.returncode == 2
    assert "argument --thing: 'a/b' is not a thing name" in thing.stderr
    assert "Traceback" not in thing.stderr
    (tmp_path / "recipes" / "a.json").write_text("{}")
    (tmp_path / "a-file").write_text("")
    folder = edgeinfer("sim", "up", "--detach", "--work-dir", str(tmp_path / "a-file" / "c"), cwd=tmp_path)
    assert folder.returncode == 2
    assert folder.stderr.startswith("edgeinfer: error: cannot create the work folder")


REPORTS = (
    f'{sys.executable} -c "import time; time.sleep(0.5); '
    "from edgeinfer.transport.ipc import GreengrassIpcBus; "
    "GreengrassIpcBus.connect().update_state('RUNNING'); time.sleep(60)\""
)


def test_wait_returns_once_the_component_reported_running(
    device: Device, tmp_path: Path, sim_broker: MosquittoBroker
) -> None:
    device.add("com.example.Slow", lifecycle={"Run": REPORTS})
    common = ["--work-dir", str(tmp_path / "core"), "--broker", f"{sim_broker.host}:{sim_broker.port}"]
    up = edgeinfer(
        "sim", "up", "--detach", "--recipes", str(device.recipes), "--wait", "com.example.Slow", *common,
        cwd=tmp_path,
    )  # fmt: skip
    try:
        assert up.returncode == 0, up.stderr
        data = json.loads((tmp_path / "core" / "status.json").read_text())
        assert data["components"]["com.example.Slow"]["reported"] == "RUNNING"
    finally:
        edgeinfer("sim", "down", "--work-dir", str(tmp_path / "core"), cwd=tmp_path)


def test_a_wait_that_fails_leaves_no_core_behind(
    device: Device, tmp_path: Path, sim_broker: MosquittoBroker
) -> None:
    device.add("com.example.Quiet", lifecycle={"Run": "sleep 60"})  # never reports
    work = tmp_path / "core"
    common = ["--work-dir", str(work), "--broker", f"{sim_broker.host}:{sim_broker.port}"]
    base = ["sim", "up", "--detach", "--recipes", str(device.recipes), *common]
    unknown = edgeinfer(*base, "--wait", "com.example.Nope", cwd=tmp_path)
    assert unknown.returncode == 2
    assert unknown.stderr.strip().splitlines() == [
        "edgeinfer: error: --wait com.example.Nope: not a component of this core (com.example.Quiet)"
    ]
    # long enough for the core to come up on a loaded machine; the component never reports
    late = edgeinfer(*base, "--wait", "com.example.Quiet", "--wait-timeout", "6", cwd=tmp_path)
    assert late.returncode == 2
    assert "com.example.Quiet did not report RUNNING in 6 s" in late.stderr
    assert len(late.stderr.strip().splitlines()) == 1
    assert not (work / "status.json").exists()
    status = edgeinfer("sim", "status", "--work-dir", str(work), cwd=tmp_path)
    assert status.returncode == 2
    assert "no simulated core" in status.stderr
    assert edgeinfer("sim", "up", "--wait", "x", *common, cwd=tmp_path).returncode == 2  # needs --detach


def test_wait_accepts_a_component_that_finished_and_one_restarted_after_an_error(
    device: Device, tmp_path: Path, sim_broker: MosquittoBroker
) -> None:
    device.add("com.example.Setup", lifecycle={"Install": "true"})  # no Run: it ends FINISHED
    flaky = (  # fails its first run; the nucleus restarts it, and then it reports RUNNING
        "if [ -e first-run-done ]; then " + REPORTS + "; else touch first-run-done; exit 1; fi"
    )
    device.add("com.example.Flaky", lifecycle={"Run": flaky})
    work = tmp_path / "core"
    up = edgeinfer(
        "sim", "up", "--detach", "--recipes", str(device.recipes), "--work-dir", str(work),
        "--broker", f"{sim_broker.host}:{sim_broker.port}",
        "--wait", "com.example.Setup", "--wait", "com.example.Flaky", "--wait-timeout", "60",
        cwd=tmp_path,
    )  # fmt: skip
    try:
        assert up.returncode == 0, up.stderr
        data = json.loads((work / "status.json").read_text())
        assert data["components"]["com.example.Setup"]["state"] == "FINISHED"
        assert data["components"]["com.example.Flaky"]["reported"] == "RUNNING"
    finally:
        edgeinfer("sim", "down", "--work-dir", str(work), cwd=tmp_path)


def test_up_offers_both_nuclei_and_a_component_user(tmp_path: Path) -> None:
    shown = edgeinfer("sim", "up", "--help", cwd=tmp_path)
    assert shown.returncode == 0
    assert "--nucleus {classic,lite}" in shown.stdout
    assert "--component-user USER[:GROUP]" in shown.stdout
    bad = edgeinfer("sim", "up", "--nucleus", "java", cwd=tmp_path)
    assert bad.returncode == 2
    assert "invalid choice: 'java'" in bad.stderr
