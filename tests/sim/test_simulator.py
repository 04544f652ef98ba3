"""A bad recipe stops the simulator at start: one line naming the file and field, nothing run."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from edgeinfer.sim import RecipeError, Simulator
from tests.helpers.sim import Device


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


def test_an_unknown_nucleus_is_one_line(device: Device) -> None:
    from edgeinfer.sim import SimError

    with pytest.raises(SimError, match=r"unknown nucleus 'java' \(classic or lite\)"):
        Simulator(device.recipes, device.artifacts, nucleus="java")
    assert Simulator(device.recipes, device.artifacts, nucleus="lite").nucleus.name == "lite"


def test_file_uris_name_the_file_not_a_file_called_file_colon(
    simulator: Callable[..., Simulator], device: Device, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("from an absolute path\n")
    device.add(
        "com.example.Files",
        files={"local.txt": "from the artifact folder\n"},
        artifacts=[{"URI": "file:local.txt"}, {"URI": f"file://{elsewhere}"}],
        lifecycle={"run": "cat {artifacts:path}/local.txt {artifacts:path}/elsewhere.txt"},
    )
    sim = simulator(device.recipes, device.artifacts)
    assert sim.wait_for_state("com.example.Files", "FINISHED") == "FINISHED"
    log = sim.logs("com.example.Files")
    assert "from the artifact folder" in log
    assert "from an absolute path" in log


def test_a_recipe_folder_as_gdk_builds_it_runs_its_recipe_once(
    simulator: Callable[..., Simulator], device: Device
) -> None:
    # greengrass-build/recipes after `gdk component build`: the recipe beside GDK's Name-Version copy
    written = device.add("com.example.App", lifecycle={"run": "echo ran-$((6*7))"})
    (device.recipes / "com.example.App.yaml").write_bytes(written.read_bytes())
    sim = simulator(device.recipes, device.artifacts)
    assert sim.wait_for_state("com.example.App", "FINISHED") == "FINISHED"
    assert sim.logs("com.example.App").count("ran-42") == 1


def test_two_different_recipes_of_one_version_stop_the_simulator_naming_both(device: Device) -> None:
    device.add("com.example.App", lifecycle={"run": "echo one"})
    (device.recipes / "com.example.App.yaml").write_text(
        (device.recipes / "com.example.App-1.0.0.yaml").read_text().replace("echo one", "echo two")
    )
    _one_line_error(
        device,
        r"App\.yaml: ComponentVersion: com\.example\.App 1\.0\.0 is also defined in .*App-1\.0\.0\.yaml, "
        r"differently",
    )
