"""`gdk component build` then `gdk component publish` in every GDK folder of the project.

The GDK CLI is not on the package registries, so `Gdk` below does what its v1.6.2 source does with a
custom build, step by step (aws-greengrass/aws-greengrass-gdk-cli):

- `GDKProject`: the first component of gdk-config.json; exactly one of recipe.json / recipe.yaml in
  the folder, `.resolve()`d, so a symlink counts by its target's file name;
- `BuildCommand`: deletes `greengrass-build/`, creates `greengrass-build/recipes/` and
  `greengrass-build/artifacts/<component>/<version>/`, runs `custom_build_command` in the folder;
- `PublishCommand.try_build`: the component artifacts folder must exist;
- `PublishRecipeTransformer`: reads `greengrass-build/recipes/<resolved recipe file name>`, refuses a
  recipe of another component, sets `ComponentVersion`, points every s3 artifact URI whose file is in
  the artifacts folder at `s3://<bucket>-<region>-<account>/<component>/<version>/<file>`, writes
  `greengrass-build/recipes/<component>-<version>.<ext>`;
- `upload_artifacts_s3`: uploads every file of the artifacts folder under `<component>/<version>/`.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from edgeinfer import __version__, cli
from edgeinfer.bundle.build import BuildError, build_bundle, gdk_config_files, gdk_project
from edgeinfer.greengrass.nuclei import check_recipe
from tests.helpers import PROJECT
from tests.helpers.model_store import write_model_store

BUILD = "greengrass-build"


@dataclass
class Published:
    recipe_file: Path
    recipe: dict[str, Any]
    uploads: list[str]  # s3 keys


class Gdk:
    """GDK CLI v1.6.2 in one component folder, as far as a custom build goes."""

    def __init__(self, folder: Path) -> None:
        config = json.loads((folder / "gdk-config.json").read_text(encoding="utf-8"))
        self.name, self.settings = next(iter(config["component"].items()))
        self.version = self.settings["version"]
        found = [folder / n for n in ("recipe.json", "recipe.yaml") if (folder / n).exists()]
        assert len(found) == 1, "GDK: PROJECT_RECIPE_FILE_NOT_FOUND"
        self.folder = folder
        self.recipe_file = found[0].resolve()
        self.recipes_dir = folder / BUILD / "recipes"
        self.artifacts_dir = folder / BUILD / "artifacts" / self.name / self.version

    def build(self, run_custom_command: Any) -> None:
        shutil.rmtree(self.folder / BUILD, ignore_errors=True)
        self.recipes_dir.mkdir(parents=True)
        self.artifacts_dir.mkdir(parents=True)
        assert self.settings["build"]["build_system"] == "custom"
        run_custom_command(self.settings["build"]["custom_build_command"], self.folder)

    def publish(self, region: str = "eu-west-1", account: str = "111122223333") -> Published:
        bucket = f"{self.settings['publish']['bucket']}-{region}-{account}"
        assert self.artifacts_dir.is_dir(), "GDK: the component is not built"
        recipe = yaml.safe_load((self.recipes_dir / self.recipe_file.name).read_text(encoding="utf-8"))
        assert recipe["ComponentName"] == self.name, "GDK: the component is not built"
        recipe["ComponentVersion"] = self.version
        for manifest in recipe.get("Manifests", []):
            for art in manifest.get("Artifacts", []):
                file = art["URI"].rsplit("/", 1)[-1]
                if art["URI"].startswith("s3://") and len(list(self.artifacts_dir.glob(file))) == 1:
                    art["URI"] = f"s3://{bucket}/{self.name}/{self.version}/{file}"
        ext = self.recipe_file.name.split(".")[-1]
        out = self.recipes_dir / f"{self.name}-{self.version}.{ext}"
        out.write_text(yaml.safe_dump(recipe, sort_keys=False), encoding="utf-8")
        uploads = [f"{self.name}/{self.version}/{p.name}" for p in sorted(self.artifacts_dir.iterdir())]
        return Published(out, recipe, uploads)


def edgeinfer_runs(command: list[str], cwd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The custom build command, run in the GDK folder as GDK's `sp.run(..., check=True)` does."""
    assert command[0] == "edgeinfer"
    with monkeypatch.context() as m:
        m.chdir(cwd)
        assert cli.main(command[1:]) == 0


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """The project's sources by link, its GDK folders copied with the same recipe links, the model
    store built into its artifacts/: GDK writes greengrass-build/ here, never into the checkout."""
    root = tmp_path / "project"
    root.mkdir()
    for name in ("pyproject.toml", "README.md", "recipes", "components"):
        (root / name).symlink_to(PROJECT / name)
    write_model_store(root / "artifacts" / "com.edgeinfer.ModelStore" / __version__)
    for config in gdk_config_files(PROJECT):
        folder = root / "gdk" / config.parent.relative_to(PROJECT) if config.parent != PROJECT else root
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(config, folder / "gdk-config.json")
        if folder != root:
            (folder / "recipe.yaml").symlink_to(
                PROJECT / "recipes" / f"{gdk_project(PROJECT / config.parent).component}.yaml"
            )
        else:
            (folder / "recipe.yaml").symlink_to(Path("recipes") / "com.edgeinfer.InferenceRuntime.yaml")
    return root


def gdk_folders(root: Path) -> list[Path]:
    return [root, *sorted(p.parent for p in (root / "gdk").glob("**/gdk-config.json"))]


def test_the_projects_gdk_folders_link_the_one_recipe_source() -> None:
    folders = [f.parent for f in gdk_config_files(PROJECT)]
    assert len(folders) == 4
    for folder in folders:
        gp = gdk_project(folder)
        assert gp.recipe_file == (PROJECT / "recipes" / f"{gp.component}.yaml").resolve()
        assert gp.version == __version__
        assert gp.build_recipe_name == f"{gp.component}.yaml"


def test_build_then_publish_works_in_every_gdk_folder(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    names = set()
    for folder in gdk_folders(project):
        gdk = Gdk(folder)
        gdk.build(lambda command, cwd: edgeinfer_runs(command, cwd, monkeypatch))
        published = gdk.publish()
        names.add(gdk.name)
        recipe = published.recipe
        assert recipe["ComponentVersion"] == __version__
        listed = [a["URI"] for m in recipe["Manifests"] for a in m.get("Artifacts", [])]
        bucket = f"s3://{gdk.settings['publish']['bucket']}-eu-west-1-111122223333/{gdk.name}/{__version__}/"
        assert all(uri.startswith(bucket) for uri in listed), listed  # none left with BUCKET_NAME
        assert sorted(u.rsplit("/", 1)[-1] for u in listed) == sorted(
            k.rsplit("/", 1)[-1] for k in published.uploads
        )
        for nucleus in ("classic", "lite"):  # what GDK creates in the cloud runs on both nuclei
            assert check_recipe(published.recipe_file, nucleus) == []
    assert len(names) == 4


def test_gdk_at_the_root_leaves_the_whole_bundle_layout(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    edgeinfer_runs(["edgeinfer", "build"], project, monkeypatch)
    before = sorted(p.relative_to(project / BUILD).as_posix() for p in (project / BUILD).rglob("*"))
    gdk = Gdk(project)
    gdk.build(lambda command, cwd: edgeinfer_runs(command, cwd, monkeypatch))
    after = sorted(p.relative_to(project / BUILD).as_posix() for p in (project / BUILD).rglob("*"))
    assert "recipes/com.edgeinfer.InferenceRuntime.yaml" in before  # the plain build keeps it too
    assert after == before
    gdk.publish()  # its output keeps the bundle's file name for the component
    assert (project / BUILD / "recipes" / f"com.edgeinfer.InferenceRuntime-{__version__}.yaml").is_file()


def test_a_bare_publish_after_a_plain_build_at_the_root_finds_its_component_built(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gdk = Gdk(project)
    gdk.build(lambda command, cwd: edgeinfer_runs(command, cwd, monkeypatch))
    edgeinfer_runs(["edgeinfer", "build"], project, monkeypatch)
    recipes = project / BUILD / "recipes"
    gdk_named = recipes / "com.edgeinfer.InferenceRuntime.yaml"
    assert (
        gdk_named.read_bytes()
        == (recipes / f"com.edgeinfer.InferenceRuntime-{__version__}.yaml").read_bytes()
    )
    published = gdk.publish()  # GDK: "the component is not built" if the recipe were not there
    assert published.recipe["ComponentName"] == "com.edgeinfer.InferenceRuntime"
    assert published.recipe["ComponentVersion"] == __version__


def test_a_plain_build_elsewhere_or_of_other_components_writes_only_the_bundles_names(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    edgeinfer_runs(["edgeinfer", "build", "--out", "elsewhere"], project, monkeypatch)
    assert "com.edgeinfer.InferenceRuntime.yaml" not in {
        p.name for p in (project / "elsewhere" / "recipes").iterdir()
    }
    edgeinfer_runs(["edgeinfer", "build", "--component", "com.edgeinfer.Telemetry"], project, monkeypatch)
    assert sorted(p.name for p in (project / BUILD / "recipes").iterdir()) == [
        f"com.edgeinfer.Telemetry-{__version__}.yaml"
    ]


def test_a_component_folder_holds_only_its_component(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = project / "gdk" / "components" / "edgeinfer" / "model"
    Gdk(folder).build(lambda command, cwd: edgeinfer_runs(command, cwd, monkeypatch))
    assert sorted(p.name for p in (folder / BUILD / "recipes").iterdir()) == ["com.edgeinfer.ModelStore.yaml"]
    assert sorted(p.name for p in (folder / BUILD / "artifacts").iterdir()) == ["com.edgeinfer.ModelStore"]
    files = {
        p.name for p in (folder / BUILD / "artifacts" / "com.edgeinfer.ModelStore" / __version__).iterdir()
    }
    assert {"manifest.json", "model_fp32.onnx"} <= files


def test_a_gdk_folder_that_disagrees_with_the_bundle_is_one_clear_line(project: Path) -> None:
    folder = project / "gdk" / "components" / "edgeinfer" / "telemetry"
    config = json.loads((folder / "gdk-config.json").read_text())
    config["component"]["com.edgeinfer.Telemetry"]["version"] = "0.0.1"
    (folder / "gdk-config.json").write_text(json.dumps(config))
    with pytest.raises(
        BuildError, match=r"version 0\.0\.1, but the bundle builds com\.edgeinfer\.Telemetry"
    ) as err:
        build_bundle(project, gdk="com.edgeinfer.Telemetry", gdk_dir=folder)
    assert "\n" not in str(err.value)
    with pytest.raises(
        BuildError, match=r"is the GDK folder of com\.edgeinfer\.Telemetry, not of com\.edgeinfer\.ModelStore"
    ):
        build_bundle(project, gdk="com.edgeinfer.ModelStore", gdk_dir=folder)
    (folder / "recipe.json").write_text("{}")
    with pytest.raises(BuildError, match=r"both recipe\.json and recipe\.yaml"):
        build_bundle(project, gdk="com.edgeinfer.Telemetry", gdk_dir=folder)


def test_a_plain_build_writes_the_version_into_every_gdk_config(tmp_path: Path) -> None:
    from edgeinfer.bundle.build import stamp_gdk_configs

    root = tmp_path / "p"
    (root / "components" / "x").mkdir(parents=True)
    config = {"component": {"com.example.X": {"author": "a", "version": "0.0.1"}}, "gdk_version": "1.3.0"}
    (root / "components" / "x" / "gdk-config.json").write_text(json.dumps(config))
    assert stamp_gdk_configs(root, {"com.example.X": "2.0.0"}) == [
        root / "components" / "x" / "gdk-config.json"
    ]
    written = json.loads((root / "components" / "x" / "gdk-config.json").read_text())
    assert written["component"]["com.example.X"]["version"] == "2.0.0"
    assert stamp_gdk_configs(root, {"com.example.X": "2.0.0"}) == []  # unchanged: not rewritten
