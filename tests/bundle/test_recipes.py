"""Every recipe and every gdk-config.json of the project against the GDK's schemas, plus the rules
the schemas cannot say: no account id, bucket or secret; the default user; the shared venv path; the
version written once (edgeinfer.__version__, stamped where a recipe names it)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from edgeinfer import __version__
from edgeinfer.bundle.build import lower_keys, schema
from edgeinfer.greengrass.recipe import VERSION_PLACEHOLDER, read_recipe, satisfies
from tests.helpers import PROJECT

ROOT = PROJECT
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
GDK_CONFIGS = sorted(
    [ROOT / "gdk-config.json", *(ROOT / "components" / "edgeinfer").glob("*/gdk-config.json")]
)
INSTALLER_WORK = "{kernel:rootPath}/work/com.edgeinfer.RuntimeInstaller"
# Components that only install something: their run step exits at once.
INSTALL_ONLY = {"com.edgeinfer.ModelStore", "com.edgeinfer.RuntimeInstaller"}
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
EXPECTED = {
    "com.edgeinfer.InferenceRuntime",
    "com.edgeinfer.ModelStore",
    "com.edgeinfer.RuntimeInstaller",
    "com.edgeinfer.Telemetry",
}


def load(path: Path) -> dict[str, Any]:
    """A recipe as every reader sees it: the version placeholder stamped."""
    return read_recipe(path)


def recipes() -> dict[str, dict[str, Any]]:
    return {load(p)["ComponentName"]: load(p) for p in RECIPES}


def walk_strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (str(k), *walk_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in walk_strings(v)]
    return [str(value)]


def test_all_four_components_have_a_recipe() -> None:
    assert set(recipes()) >= EXPECTED


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_is_valid_against_the_gdk_schema(path: Path) -> None:
    recipe = load(path)
    validator = jsonschema.Draft7Validator(schema("greengrass-recipe"))
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(lower_keys(recipe))]
    assert errors == []
    assert path.stem == recipe["ComponentName"]
    assert recipe["ComponentVersion"] == __version__


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_the_version_is_written_once(path: Path) -> None:
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert raw["ComponentVersion"] == VERSION_PLACEHOLDER
    assert __version__ not in path.read_text(encoding="utf-8")


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_has_no_account_bucket_or_secret(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert not re.search(r"(?<![\d.])\d{12}(?![\d.])", text), "looks like an AWS account id"
    assert not re.search(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b", text), "looks like an access key"
    assert not re.search(r"(?i)secret_?access|password|BEGIN [A-Z ]*PRIVATE KEY", text)
    assert "arn:aws" not in text
    for uri in re.findall(r"s3://\S+", text):
        assert uri.startswith("s3://BUCKET_NAME/COMPONENT_NAME/COMPONENT_VERSION/"), uri


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_runs_as_the_default_user(path: Path) -> None:
    low = lower_keys(load(path))
    for manifest in low.get("manifests", []):
        for step in (manifest.get("lifecycle") or {}).values():
            if isinstance(step, dict):
                assert str(step.get("requiresprivilege", "false")).lower() == "false"


def test_dependencies_are_in_the_bundle_and_their_versions_satisfy_the_ranges() -> None:
    by_name = recipes()
    for name, recipe in by_name.items():
        for dep, spec in (recipe.get("ComponentDependencies") or {}).items():
            if dep.startswith("com.edgeinfer."):
                assert dep in by_name, f"{name} depends on {dep}, which has no recipe"
                requirement = spec["VersionRequirement"]
                assert satisfies(by_name[dep]["ComponentVersion"], requirement), (name, dep, requirement)


def test_code_components_wait_for_the_installer_venv_then_run_it() -> None:
    for name, recipe in recipes().items():
        if name in INSTALL_ONLY:
            continue  # their run step only finishes (test below)
        lifecycles = [m.get("Lifecycle") or {} for m in recipe.get("Manifests", [])]
        runs = [str(lc["run"]["Script"]) for lc in lifecycles if isinstance(lc, dict) and "run" in lc]
        for run in runs:
            lines = run.splitlines()
            assert lines[0] == f"installer='{INSTALLER_WORK}'", name
            assert 'until [ -f "$installer/platform.json" ]' in run, name
            assert lines[-1].startswith('exec "$installer/venv/bin/python" -m edgeinfer.'), name
        if runs:
            deps = recipe.get("ComponentDependencies") or {}
            # SOFT: neither nucleus starts it first, and lite never starts a HARD dependant of an
            # install-only component (systemd BindsTo=), hence the wait above.
            assert deps["com.edgeinfer.RuntimeInstaller"]["DependencyType"] == "SOFT", name


@pytest.mark.parametrize("name", sorted(INSTALL_ONLY))
def test_install_only_components_have_a_run_step_that_finishes_at_once(name: str) -> None:
    # Nucleus lite waits for every component's run unit (RUNNING or FINISHED) and reports the
    # deployment FAILED after its timeout where there is none.
    import subprocess
    import time

    (manifest,) = recipes()[name]["Manifests"]
    lifecycle = manifest["Lifecycle"]
    assert set(lifecycle) == {"install", "run"}, name  # lower case: lite reads no other spelling
    run = lifecycle["run"]
    assert isinstance(run, str)
    assert "{" not in run  # nothing to resolve, on either nucleus
    start = time.monotonic()
    # With systemd's default PATH, as lite runs it.
    done = subprocess.run(["sh", "-c", run], env={"PATH": SYSTEMD_PATH}, timeout=10, check=False)
    assert done.returncode == 0
    assert time.monotonic() - start < 5


def test_the_runtime_finds_the_model_store_through_its_pointer() -> None:
    by_name = recipes()
    (store,) = [m["Lifecycle"]["install"] for m in by_name["com.edgeinfer.ModelStore"]["Manifests"]]
    assert "'{artifacts:path}' > '{work:path}/artifacts-path.tmp'" in store
    (run,) = [m["Lifecycle"]["run"]["Script"] for m in by_name["com.edgeinfer.InferenceRuntime"]["Manifests"]]
    assert "store='{kernel:rootPath}/work/com.edgeinfer.ModelStore/artifacts-path'" in run
    assert '--model-dir "$(cat "$store")"' in run
    assert ":artifacts:path}" not in run.replace("{artifacts:path}", "")


def test_model_store_lists_the_files_the_model_build_writes() -> None:
    from edgeinfer.model import build

    recipe = recipes()["com.edgeinfer.ModelStore"]
    names = {a["URI"].rsplit("/", 1)[-1] for m in recipe["Manifests"] for a in m.get("Artifacts", [])}
    assert names == {
        "manifest.json",
        build.LABELS_FILE,
        build.FP32_FILE,
        build.INT8_CPU_FILE,
        build.INT8_TRT_FILE,
    }


def test_installer_recipe_reads_its_configuration_from_the_nucleus() -> None:
    from edgeinfer.installer.plan import InstallerConfig

    recipe = recipes()["com.edgeinfer.RuntimeInstaller"]
    defaults = recipe["ComponentConfiguration"]["DefaultConfiguration"]
    script = recipe["Manifests"][0]["Lifecycle"]["install"]["Script"]
    config = InstallerConfig.from_mapping(defaults)  # every key is known to the installer
    assert config == InstallerConfig()  # and the recipe's defaults are the installer's own
    # GetConfiguration, not interpolation: lite escapes what it interpolates onto a command line
    assert re.findall(r"\{configuration:[^}]*\}", script) == ["{configuration:/python}"]
    assert " -o " not in script
    assert f"edgeinfer-{__version__}-py3-none-any.whl" in script


def _merge(into: dict[str, Any], merge: dict[str, Any]) -> dict[str, Any]:
    """A deployment's configuration MERGE as both nuclei apply it: maps merge key by key, anything
    else (a list, a scalar) replaces what was there."""
    out = dict(into)
    for key, value in merge.items():
        here = out.get(key)
        out[key] = _merge(here, value) if isinstance(here, dict) and isinstance(value, dict) else value
    return out


@pytest.mark.parametrize(
    "merge",
    [
        {},
        {"pins": {"3.10": {"numpy": ""}, "3.14": {"onnxruntime": "1.32.0"}}},
        {"pins": {"3.12": {"onnxruntime": "1.26.0", "awscrt": None}}},
        {"allowList": [{"name": "only-cpu", "architectures": ["x86_64"], "accelerators": ["cpu"]}]},
        {"allowList": [], "pins": {"3.11": {}}},
    ],
)
def test_pins_and_allow_list_ship_with_the_installer_and_merge_as_before(merge: dict[str, Any]) -> None:
    from edgeinfer.installer.plan import DEFAULT_ALLOW_LIST, DEFAULT_PINS, InstallerConfig

    defaults = recipes()["com.edgeinfer.RuntimeInstaller"]["ComponentConfiguration"]["DefaultConfiguration"]
    # Not in the recipe (nucleus lite's sub-object budget): the installer's own defaults.
    assert "pins" not in defaults
    assert "allowList" not in defaults
    # A deployment's merge reads as it did when the recipe carried them.
    carried = {**defaults, "allowList": DEFAULT_ALLOW_LIST, "pins": DEFAULT_PINS}
    before = InstallerConfig.from_mapping(_merge(carried, merge))
    assert InstallerConfig.from_mapping(_merge(defaults, merge)) == before


# What a recipe may still grow by under nucleus lite's budget before `edgeinfer build` refuses it.
SUBOBJECT_HEADROOM = 25


def test_every_built_recipe_fits_nucleus_lite_with_room_to_grow(artifacts: Path, tmp_path: Path) -> None:
    import zipfile

    from edgeinfer.bundle.build import build_bundle
    from edgeinfer.greengrass.nuclei import profile, subobject_count

    house = tmp_path / "house"
    house.mkdir()
    with zipfile.ZipFile(house / "tiny-1.0-py3-none-any.whl", "w") as zf:
        zf.writestr("tiny-1.0.dist-info/RECORD", "")
    # As the bundle ships (digests, and the wheelhouse artifact where it has one).
    bundle = build_bundle(ROOT, artifacts_dir=artifacts, out_dir=tmp_path / "gb", wheelhouse=house)
    limit = profile("lite").recipe_subobject_limit
    assert limit is not None
    counts = {
        path.name: subobject_count(yaml.safe_load(path.read_text("utf-8")))
        for path in sorted(bundle.recipes_dir.glob("*.yaml"))
    }
    assert len(counts) == len(EXPECTED)
    assert {name: n for name, n in counts.items() if n > limit - SUBOBJECT_HEADROOM} == {}, counts


def test_every_gdk_config_is_valid_and_matches_its_recipe() -> None:
    assert len(GDK_CONFIGS) == 4
    validator = jsonschema.Draft7Validator(schema("gdk-config"))
    by_name = recipes()
    seen = set()
    for path in GDK_CONFIGS:
        config = json.loads(path.read_text(encoding="utf-8"))
        errors = [e.message for e in validator.iter_errors(config)]
        assert errors == [], path
        ((name, component),) = config["component"].items()
        seen.add(name)
        assert name in by_name, path
        assert component["version"] == by_name[name]["ComponentVersion"]
        assert component["build"]["custom_build_command"] == ["edgeinfer", "build", "--gdk", name]
        # GDK reads recipe.yaml next to gdk-config.json: a link to the one in recipes/
        recipe_file = path.parent / "recipe.yaml"
        assert load(recipe_file)["ComponentName"] == name
        assert recipe_file.resolve() == (ROOT / "recipes" / f"{name}.yaml").resolve()
        bucket = component["publish"]["bucket"]
        assert not re.search(r"\d{12}", bucket)
    assert seen == EXPECTED


def test_the_schema_check_is_not_vacuous() -> None:
    bad = {
        "RecipeFormatVersion": "2020-01-25",
        "ComponentName": "not a name",
        "ComponentVersion": "0.1.0",
        "Manifests": [{"Lifecycle": {"Run": {"RequiresPrivilege": "maybe", "Script": "x"}}}],
        "ComponentSecrets": {},
    }
    validator = jsonschema.Draft7Validator(schema("greengrass-recipe"))
    assert len(list(validator.iter_errors(lower_keys(bad)))) >= 2
    gdk = {"component": {"a": {"author": "x", "version": "latest", "build": {"build_system": "custom"}}}}
    assert list(jsonschema.Draft7Validator(schema("gdk-config")).iter_errors(gdk))
