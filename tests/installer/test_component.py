"""The installer's entry: its configuration from the nucleus (both profiles), overrides, one-line errors."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from edgeinfer.installer.component import RuntimeInstaller, build_parser, main
from edgeinfer.installer.plan import InstallerConfig
from edgeinfer.sim import Simulator
from tests.helpers import PROJECT

INSTALLER = "com.edgeinfer.RuntimeInstaller"


def args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["--work", "/nowhere", *argv])


@pytest.mark.parametrize("nucleus", ["classic", "lite"])
def test_configuration_comes_from_the_nucleus(
    nucleus: str, simulator: Callable[..., Simulator], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = yaml.safe_load((PROJECT / "recipes" / f"{INSTALLER}.yaml").read_text("utf-8"))
    recipe["Manifests"] = [{"Platform": {"os": "linux", "runtime": "*"}, "Lifecycle": {"run": "sleep 600"}}]
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "installer.yaml").write_text(yaml.safe_dump(recipe))
    sim = simulator(recipes, thing="installer-cfg", nucleus=nucleus)
    allow = [{"name": "only-x86", "architectures": ["x86_64"], "cudaMajors": ["13"]}]
    sim.update_configuration(INSTALLER, merge={"keepVenvs": 5, "allowList": allow})
    for key, value in sim.ipc_env(INSTALLER).items():
        monkeypatch.setenv(key, value)
    config = RuntimeInstaller(args()).configuration()
    assert config.keep_venvs == 5
    assert [(r.name, r.cuda_majors) for r in config.allow_list] == [("only-x86", ["13"])]
    assert config.pins == InstallerConfig().pins  # the rest: the recipe's defaults, read as the code's
    overridden = RuntimeInstaller(args("-o", "keepVenvs=1", "-o", "allowRoot=true")).configuration()
    assert (overridden.keep_venvs, overridden.allow_root) == (1, True)
    assert RuntimeInstaller(args("--from-nucleus", "no")).configuration().keep_venvs == 2


def test_outside_greengrass_the_command_line_is_the_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SVCUID", raising=False)
    config = RuntimeInstaller(args("-o", 'allowList=[{"name": "a"}]', "-o", "offline=true")).configuration()
    assert [r.name for r in config.allow_list] == ["a"]
    assert config.offline is True


def test_bad_options_are_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SVCUID", raising=False)
    assert main(["--work", "/nowhere", "-o", "keepVenvs=many"]) == 2
    assert capsys.readouterr().err == (
        "edgeinfer.installer: error: configuration of com.edgeinfer.RuntimeInstaller: "
        "keepVenvs: must be an integer, got 'many'\n"
    )
    assert main(["--work", "/nowhere", "-o", "keepVenvs"]) == 2
    assert "-o expects KEY=VALUE" in capsys.readouterr().err
