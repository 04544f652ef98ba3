"""Recipe loading, platform selection, semver resolution, variables and bad recipes (no processes)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from edgeinfer.sim import RecipeError, Simulator
from edgeinfer.sim.recipe import (
    VarContext,
    apply_reset,
    deep_merge,
    interpolate,
    load_recipe_file,
    load_recipes,
    platform_matches,
    resolve,
    satisfies,
)
from tests.helpers.sim import Device

HOST = {"os": "linux", "architecture": "amd64"}


@pytest.mark.parametrize(
    ("version", "requirement", "ok"),
    [
        ("1.2.3", ">=1.0.0 <2.0.0", True),
        ("2.0.0", ">=1.0.0 <2.0.0", False),
        ("1.9.0", "^1.2.0", True),
        ("2.0.0", "^1.2.0", False),
        ("0.2.5", "^0.2.1", True),
        ("0.3.0", "^0.2.1", False),
        ("1.2.9", "~1.2.3", True),
        ("1.3.0", "~1.2.3", False),
        ("1.4.0", "1.x", True),
        ("3.0.0", "1.x || 3.0.0", True),
        ("1.0.0", "1.0.0", True),
        ("1.0.1", "=1.0.0", False),
        ("5.1.0", "*", True),
        ("1.5.0", "1.0.0 - 1.5.0", True),
        ("1.5.1", "1.0.0 - 1.5.0", False),
        ("1.0.0-rc.1", ">=1.0.0", False),
    ],
)
def test_semver_requirements(version: str, requirement: str, ok: bool) -> None:
    assert satisfies(version, requirement) is ok


def test_platform_matching() -> None:
    assert platform_matches(None, HOST)
    assert platform_matches({"os": "*"}, HOST)
    assert platform_matches({"os": "linux", "architecture": "/amd64|aarch64/"}, HOST)
    assert not platform_matches({"os": "windows"}, HOST)
    assert not platform_matches({"os": "linux", "architecture": "/arm.*/"}, HOST)
    assert not platform_matches({"os": "linux", "gpu": "nvidia"}, HOST)


def test_keys_case_insensitive_first_matching_manifest_and_json(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(
        json.dumps(
            {
                "recipeFormatVersion": "2020-01-25",
                "componentName": "com.example.Ci",
                "componentversion": "1.0.0",
                "manifests": [
                    {"platform": {"os": "windows"}, "lifecycle": {"run": "win"}},
                    {"Platform": {"os": "linux", "architecture": "/.*/"}, "Lifecycle": {"RUN": "first"}},
                    {"Platform": {"os": "*"}, "Lifecycle": {"Run": "second"}},
                ],
            }
        )
    )
    recipe = load_recipe_file(path, HOST)
    assert recipe.name == "com.example.Ci"
    assert recipe.lifecycle == {"run": "first"}
    assert recipe.manifest_field == "Manifests[1]"


def test_variables_resolve_own_and_direct_dependency_values(device: Device) -> None:
    device.add("com.example.Base", config={"port": 8080, "nested": {"list": [1, 2]}})
    device.add("com.example.Mid", deps={"com.example.Base": {"VersionRequirement": "^1.0.0"}})
    device.add("com.example.Top", deps={"com.example.Mid": {}})
    index = load_recipes(device.recipes)
    base, mid, top = (index[n]["1.0.0"] for n in ("com.example.Base", "com.example.Mid", "com.example.Top"))
    ctx = VarContext(
        paths={
            "com.example.Base": {"artifacts:path": "/a/base", "work:path": "/w/base"},
            "com.example.Mid": {"artifacts:path": "/a/mid", "artifacts:decompressedPath": "/u/mid"},
        },
        configs={"com.example.Base": base.default_config, "com.example.Mid": {"x": True}},
        kernel_root="/root",
        thing_name="thing-1",
    )
    text = (
        "{artifacts:path} {artifacts:decompressedPath} {configuration:/x} {kernel:rootPath} "
        "{iot:thingName} {com.example.Base:artifacts:path} {com.example.Base:configuration:/port} "
        "{com.example.Base:configuration:/nested} {com.example.Base:work:path} "
        "${HOME:-x} {configuration:/none}"
    )
    assert interpolate(text, mid, ctx, "Run") == (
        '/a/mid /u/mid true /root thing-1 /a/base 8080 {"list": [1, 2]} /w/base '
        "${HOME:-x} {configuration:/none}"
    )
    with pytest.raises(RecipeError, match=r"Top-1.0.0.yaml: Run: unknown variable .*not a direct dependency"):
        interpolate("{com.example.Base:artifacts:path}", top, ctx, "Run")
    with pytest.raises(RecipeError, match=r"unknown variable \{artifacts:nope\}"):
        interpolate("{artifacts:nope}", mid, ctx, "Run")


def test_resolution_orders_dependencies_and_picks_the_highest_matching_version(device: Device) -> None:
    device.add("com.example.Lib", "1.0.0")
    device.add("com.example.Lib", "1.4.0")
    device.add("com.example.Lib", "2.0.0")
    device.add("com.example.App", deps={"com.example.Lib": {"VersionRequirement": ">=1.0.0 <2.0.0"}})
    order = resolve(load_recipes(device.recipes), ["com.example.App"])
    assert [(r.name, r.version) for r in order] == [
        ("com.example.Lib", "1.4.0"),
        ("com.example.App", "1.0.0"),
    ]


def test_deployment_merge_and_reset() -> None:
    defaults = {"a": 1, "b": {"c": 2, "d": 3}}
    merged = deep_merge(defaults, {"b": {"c": 20, "e": 5}, "f": [1]})
    assert merged == {"a": 1, "b": {"c": 20, "d": 3, "e": 5}, "f": [1]}
    assert apply_reset(merged, defaults, ["/b/c", "/f"]) == {"a": 1, "b": {"c": 2, "d": 3, "e": 5}}
    assert apply_reset(merged, defaults, [""]) == defaults


def _one_line_error(device: Device, match: str) -> str:
    sim = Simulator(device.recipes, device.artifacts, work_dir=device.recipes.parent / "root")
    with pytest.raises(RecipeError) as info:
        sim.start()
    message = str(info.value)
    assert "\n" not in message
    assert re.search(match, message), message
    # nothing started: no broker, no lifecycle, no socket
    assert sim._owned_broker is None
    assert sim._thread is None
    assert not (device.recipes.parent / "root" / "logs").exists()
    return message


def test_bad_recipe_missing_required_field(device: Device) -> None:
    device.add("com.example.Ok", lifecycle={"Run": "sleep 100"})
    (device.recipes / "broken.yaml").write_text(
        "RecipeFormatVersion: '2020-01-25'\nComponentName: com.example.X\n"
    )
    _one_line_error(device, r"broken\.yaml: ComponentVersion: required field is missing")


def test_bad_recipe_unknown_dependency(device: Device) -> None:
    device.add("com.example.App", deps={"com.example.Ghost": {"VersionRequirement": "1.0.0"}})
    _one_line_error(
        device, r"App-1\.0\.0\.yaml: ComponentDependencies\.com\.example\.Ghost: unknown dependency"
    )


def test_bad_recipe_cycle(device: Device) -> None:
    device.add("com.example.A", deps={"com.example.B": {}})
    device.add("com.example.B", deps={"com.example.C": {}})
    device.add("com.example.C", deps={"com.example.A": {}})
    msg = _one_line_error(device, r"ComponentDependencies\.com\.example\.\w: dependency cycle")
    assert "com.example.A -> com.example.B -> com.example.C -> com.example.A" in msg


def test_bad_recipe_unsatisfiable_version(device: Device) -> None:
    device.add("com.example.Lib", "1.2.0")
    device.add("com.example.App", deps={"com.example.Lib": {"VersionRequirement": ">=2.0.0"}})
    _one_line_error(
        device,
        r"App-1\.0\.0\.yaml: ComponentDependencies\.com\.example\.Lib\.VersionRequirement: "
        r"no version of com\.example\.Lib satisfies '>=2\.0\.0' \(available: 1\.2\.0\)",
    )


def test_bad_recipe_unknown_variable(device: Device) -> None:
    device.add("com.example.App", lifecycle={"Run": "echo {work:pth}"})
    _one_line_error(
        device, r"App-1\.0\.0\.yaml: Manifests\[0\]\.Lifecycle\.Run: unknown variable \{work:pth\}"
    )


def test_bad_recipe_missing_artifact_and_unparseable_file(device: Device) -> None:
    device.add("com.example.App", artifacts=[{"URI": "s3://bucket/app.py"}])
    _one_line_error(device, r"App-1\.0\.0\.yaml: Manifests\[0\]\.Artifacts\[0\]\.URI: artifact not found")
    (device.recipes / "App-1.0.0.yaml").write_text("ComponentName: [unclosed\n")
    _one_line_error(device, r"App-1\.0\.0\.yaml: not a readable recipe")
