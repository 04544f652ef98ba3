"""What each nucleus would refuse in a recipe: one finding per place, with its line and reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeinfer.greengrass.nuclei import (
    CLASSIC,
    LITE,
    check_recipe,
    check_subobject_budget,
    object_depth,
    profile,
    subobject_count,
    with_digests,
)
from edgeinfer.greengrass.recipe import RecipeError, read_recipe, read_sources
from tests.helpers import PROJECT

PORTABLE = """\
RecipeFormatVersion: '2020-01-25'
ComponentName: com.example.Ok
ComponentVersion: 1.0.0
ComponentConfiguration:
  DefaultConfiguration:
    port: 8080
Manifests:
  - Platform:
      os: linux
      runtime: '*'
    Lifecycle:
      run: echo {configuration:/port} {artifacts:path} {work:path}
"""

LITE_ONLY_PROBLEMS = """\
RecipeFormatVersion: '2020-01-25'
ComponentName: com.example.App
ComponentVersion: 1.0.0
ComponentDependencies:
  com.example.Lib:
    VersionRequirement: '>=1.0.0'
ComponentConfiguration:
  DefaultConfiguration:
    allow: [a, b]
Manifests:
  - Platform:
      os: linux
    Lifecycle:
      Install: echo {configuration:/allow}
      run: echo {configuration:/missing} {com.example.Lib:artifacts:path}
"""

INSTALL_ONLY = """\
RecipeFormatVersion: '2020-01-25'
ComponentName: com.example.Lib
ComponentVersion: 1.0.0
Manifests:
  - Platform: {os: linux, runtime: '*'}
    Lifecycle:
      install: 'true'
"""

ARTIFACTS_ONLY = """\
RecipeFormatVersion: '2020-01-25'
ComponentName: com.example.Store
ComponentVersion: 1.0.0
Manifests:
  - Platform: {os: linux, runtime: '*'}
    Lifecycle: {}
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    folder = tmp_path / "recipes"
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(text)
    return path


def test_a_portable_recipe_passes_both(tmp_path: Path) -> None:
    path = _write(tmp_path, "ok", PORTABLE)
    assert check_recipe(path, "classic") == []
    assert check_recipe(path, "lite") == []


def test_lite_findings_name_line_field_and_reason(tmp_path: Path) -> None:
    path = _write(tmp_path, "app", LITE_ONLY_PROBLEMS)
    assert check_recipe(path, CLASSIC) == []
    findings = check_recipe(path, LITE)
    got = [(f.line, f.field, f.reason.split(":")[0]) for f in findings]
    assert got == [
        (11, "Manifests[0].Platform", "skipped"),
        (14, "Manifests[0].Lifecycle.Install", "lifecycle keys are read in lower case only"),
        (14, "Manifests[0].Lifecycle.Install", "{configuration"),
        (15, "Manifests[0].Lifecycle.run", "{configuration"),
        (15, "Manifests[0].Lifecycle.run", "{com.example.Lib"),
    ]
    assert "is a list: it reads as JSON with backslash-escaped quotes" in findings[2].reason
    assert "not in DefaultConfiguration: the step fails" in findings[3].reason
    assert "variables of another component are not supported" in findings[4].reason
    assert str(findings[0]).startswith(f"{path}:11: Manifests[0].Platform: skipped: ")
    assert str(findings[0]).endswith("(nucleus lite)")


def test_hard_dependency_on_an_install_only_component_and_artifacts_only(tmp_path: Path) -> None:
    _write(tmp_path, "lib", INSTALL_ONLY)
    _write(tmp_path, "store", ARTIFACTS_ONLY)
    app = PORTABLE.replace(
        "ComponentName: com.example.Ok",
        "ComponentName: com.example.Ok\nComponentDependencies:\n  com.example.Lib:\n    DependencyType: HARD",
    )
    _write(tmp_path, "ok", app)
    sources = read_sources(tmp_path / "recipes")
    [hard] = check_recipe(sources["com.example.Ok"], "lite", sources)
    assert (hard.line, hard.field) == (4, "ComponentDependencies.com.example.Lib")
    assert "never starts" in hard.reason
    [store] = check_recipe(sources["com.example.Store"], "lite", sources)
    assert store.field == "Manifests[0].Lifecycle"
    assert "never reaches FINISHED" in store.reason
    assert check_recipe(sources["com.example.Ok"], "classic", sources) == []
    assert check_recipe(sources["com.example.Store"], "classic", sources) == []


def test_profiles_hold_the_measured_differences() -> None:
    assert profile("classic") is CLASSIC
    assert LITE.user_and_group == ("gg_component", "gg_component")
    assert CLASSIC.user_and_group == ("ggc_user", "ggc_group")
    assert "SubscribeToValidateConfigurationUpdates" in LITE.refused_operations
    assert "ValidateAuthorizationToken" not in LITE.refused_operations
    assert CLASSIC.refused_operations == frozenset()
    assert CLASSIC.mqtt_max_message_bytes == LITE.mqtt_max_message_bytes == 131072
    assert CLASSIC.max_in_flight_publishes == 5
    with pytest.raises(RecipeError, match="unknown nucleus 'java'"):
        profile("java")


def test_the_projects_recipes_are_checked_for_both() -> None:
    sources = read_sources(PROJECT / "recipes")
    for name in ("classic", "lite"):
        for source in sources.values():
            for finding in check_recipe(source, name, sources):
                assert finding.line > 0, finding
                assert "\n" not in str(finding)


def test_json_recipes_and_what_lite_does_not_run(tmp_path: Path) -> None:
    import json

    recipe = {
        "RecipeFormatVersion": "2020-01-25",
        "ComponentName": "com.example.J",
        "ComponentVersion": "1.0.0",
        "Manifests": [
            {
                "Platform": {"os": "linux", "architecture": "/amd64|x86_64/", "runtime": "*"},
                "Lifecycle": {
                    "run": {"Script": "true", "SkipIf": "onpath true"},
                    "shutdown": "echo bye",
                },
            }
        ],
    }
    path = tmp_path / "j.json"
    path.write_text(json.dumps(recipe, indent=2))
    assert check_recipe(path, "classic") == []
    got = [(f.field, f.reason) for f in check_recipe(path, "lite")]
    assert got == [
        ("Manifests[0].Platform.architecture", "regular expressions are not supported (/amd64|x86_64/)"),
        ("Manifests[0].Lifecycle.run.SkipIf", "SkipIf is not supported"),
        ("Manifests[0].Lifecycle.shutdown", "the shutdown step is not run"),
    ]
    assert all(f.line > 0 for f in check_recipe(path, "lite"))


@pytest.mark.parametrize(
    ("doc", "count"),
    [
        ("text", 0),
        (None, 0),
        ([], 0),
        ({}, 0),
        ([1, "a", None], 3),  # a list item counts once
        ({"a": 1, "b": 2}, 4),  # a map entry twice (key and value)
        ({"a": [1, {"b": 2}]}, 2 + 2 + 2),  # every level
        ([[[1]]], 3),
    ],
)
def test_subobject_count_is_nucleus_lites(doc: object, count: int) -> None:
    assert subobject_count(doc) == count


def test_the_subobject_budget_names_the_count_and_the_budget(tmp_path: Path) -> None:
    ok = _write(tmp_path, "ok", PORTABLE)
    assert LITE.recipe_subobject_limit == 255
    assert subobject_count(read_recipe(ok)) <= 255
    assert check_subobject_budget(ok) == []
    items = "".join(f"      - item{i}\n" for i in range(300))
    big = _write(tmp_path, "big", PORTABLE.replace("    port: 8080\n", f"    port: 8080\n    many:\n{items}"))
    count = subobject_count(read_recipe(big))
    assert count > 300
    (finding,) = check_subobject_budget(big, "lite")
    assert finding.field == "ComponentConfiguration"
    assert finding.line == 4
    assert f"counts {count} sub-objects" in finding.reason
    assert "over the 255 " in finding.reason
    assert "the deployment fails" in finding.reason
    assert check_subobject_budget(big, "classic") == []


def test_the_budget_counts_the_recipe_as_built_and_is_a_rule(tmp_path: Path) -> None:
    art = "    Artifacts:\n" + "".join(f"      - URI: s3://b/f{i}.bin\n" for i in range(20))
    recipe = PORTABLE + art
    path = _write(tmp_path, "arts", recipe)
    source = subobject_count(read_recipe(path))
    built = subobject_count(with_digests(read_recipe(path)))
    assert built == source + 20 * 4  # Digest and Algorithm: two map entries on each artifact
    assert check_recipe(path, "lite") == []
    # Grow it until only the digests a build adds take it over the budget.
    extra = "".join(f"      - item{i}\n" for i in range(255 - built + 1))
    fat = _write(tmp_path, "fat", recipe.replace("    port: 8080\n", f"    port: 8080\n    many:\n{extra}"))
    assert subobject_count(read_recipe(fat)) <= 255 < subobject_count(with_digests(read_recipe(fat)))
    (finding,) = check_recipe(fat, "lite")
    assert f"counts {subobject_count(with_digests(read_recipe(fat)))} sub-objects as built" in str(finding)
    assert check_recipe(fat, "classic") == []


def test_depth_is_nucleus_lites_and_over_15_fails(tmp_path: Path) -> None:
    docs: list[object] = [5, {}, {"a": 5}, [{"a": 5}], {"a": [[]]}]
    assert [object_depth(d) for d in docs] == [1, 1, 2, 3, 3]

    def deep(levels: int) -> Path:
        nested: object = "x"
        for _ in range(levels):
            nested = {"n": nested}
        text = PORTABLE.replace("    port: 8080\n", f"    port: 8080\n    deep: {json_of(nested)}\n")
        return _write(tmp_path, f"deep{levels}", text)

    # the recipe, ComponentConfiguration, DefaultConfiguration, then `deep`: 3 + levels + 1
    fits, over = deep(11), deep(12)
    assert (object_depth(read_recipe(fits)), object_depth(read_recipe(over))) == (15, 16)
    assert check_recipe(fits, "lite") == []
    (finding,) = check_recipe(over, "lite")
    assert finding.field.startswith("ComponentConfiguration.DefaultConfiguration.deep")
    assert finding.line == 7
    assert "nests 16 levels deep, over the 15" in finding.reason
    assert check_recipe(over, "classic") == []
    assert check_recipe(_write(tmp_path, "ok", PORTABLE), "lite") == []  # PORTABLE nests 5


def test_a_component_without_a_run_step_fails_the_deployment_on_lite(tmp_path: Path) -> None:
    path = _write(tmp_path, "lib", INSTALL_ONLY)
    (finding,) = check_recipe(path, "lite")
    assert finding.field == "Manifests[0].Lifecycle"
    assert "waits 300 s for the component's run unit, then reports FAILED" in finding.reason
    assert check_recipe(path, "classic") == []
    startup = _write(tmp_path, "startup", INSTALL_ONLY.replace("install: 'true'", "startup: 'true'"))
    assert check_recipe(startup, "lite") == []
    with_run = _write(tmp_path, "run", INSTALL_ONLY + "      run: 'true'\n")
    assert check_recipe(with_run, "lite") == []


def json_of(value: object) -> str:
    import json

    return json.dumps(value)
