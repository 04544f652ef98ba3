"""The installer on every Python it may meet: its import closure imports on 3.7+, an interpreter
older than 3.10 gets one line naming what to set or install (no traceback), and 3.10+ runs it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers import PROJECT
from tests.helpers.pythons import find_python

PLATFORMS = Path(__file__).parent / "platforms"
CLOSURE = ["component", "install", "plan", "probe", "preflight", "tiny_model"]


def run_on(minor: str, *args: str) -> subprocess.CompletedProcess[str]:
    python = find_python(minor)
    if python is None:
        pytest.skip(f"no Python {minor} on this machine (pyenv's versions or python{minor} on PATH)")
    return subprocess.run(
        [python, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PYTHONPATH": str(PROJECT / "components"), "PATH": "/usr/bin:/bin"},
    )


@pytest.mark.parametrize("minor", ["3.7", "3.8", "3.9", "3.10", "3.12", "3.13"])
def test_the_installer_imports_on_every_python_it_may_meet(minor: str) -> None:
    code = "; ".join(f"import edgeinfer.installer.{m}" for m in CLOSURE)
    proc = run_on(minor, "-c", code)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("minor", ["3.7", "3.8", "3.9"])
def test_an_old_python_gets_one_line_and_no_traceback(minor: str, tmp_path: Path) -> None:
    proc = run_on(minor, "-m", "edgeinfer.installer", "--work", str(tmp_path / "work"))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"edgeinfer.installer: error: Python {minor}.")
    assert "is too old: the edgeinfer venv needs Python 3.10 to 3.13" in lines[0]
    assert "set python: " in lines[0]
    assert not (tmp_path / "work").exists()


@pytest.mark.parametrize("minor", ["3.10", "3.12", "3.13"])
def test_a_supported_python_runs_the_installer(minor: str, tmp_path: Path) -> None:
    # A refused platform: everything up to the plan runs, nothing is installed.
    proc = run_on(
        minor,
        "-m",
        "edgeinfer.installer",
        "--work",
        str(tmp_path / "work"),
        "--probe-recording",
        str(PLATFORMS / "macos_arm64.json"),
        "-o",
        "allowRoot=true",
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("edgeinfer.installer: error: unsupported platform")
    assert "Traceback" not in proc.stderr
