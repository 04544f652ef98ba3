"""The recipe model: loading, platform selection, semver resolution, variables, order (no processes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgeinfer.greengrass.recipe import (
    DependencyCycleError,
    RecipeError,
    VarContext,
    apply_reset,
    deep_merge,
    dependency_order,
    interpolate,
    load_recipe_file,
    load_recipes,
    platform_matches,
    read_recipe,
    read_sources,
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


def test_variables_resolve_own_and_direct_dependency_values(tmp_path: Path) -> None:
    device = Device(tmp_path)
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


def test_resolution_orders_dependencies_and_picks_the_highest_matching_version(tmp_path: Path) -> None:
    device = Device(tmp_path)
    device.add("com.example.Lib", "1.0.0")
    device.add("com.example.Lib", "1.4.0")
    device.add("com.example.Lib", "2.0.0")
    device.add("com.example.App", deps={"com.example.Lib": {"VersionRequirement": ">=1.0.0 <2.0.0"}})
    order = resolve(load_recipes(device.recipes), ["com.example.App"])
    assert [(r.name, r.version) for r in order] == [
        ("com.example.Lib", "1.4.0"),
        ("com.example.App", "1.0.0"),
    ]


def test_a_dependency_on_what_the_nucleus_provides_resolves_without_a_recipe(tmp_path: Path) -> None:
    device = Device(tmp_path)
    provided = {"VersionRequirement": ">=2.0.0", "DependencyType": "SOFT"}
    device.add(
        "com.example.App",
        deps={
            "aws.greengrass.TokenExchangeService": provided,
            "aws.greengrass.Nucleus": {"VersionRequirement": ">=2.0.0"},
            "aws.greengrass.NucleusLite": provided,
        },
    )
    order = resolve(load_recipes(device.recipes), ["com.example.App"])
    assert [r.name for r in order] == ["com.example.App"]  # nothing of the nucleus's is deployed
    # A recipe in the folder for one of them is resolved as any other, its requirement checked.
    device.add("aws.greengrass.TokenExchangeService", "1.0.0")
    with pytest.raises(RecipeError, match=r"no version of aws\.greengrass\.TokenExchangeService satisfies"):
        resolve(load_recipes(device.recipes), ["com.example.App"])


def test_deployment_merge_and_reset() -> None:
    defaults = {"a": 1, "b": {"c": 2, "d": 3}}
    merged = deep_merge(defaults, {"b": {"c": 20, "e": 5}, "f": [1]})
    assert merged == {"a": 1, "b": {"c": 20, "d": 3, "e": 5}, "f": [1]}
    assert apply_reset(merged, defaults, ["/b/c", "/f"]) == {"a": 1, "b": {"c": 2, "d": 3, "e": 5}}
    assert apply_reset(merged, defaults, [""]) == defaults


def test_dependency_order_is_the_one_topological_sort() -> None:
    deps = {"c": ["a"], "b": [], "a": ["b", "elsewhere"]}
    assert dependency_order(deps) == ["b", "a", "c"]
    with pytest.raises(DependencyCycleError, match=r"dependency cycle: a -> b -> a") as err:
        dependency_order({"a": ["b"], "b": ["a"]})
    assert err.value.cycle == ["a", "b", "a"]


def test_sources_are_read_as_written_one_per_name(tmp_path: Path) -> None:
    device = Device(tmp_path)
    device.add("com.example.Lib")
    device.add("com.example.App", deps={"com.example.Lib": {}})
    sources = read_sources(device.recipes)
    assert sources["com.example.App"].dependencies == ("com.example.Lib",)
    assert sources["com.example.Lib"].raw["ComponentName"] == "com.example.Lib"
    device.add("com.example.Lib", "2.0.0")
    with pytest.raises(RecipeError, match=r"Lib-2\.0\.0\.yaml: com\.example\.Lib is also defined in"):
        read_sources(device.recipes)


def test_a_recipe_folder_holding_one_recipe_twice_loads_it_once(tmp_path: Path) -> None:
    # GDK's greengrass-build/recipes: the recipe as written beside its own Name-Version.yaml copy.
    device = Device(tmp_path)
    written = device.add("com.example.App", config={"port": 8080})
    (device.recipes / "com.example.App.yaml").write_bytes(written.read_bytes())
    (device.recipes / "com.example.App.json").write_text(json.dumps(read_recipe(written)))
    index = load_recipes(device.recipes)
    assert list(index) == ["com.example.App"]
    assert list(index["com.example.App"]) == ["1.0.0"]
    assert index["com.example.App"]["1.0.0"].default_config == {"port": 8080}


def test_two_different_recipes_of_one_name_and_version_are_refused_naming_both(tmp_path: Path) -> None:
    device = Device(tmp_path)
    device.add("com.example.App", config={"port": 8080})
    other = Device(tmp_path / "other")
    changed = other.add("com.example.App", config={"port": 9090})
    (device.recipes / "com.example.App.yaml").write_bytes(changed.read_bytes())
    with pytest.raises(RecipeError) as err:
        load_recipes(device.recipes)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{device.recipes / 'com.example.App.yaml'}: ComponentVersion: ")
    assert (
        f"com.example.App 1.0.0 is also defined in {device.recipes / 'com.example.App-1.0.0.yaml'}" in message
    )
