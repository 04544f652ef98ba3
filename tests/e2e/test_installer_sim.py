"""The installer's Install step on the simulated core, straight from `edgeinfer build` output: the
recipe as shipped, the installer run by the system Python from the shipped wheel."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from edgeinfer.bundle.build import build_bundle
from edgeinfer.sim.pytest_plugin import SimulatorFactory
from tests.helpers import PROJECT

pytestmark = pytest.mark.e2e

ROOT = PROJECT
INSTALLER = "com.edgeinfer.RuntimeInstaller"


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    folder = tmp_path / "artifacts"
    build_bundle(ROOT, artifacts_dir=folder, out_dir=tmp_path / "greengrass-build", only=[INSTALLER])
    return folder


def test_install_links_the_existing_venv_and_writes_platform_json(
    simulator: SimulatorFactory, artifacts: Path
) -> None:
    sim = simulator(
        ROOT / "recipes",
        artifacts,
        components=[INSTALLER],
        config_merge={INSTALLER: {"existingVenv": sys.prefix}},
    )
    assert sim.wait_for_state(INSTALLER, "FINISHED", timeout=120) == "FINISHED"
    work = sim.root / "work" / INSTALLER
    assert (work / "venv").resolve() == Path(sys.prefix).resolve()
    report = json.loads((work / "platform.json").read_text())
    assert report["mode"] == "existing"
    assert "CPUExecutionProvider" in report["providers"]["loaded"]
    # what dependants run: {kernel:rootPath}/work/com.edgeinfer.RuntimeInstaller/venv/bin/python
    assert (work / "venv" / "bin" / "python").exists()


def test_unsupported_platform_errors_the_install_and_changes_nothing(
    simulator: SimulatorFactory, artifacts: Path
) -> None:
    refuse_all = [{"name": "risc-v-only", "architectures": ["riscv64"], "accelerators": ["cpu"]}]
    sim = simulator(
        ROOT / "recipes",
        artifacts,
        components=[INSTALLER],
        config_merge={INSTALLER: {"existingVenv": sys.prefix, "allowList": refuse_all}},
        max_errors=1,
    )
    assert sim.wait_for_state(INSTALLER, ("ERRORED", "BROKEN"), timeout=120) in ("ERRORED", "BROKEN")
    assert "unsupported platform" in sim.logs(INSTALLER)
    work = sim.root / "work" / INSTALLER
    assert not (work / "venv").exists()
    assert not (work / "platform.json").exists()
