"""`edgeinfer build`: artifacts/ in the greengrass-cli layout, recipes with digests, greengrass-build/."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import jsonschema
import pytest
import yaml

from edgeinfer import __version__, cli
from edgeinfer.bundle.build import BuildError, build_bundle, load_recipes, lower_keys, schema
from tests.helpers import PROJECT as ROOT
from tests.helpers.model_store import write_model_store

V = __version__  # the one version: edgeinfer.__version__
WHEEL = f"edgeinfer-{V}-py3-none-any.whl"


def b64sha(path: Path) -> str:
    return base64.b64encode(hashlib.sha256(path.read_bytes()).digest()).decode()


def test_build_lays_out_artifacts_and_recipes_with_digests(artifacts: Path, tmp_path: Path) -> None:
    out = tmp_path / "greengrass-build"
    bundle = build_bundle(ROOT, artifacts_dir=artifacts, out_dir=out)
    names = [c.name for c in bundle.components]
    assert names.index("com.edgeinfer.ModelStore") < names.index("com.edgeinfer.InferenceRuntime")
    assert names.index("com.edgeinfer.RuntimeInstaller") < names.index("com.edgeinfer.InferenceRuntime")
    assert (artifacts / "com.edgeinfer.RuntimeInstaller" / V / WHEEL).is_file()
    validator = jsonschema.Draft7Validator(schema("greengrass-recipe"))
    for comp in bundle.components:
        recipe_path = out / "recipes" / f"{comp.name}-{comp.version}.yaml"
        recipe = yaml.safe_load(recipe_path.read_text())
        assert list(validator.iter_errors(lower_keys(recipe))) == []
        for manifest in recipe["Manifests"]:
            for art in manifest.get("Artifacts", []):
                name = art["URI"].rsplit("/", 1)[-1]
                built = out / "artifacts" / comp.name / comp.version / name
                assert art["Digest"] == b64sha(artifacts / comp.name / comp.version / name)
                assert art["Algorithm"] == "SHA-256"
                assert built.read_bytes() == (artifacts / comp.name / comp.version / name).read_bytes()


def test_build_is_idempotent_and_deterministic(artifacts: Path, tmp_path: Path) -> None:
    out = tmp_path / "gb"
    t0 = time.perf_counter()
    build_bundle(ROOT, artifacts_dir=artifacts, out_dir=out)
    first_s = time.perf_counter() - t0
    wheel = artifacts / "com.edgeinfer.RuntimeInstaller" / V / WHEEL
    stamp, digest = wheel.stat().st_mtime_ns, b64sha(wheel)
    recipes_before = {p.name: p.read_bytes() for p in (out / "recipes").iterdir()}
    t0 = time.perf_counter()
    build_bundle(ROOT, artifacts_dir=artifacts, out_dir=out)
    second_s = time.perf_counter() - t0
    print(f"\nbuild {first_s:.2f} s, rebuild {second_s:.2f} s")
    assert wheel.stat().st_mtime_ns == stamp  # unchanged content is not rewritten
    assert b64sha(wheel) == digest
    assert {p.name: p.read_bytes() for p in (out / "recipes").iterdir()} == recipes_before
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".gb.")]  # no staging left


def test_missing_model_store_is_one_clear_line(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match=r"run 'edgeinfer model build'") as err:
        build_bundle(ROOT, artifacts_dir=tmp_path / "empty", out_dir=tmp_path / "gb")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "gb").exists()


def test_an_output_folder_that_cannot_be_written_is_one_clear_line(artifacts: Path, tmp_path: Path) -> None:
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("")
    with pytest.raises(BuildError, match=r"cannot write .*a-file/gb") as err:
        build_bundle(ROOT, artifacts_dir=artifacts, out_dir=in_the_way / "gb")
    assert "\n" not in str(err.value)


def test_a_model_file_that_does_not_match_its_manifest_is_refused(artifacts: Path, tmp_path: Path) -> None:
    (artifacts / "com.edgeinfer.ModelStore" / V / "model_int8_cpu.onnx").write_bytes(b"tampered")
    with pytest.raises(BuildError, match=r"model_int8_cpu\.onnx"):
        build_bundle(ROOT, artifacts_dir=artifacts, out_dir=tmp_path / "gb")


def test_recipe_problems_name_the_file_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match=r"recipes: recipe folder not found"):
        load_recipes(tmp_path)
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "README.md").write_text("not a recipe")
    with pytest.raises(BuildError, match=r"recipes: no recipes in this folder"):
        load_recipes(tmp_path)
    bad = tmp_path / "recipes" / "com.example.A.yaml"
    bad.write_text("ComponentName: [unclosed\n")
    with pytest.raises(BuildError, match=r"com\.example\.A\.yaml: not a readable recipe") as err:
        load_recipes(tmp_path)
    assert "\n" not in str(err.value)
    bad.write_text("- a list\n")
    with pytest.raises(BuildError, match=r"com\.example\.A\.yaml: not a recipe"):
        load_recipes(tmp_path)
    bad.write_text(
        "ComponentName: com.example.A\nComponentVersion: 1.0.0\nManifests:\n  - Platform: {os: windows}\n"
    )
    assert load_recipes(tmp_path)["com.example.A"].version == "1.0.0"  # any platform's manifests


def test_wheelhouse_ships_as_an_unarchived_installer_artifact(artifacts: Path, tmp_path: Path) -> None:
    house = tmp_path / "house"
    house.mkdir()
    with zipfile.ZipFile(house / "tiny-1.0-py3-none-any.whl", "w") as zf:
        zf.writestr("tiny.py", "")
        zf.writestr("tiny-1.0.dist-info/RECORD", "")
    out = tmp_path / "gb"
    bundle = build_bundle(ROOT, artifacts_dir=artifacts, out_dir=out, wheelhouse=house)
    comp = bundle.component("com.edgeinfer.RuntimeInstaller")
    assert [a.filename for a in comp.artifacts] == [WHEEL, "wheelhouse.zip"]
    recipe = yaml.safe_load((out / "recipes" / f"com.edgeinfer.RuntimeInstaller-{V}.yaml").read_text())
    entry = recipe["Manifests"][0]["Artifacts"][-1]
    assert entry["URI"].endswith("/wheelhouse.zip")
    assert entry["Unarchive"] == "ZIP"
    with zipfile.ZipFile(artifacts / "com.edgeinfer.RuntimeInstaller" / V / "wheelhouse.zip") as zf:
        assert zf.namelist() == ["tiny-1.0-py3-none-any.whl"]


def test_the_shipped_wheel_runs_the_installer_from_pythonpath(artifacts: Path, tmp_path: Path) -> None:
    build_bundle(
        ROOT, artifacts_dir=artifacts, out_dir=tmp_path / "gb", only=["com.edgeinfer.RuntimeInstaller"]
    )
    wheel = artifacts / "com.edgeinfer.RuntimeInstaller" / V / WHEEL
    env = {**os.environ, "PYTHONPATH": str(wheel)}
    code = "import edgeinfer, edgeinfer.installer.install as i; print(edgeinfer.__file__)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert WHEEL in out.stdout
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    assert "edgeinfer/installer/__main__.py" in names
    assert not [n for n in names if n.endswith(("gdk-config.json", "recipe.yaml")) or "__pycache__" in n]


def test_cli_build(artifacts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(
        ["build", "--project", str(ROOT), "--artifacts", str(artifacts), "--out", str(tmp_path / "o")]
    )
    assert code == 0
    assert f"com.edgeinfer.ModelStore {V}" in capsys.readouterr().out
    code = cli.main(
        ["build", "--project", str(ROOT), "--artifacts", str(tmp_path / "x"), "--out", str(tmp_path / "o")]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("edgeinfer: error:")
    assert err.count("\n") == 1


def test_model_store_from_a_changed_build_changes_its_digest(artifacts: Path, tmp_path: Path) -> None:
    first = build_bundle(ROOT, artifacts_dir=artifacts, out_dir=tmp_path / "gb")
    before = {a.filename: a.digest for a in first.component("com.edgeinfer.ModelStore").artifacts}
    write_model_store(artifacts / "com.edgeinfer.ModelStore" / V, salt="v2")
    second = build_bundle(ROOT, artifacts_dir=artifacts, out_dir=tmp_path / "gb")
    after = {a.filename: a.digest for a in second.component("com.edgeinfer.ModelStore").artifacts}
    assert before["model_fp32.onnx"] != after["model_fp32.onnx"]


def test_an_output_folder_with_other_files_is_never_replaced(artifacts: Path, tmp_path: Path) -> None:
    out = tmp_path / "project"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(
        BuildError, match=r"refusing to replace .*project: it holds files and is not a bundle"
    ):
        build_bundle(ROOT, artifacts_dir=artifacts, out_dir=out)
    assert (out / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_a_bundle_folder_is_rebuilt_in_place(artifacts: Path, tmp_path: Path) -> None:
    out = tmp_path / "deep" / "gb"
    build_bundle(ROOT, artifacts_dir=artifacts, out_dir=out)
    build_bundle(ROOT, artifacts_dir=artifacts, out_dir=out)  # its own layout: replaced
    assert sorted(p.name for p in out.iterdir()) == ["artifacts", "recipes"]


def test_a_layout_of_someone_elses_recipes_is_never_replaced(artifacts: Path, tmp_path: Path) -> None:
    out = tmp_path / "local-deployment"  # as greengrass-cli's --recipeDir/--artifactDir pair
    (out / "recipes").mkdir(parents=True)
    (out / "recipes" / "com.example.Mine-1.0.0.yaml").write_text("mine")
    (out / "artifacts" / "com.example.Mine").mkdir(parents=True)
    with pytest.raises(BuildError, match="is not a bundle layout of this project's components"):
        build_bundle(ROOT, artifacts_dir=artifacts, out_dir=out)
    assert (out / "recipes" / "com.example.Mine-1.0.0.yaml").read_text() == "mine"


def test_an_older_build_of_the_bundle_is_replaced(artifacts: Path, tmp_path: Path) -> None:
    out = tmp_path / "gb"
    (out / "recipes").mkdir(parents=True)
    (out / "recipes" / "com.edgeinfer.InferenceRuntime-0.0.9.yaml").write_text("old")
    (out / "artifacts" / "com.edgeinfer.InferenceRuntime" / "0.0.9").mkdir(parents=True)
    (out / ".DS_Store").write_text("")
    build_bundle(ROOT, artifacts_dir=artifacts, out_dir=out)
    assert not (out / "recipes" / "com.edgeinfer.InferenceRuntime-0.0.9.yaml").exists()


def test_built_recipes_keep_the_scripts_as_written(artifacts: Path, tmp_path: Path) -> None:
    bundle = build_bundle(ROOT, artifacts_dir=artifacts, out_dir=tmp_path / "gb")
    for comp in bundle.components:
        text = (tmp_path / "gb" / "recipes" / f"{comp.name}-{comp.version}.yaml").read_text()
        built = yaml.safe_load(text)
        assert [m["Lifecycle"] for m in built["Manifests"]] == [
            m["Lifecycle"] for m in comp.recipe["Manifests"]
        ]
        for manifest in comp.recipe["Manifests"]:
            for step in manifest["Lifecycle"].values():
                script = step.get("Script", "") if isinstance(step, dict) else ""
                if "\n" in script:  # as a literal block, its lines as written
                    assert all(
                        f"        {line}".rstrip() in text.splitlines() for line in script.splitlines()
                    )
