"""`edgeinfer build --check`: per recipe, what the classic nucleus and nucleus lite would refuse,
with the file, the line and the reason; every `edgeinfer build` runs it first."""

from __future__ import annotations

import json
import textwrap
import zipfile
from pathlib import Path

import pytest
import yaml

from edgeinfer import cli
from edgeinfer.bundle.build import BuildError, build_bundle, check_recipes
from tests.helpers import PROJECT

# Each defect the project's recipes once had, one per line marked "# <- name".
BAD = textwrap.dedent(
    """\
    RecipeFormatVersion: "2020-01-25"
    ComponentName: com.example.Bad
    ComponentVersion: "1.0.0"
    ComponentDependencies:
      com.example.Setup:  # <- hard
        VersionRequirement: ">=1.0.0"
        DependencyType: HARD
    ComponentConfiguration:
      DefaultConfiguration:
        allowList: [{name: a}]
    Manifests:
      - Platform:  # <- runtime
          os: linux
        Lifecycle:
          Run: >-  # <- case
            python3 -m app --list '{configuration:/allowList}'
            --model {com.example.Setup:artifacts:path}
      - Platform:
          os: darwin
          runtime: "*"
        Lifecycle:
          run: app --other {com.example.Other:work:path}  # <- not-a-dependency
      - Platform:
          os: linux
          runtime: "*"
        Lifecycle:
          run: python3 -m app --list '{configuration:/allowList}'  # <- list
          install: cp {com.example.Setup:artifacts:path}/x .  # <- cross
    """
)
SETUP = textwrap.dedent(
    """\
    RecipeFormatVersion: "2020-01-25"
    ComponentName: com.example.Setup
    ComponentVersion: "1.0.0"
    Manifests:
      - Platform:
          os: linux
          runtime: "*"
        Lifecycle: {}  # <- artifacts-only
    """
)


def line_of(text: str, mark: str) -> int:
    (line,) = [i for i, t in enumerate(text.splitlines(), 1) if t.endswith(f"# <- {mark}")]
    return line


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "recipes").mkdir()
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "recipes" / "com.example.Bad.yaml").write_text(BAD)
    (tmp_path / "recipes" / "com.example.Setup.yaml").write_text(SETUP)
    return tmp_path


def test_the_projects_recipes_pass_for_both_nuclei() -> None:
    checks = check_recipes(PROJECT)
    assert {c.name for c in checks} == {
        "com.edgeinfer.InferenceRuntime",
        "com.edgeinfer.ModelStore",
        "com.edgeinfer.RuntimeInstaller",
        "com.edgeinfer.Telemetry",
    }
    assert [str(f) for c in checks for fs in c.findings.values() for f in fs] == []


def test_each_defect_is_found_at_its_line(project: Path) -> None:
    checks = {c.name: c for c in check_recipes(project)}
    bad, setup = checks["com.example.Bad"], checks["com.example.Setup"]
    assert setup.findings["classic"] == []
    lite = [(f.line, f.reason) for f in bad.findings["lite"]]

    def at(mark: str, words: str) -> None:
        assert any(line == line_of(BAD, mark) and words in reason for line, reason in lite), (mark, lite)

    at("runtime", 'Platform has no runtime "*"')
    at("case", "lower case only: Run is not seen")
    at("list", "{configuration:/allowList} is a list")
    at("cross", "variables of another component are not supported")
    at("hard", "HARD dependency on com.example.Setup, which has no run or startup step")
    ((finding,),) = [setup.findings["lite"]]
    assert finding.line == line_of(SETUP, "artifacts-only")
    assert "never reaches FINISHED" in finding.reason
    assert all(f.file == project / "recipes" / "com.example.Bad.yaml" for f in bad.findings["lite"])
    (classic,) = bad.findings["classic"]  # classic reads any case, lists as JSON, its dependencies
    assert classic.line == line_of(BAD, "not-a-dependency")
    assert classic.reason == "{com.example.Other:work:path}: com.example.Other is not a direct dependency"


def test_cli_check_says_per_recipe_and_exits_1(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(project)
    assert cli.main(["build", "--check"]) == 1
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0] == "recipes/com.example.Bad.yaml: com.example.Bad: classic refuses, lite refuses"
    assert f"  recipes/com.example.Bad.yaml:{line_of(BAD, 'runtime')}: Manifests[0].Platform: skipped" in out
    assert "recipes/com.example.Setup.yaml: com.example.Setup: classic ok, lite refuses" in lines
    assert err.strip().endswith("a nucleus would refuse these recipes")
    assert cli.main(["build", "--check", "--nucleus", "classic"]) == 1
    assert "lite" not in capsys.readouterr().out
    (project / "recipes" / "com.example.Bad.yaml").unlink()
    assert cli.main(["build", "--check", "--nucleus", "classic"]) == 0


def test_the_project_check_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["build", "--check", "--project", str(PROJECT)]) == 0
    assert capsys.readouterr().out.count("classic ok, lite ok") == 4


def test_a_build_refuses_what_a_nucleus_would_refuse(project: Path, tmp_path: Path) -> None:
    with pytest.raises(BuildError, match=r"com\.example\.Bad\.yaml:\d+: .*findings in all") as err:
        build_bundle(project, artifacts_dir=tmp_path / "a", out_dir=tmp_path / "gb")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "gb").exists()


SHELL = textwrap.dedent(
    """\
    RecipeFormatVersion: "2020-01-25"
    ComponentName: com.example.Shell
    ComponentVersion: "1.0.0"
    Manifests:
      - Platform:
          os: linux
          runtime: "*"
        Lifecycle:
          setenv:  # <- setenv
            A: "1"
          run:
            script: echo hello  # <- script
          install: echo "${HOME}" '{kernel:rootPath}' '{kernel:home}'  # <- braces
    """
)


def test_what_lite_reads_only_as_spelled_and_braces_that_are_no_variable(tmp_path: Path) -> None:
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "com.example.Shell.yaml").write_text(SHELL)
    ((check,),) = [check_recipes(tmp_path)]
    assert check.findings["classic"] == []
    lite = {(f.line, f.reason) for f in check.findings["lite"]}
    assert (line_of(SHELL, "setenv"), "read only as Setenv: setenv is not seen") in lite
    assert (line_of(SHELL, "script"), "read only as Script: script is not seen") in lite
    braces = sorted(r for line, r in lite if line == line_of(SHELL, "braces"))
    assert len(braces) == 2
    assert braces[0].startswith(
        "{HOME}: every { of a script starts a recipe variable"
    )  # not {kernel:rootPath}
    assert braces[1].startswith("{kernel:home}: ")


def test_check_says_when_a_gdk_config_would_publish_another_version(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (project / "recipes" / "com.example.Bad.yaml").unlink()
    (project / "components" / "setup").mkdir(parents=True)
    config = {"component": {"com.example.Setup": {"version": "0.9.0"}}}
    (project / "components" / "setup" / "gdk-config.json").write_text(json.dumps(config))
    monkeypatch.chdir(project)
    assert cli.main(["build", "--check", "--nucleus", "classic"]) == 1
    assert capsys.readouterr().out.splitlines()[0] == (
        "components/setup/gdk-config.json: com.example.Setup 0.9.0, the bundle builds 1.0.0: the GDK "
        "would publish 0.9.0 (a plain 'edgeinfer build' writes 1.0.0 there)"
    )


def _big(items: int) -> str:
    many = "".join(f"          - item{i}\n" for i in range(items))
    return (
        textwrap.dedent(
            """\
        RecipeFormatVersion: "2020-01-25"
        ComponentName: com.example.Big
        ComponentVersion: "1.0.0"
        ComponentConfiguration:
          DefaultConfiguration:
            many:  # <- many
        """
        )
        + many
        + textwrap.dedent(
            """\
        Manifests:
          - Platform: {os: linux, runtime: "*"}
            Lifecycle:
              run: "true"
            Artifacts:
              - URI: s3://BUCKET_NAME/COMPONENT_NAME/COMPONENT_VERSION/data.bin
        """
        )
    )


def test_a_recipe_over_lites_budget_fails_check_and_build_with_its_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from edgeinfer.greengrass.nuclei import subobject_count, with_digests

    (tmp_path / "recipes").mkdir()
    (tmp_path / "pyproject.toml").write_text("")
    # 251 as written: the Digest and Algorithm a build adds to its one artifact take it to 255, in
    # budget; one more item takes the built recipe over, though the source still fits.
    recipe = tmp_path / "recipes" / "com.example.Big.yaml"
    for items, built in ((221, 255), (222, 256)):
        recipe.write_text(_big(items))
        raw = yaml.safe_load(recipe.read_text())
        assert subobject_count(with_digests(raw)) == built
    assert subobject_count(raw) <= 255
    monkeypatch.chdir(tmp_path)
    assert cli.main(["build", "--check"]) == 1
    out = capsys.readouterr().out
    assert "com.example.Big: classic ok, lite refuses" in out
    assert (
        "recipes/com.example.Big.yaml:4: ComponentConfiguration: the recipe counts 256 sub-objects as built"
        in out
    )
    assert "over the 255 " in out
    with pytest.raises(BuildError, match=r"Big\.yaml:4: ComponentConfiguration: the recipe counts 256 "):
        build_bundle(tmp_path, artifacts_dir=tmp_path / "a", out_dir=tmp_path / "gb")
    assert not (tmp_path / "gb").exists()


def test_a_build_refuses_a_recipe_the_artifacts_it_adds_take_over_the_budget(tmp_path: Path) -> None:
    from edgeinfer.bundle.build import RUNTIME_INSTALLER

    (tmp_path / "recipes").mkdir()
    (tmp_path / "pyproject.toml").write_text("")
    # 255 as built: --check passes it; the wheelhouse.zip artifact a build adds to the installer
    # does not fit any more.
    text = _big(221).replace("com.example.Big", RUNTIME_INSTALLER)
    (tmp_path / "recipes" / f"{RUNTIME_INSTALLER}.yaml").write_text(text)
    folder = tmp_path / "a" / RUNTIME_INSTALLER / "1.0.0"
    folder.mkdir(parents=True)
    (folder / "data.bin").write_bytes(b"x")
    assert [f for c in check_recipes(tmp_path) for fs in c.findings.values() for f in fs] == []
    build_bundle(tmp_path, artifacts_dir=tmp_path / "a", out_dir=tmp_path / "gb")  # fits as built
    house = tmp_path / "house"
    house.mkdir()
    with zipfile.ZipFile(house / "tiny-1.0-py3-none-any.whl", "w") as zf:
        zf.writestr("tiny-1.0.dist-info/RECORD", "")
    with pytest.raises(BuildError, match=r"counts 268 sub-objects as built.*\(the recipe as built, with its"):
        build_bundle(tmp_path, artifacts_dir=tmp_path / "a", out_dir=tmp_path / "gb2", wheelhouse=house)
    assert not (tmp_path / "gb2").exists()
