"""Build the bundle: artifacts/<Component>/<Version>/, recipes with digests, greengrass-build/.

Sources: `recipes/*.yaml` (one per component, written by each component's owner) and what the
recipes' artifact URIs name:

- `edgeinfer-<version>-py3-none-any.whl`: the project wheel (built here, deterministic);
- the model store's files: written by `edgeinfer model build` into
  `artifacts/com.edgeinfer.ModelStore/<version>/` and checked against its `manifest.json`;
- `wheelhouse.zip` (optional, `--wheelhouse DIR`): an offline wheelhouse for the installer;
- anything else must already be in `artifacts/<Component>/<Version>/`.

Outputs:

- `artifacts/<Component>/<Version>/<file>`: the greengrass-cli layout, so that
  `greengrass-cli deployment create --recipeDir recipes --artifactDir artifacts` works as-is (the
  simulated core loads exactly this);
- `greengrass-build/recipes/<Component>-<Version>.yaml`: each recipe with `Digest`/`Algorithm` on
  every artifact (URIs keep GDK's `BUCKET_NAME/COMPONENT_NAME/COMPONENT_VERSION` placeholders until
  `edgeinfer publish` or `gdk component publish` fills them in);
- `greengrass-build/artifacts/<Component>/<Version>/`: hard links of the artifacts (GDK layout);
- with `--gdk COMPONENT` (what each folder's gdk-config.json runs): `./greengrass-build/` holds that one
  component with its recipe under the name `gdk component publish` reads (see `gdk_project`); at the
  project root, where `gdk component build` first deletes `greengrass-build/`, the whole bundle is
  written back beside it, so the two coexist.

Before anything is written the recipes are checked against both nuclei (`check_recipes`, what
`edgeinfer build --check` prints): a recipe that the classic nucleus or nucleus lite would refuse is not
built. The project's version is `edgeinfer.__version__` alone: the recipes name it by
`{edgeinfer:version}` (stamped as they are read), and a build writes it into every gdk-config.json.
Over 500 lines because the greengrass-cli and the GDK layouts are written from the same checked
components in one pass.

Writes happen only when content changed, so a second build is a quick no-op.
"""

from __future__ import annotations

import base64
import copy
import json
import logging
import os
import shutil
import tempfile
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from edgeinfer.bundle.wheel import build_wheel
from edgeinfer.errors import EdgeinferError
from edgeinfer.files import atomic_write, check_replaceable, new_parents, sha256_file
from edgeinfer.greengrass import recipe as gg_recipe
from edgeinfer.greengrass.nuclei import Finding, check_recipe, check_subobject_budget
from edgeinfer.greengrass.recipe import RecipeError, artifact_filename, cget

__all__ = [
    "MODEL_STORE",
    "NUCLEI",
    "RUNTIME_INSTALLER",
    "Artifact",
    "BuildError",
    "Bundle",
    "Component",
    "GdkProject",
    "RecipeCheck",
    "build_bundle",
    "check_recipes",
    "dependency_order",
    "find_project",
    "gdk_config_files",
    "gdk_project",
    "load_recipes",
    "lower_keys",
    "schema",
    "stale_gdk_configs",
    "validate_recipe",
]

log = logging.getLogger(__name__)

MODEL_STORE = "com.edgeinfer.ModelStore"
RUNTIME_INSTALLER = "com.edgeinfer.RuntimeInstaller"
WHEELHOUSE_ZIP = "wheelhouse.zip"
PLACEHOLDER_PREFIX = "s3://BUCKET_NAME/COMPONENT_NAME/COMPONENT_VERSION/"
_SCHEMAS = Path(__file__).parent / "schemas"
NUCLEI = ("classic", "lite")
GDK_CONFIG = "gdk-config.json"
_EPOCH = (1980, 1, 1, 0, 0, 0)


class BuildError(EdgeinferError):
    """The bundle cannot be built: one line naming the recipe, artifact or step."""


@dataclass
class Artifact:
    filename: str
    path: Path  # in artifacts/<Component>/<Version>/
    sha256: str  # hex
    size: int
    unarchive: str = "NONE"

    @property
    def digest(self) -> str:
        """Greengrass's form: base64 of the SHA-256."""
        return base64.b64encode(bytes.fromhex(self.sha256)).decode()


@dataclass
class Component:
    name: str
    version: str
    recipe_file: Path
    recipe: dict[str, Any]  # the source recipe as written
    artifacts: list[Artifact] = field(default_factory=list)
    dependencies: list[str] = field(default_factory=list)

    def built_recipe(self) -> dict[str, Any]:
        """The recipe with Digest and Algorithm on every artifact (and any artifact build added)."""
        recipe = copy.deepcopy(self.recipe)
        by_name = {a.filename: a for a in self.artifacts}
        for manifest in cget(recipe, "Manifests") or []:
            listed = _artifact_list(manifest)
            seen = set()
            for art in listed:
                name = artifact_filename(str(cget(art, "URI")))
                seen.add(name)
                if name in by_name:
                    _cset(art, "Digest", by_name[name].digest)
                    _cset(art, "Algorithm", "SHA-256")
            for extra in self.artifacts:
                if extra.filename not in seen:
                    listed.append(
                        {
                            "URI": PLACEHOLDER_PREFIX + extra.filename,
                            "Unarchive": extra.unarchive,
                            "Digest": extra.digest,
                            "Algorithm": "SHA-256",
                            "Permission": {"Read": "OWNER"},
                        }
                    )
        return recipe


@dataclass
class Bundle:
    root: Path
    artifacts_dir: Path
    out_dir: Path | None
    components: list[Component]  # in dependency order (dependencies first)

    @property
    def recipes_dir(self) -> Path:
        """The built recipes (digests set): with `artifacts_dir`, what `greengrass-cli deployment
        create --recipeDir --artifactDir` and the simulated core take."""
        return (self.out_dir if self.out_dir is not None else self.root / "greengrass-build") / "recipes"

    def component(self, name: str) -> Component:
        for comp in self.components:
            if comp.name == name:
                return comp
        raise KeyError(name)


# ------------------------------------------------------------------------------------ recipe helpers


def _cset(mapping: dict[str, Any], key: str, value: Any) -> None:
    for k in list(mapping):
        if isinstance(k, str) and k.lower() == key.lower():
            mapping[k] = value
            return
    mapping[key] = value


def _artifact_list(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    arts = cget(manifest, "Artifacts")
    if arts is None:
        arts = []
        manifest["Artifacts"] = arts
    return arts  # type: ignore[no-any-return]


def lower_keys(value: Any) -> Any:
    """Lower-case every mapping key, recursively, as the GDK does before validating a recipe."""
    if isinstance(value, Mapping):
        return {str(k).lower(): lower_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [lower_keys(v) for v in value]
    return value


def schema(name: str) -> dict[str, Any]:
    """A bundled JSON schema: "greengrass-recipe" or "gdk-config"."""
    data: dict[str, Any] = json.loads((_SCHEMAS / f"{name}.schema.json").read_text(encoding="utf-8"))
    return data


def validate_recipe(recipe: Mapping[str, Any]) -> list[str]:
    """Schema errors (GDK's recipe schema, keys lower-cased); empty when valid or jsonschema absent."""
    try:
        import jsonschema  # type: ignore[import-untyped]
    except ImportError:  # a device or a minimal install: the cloud validates again on publish
        return []
    validator = jsonschema.Draft7Validator(schema("greengrass-recipe"))
    return [
        f"{'/'.join(str(p) for p in err.absolute_path) or '<root>'}: {err.message}"
        for err in sorted(validator.iter_errors(lower_keys(recipe)), key=lambda e: list(e.absolute_path))
    ]


def find_project(start: Path | None = None) -> Path:
    """The project root: the nearest folder (from `start`, upwards) with pyproject.toml and recipes/."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "pyproject.toml").is_file() and (folder / "recipes").is_dir():
            return folder
    raise BuildError(f"no edgeinfer project (pyproject.toml + recipes/) at or above {here}")


def load_recipes(root: Path) -> dict[str, Component]:
    """The source recipes of `<root>/recipes/` as written (every manifest, any platform), read with
    the one recipe model (`edgeinfer.greengrass.recipe`): name → Component."""
    try:
        sources = gg_recipe.read_sources(root / "recipes")
    except RecipeError as exc:
        raise BuildError(str(exc)) from None
    return {
        name: Component(name, src.version, src.file, src.raw, dependencies=list(src.dependencies))
        for name, src in sources.items()
    }


def dependency_order(components: Mapping[str, Component]) -> list[str]:
    """Names with every bundle dependency before its dependants (stable: alphabetical otherwise)."""
    try:
        return gg_recipe.dependency_order({n: c.dependencies for n, c in components.items()})
    except RecipeError as exc:
        raise BuildError(str(exc)) from None


# ------------------------------------------------------------------------------------ nucleus checks


@dataclass(frozen=True)
class RecipeCheck:
    """What each nucleus would refuse in one source recipe (`edgeinfer build --check`)."""

    name: str
    version: str
    file: Path
    findings: dict[str, list[Finding]]  # nucleus ("classic", "lite") → findings, in file order

    @property
    def ok(self) -> bool:
        return not any(self.findings.values())


def check_recipes(root: Path, nuclei: Sequence[str] = NUCLEI) -> list[RecipeCheck]:
    """Every recipe of `<root>/recipes/` against each nucleus (`edgeinfer.greengrass.nuclei`), by name."""
    try:
        sources = gg_recipe.read_sources(root / "recipes")
        return [
            RecipeCheck(name, src.version, src.file, {n: check_recipe(src, n, sources) for n in nuclei})
            for name, src in sorted(sources.items())
        ]
    except RecipeError as exc:
        raise BuildError(str(exc)) from None


def _check_built(components: Iterable[Component], nuclei: Sequence[str]) -> None:
    """The recipes as they will be written (digests, and the artifacts the build adds, such as the
    wheelhouse) against each nucleus's size budget: `check_recipes` counts the digests but cannot
    know the artifacts a build adds."""
    for comp in components:
        built = gg_recipe.RecipeSource(
            comp.recipe_file, comp.built_recipe(), comp.name, comp.version, tuple(comp.dependencies)
        )
        for nucleus in nuclei:
            for finding in check_subobject_budget(built, nucleus):
                raise BuildError(f"{finding} (the recipe as built, with its artifacts)")


# ---------------------------------------------------------------------------------------------- GDK


@dataclass(frozen=True)
class GdkProject:
    """A GDK component folder as the GDK CLI (v1.6.2) reads it.

    `GDKProject` takes the first component of gdk-config.json and exactly one of `recipe.json` /
    `recipe.yaml` in the folder, resolved (a symlink becomes its target). `gdk component publish`
    then reads `greengrass-build/recipes/<that resolved file's name>`, uploads
    `greengrass-build/artifacts/<component>/<version>/*` and writes
    `greengrass-build/recipes/<component>-<version>.<ext>`: a custom build must leave the first two.
    """

    folder: Path
    config_file: Path
    component: str
    version: str
    recipe_file: Path  # resolved

    @property
    def build_recipe_name(self) -> str:
        return self.recipe_file.name


def gdk_project(folder: Path) -> GdkProject:
    """The GDK project of `folder`; BuildError (one line) where GDK itself would fail."""
    config_file = folder / GDK_CONFIG
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
        component, settings = next(iter(config["component"].items()))
        version = str(settings["version"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError, StopIteration) as exc:
        raise BuildError(f"{config_file}: not a readable GDK configuration ({type(exc).__name__})") from None
    found = [folder / n for n in ("recipe.json", "recipe.yaml") if (folder / n).exists()]
    if len(found) != 1:
        what = "both recipe.json and recipe.yaml" if found else "no recipe.json or recipe.yaml"
        raise BuildError(f"{folder}: {what} (the GDK reads exactly one)")
    return GdkProject(folder, config_file, str(component), version, found[0].resolve())


def gdk_config_files(root: Path) -> list[Path]:
    """The project's GDK folders' configurations: the root's and every component folder's."""
    files = [root / GDK_CONFIG] if (root / GDK_CONFIG).is_file() else []
    return files + sorted((root / "components").glob(f"**/{GDK_CONFIG}"))


def stale_gdk_configs(root: Path, versions: Mapping[str, str]) -> list[tuple[Path, str, str]]:
    """(file, component, version written there) of each gdk-config.json entry whose version is not
    the bundle's: the GDK would publish that one."""
    stale = []
    for file in gdk_config_files(root):
        try:
            entries = json.loads(file.read_text(encoding="utf-8"))["component"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise BuildError(f"{file}: not a readable GDK configuration ({type(exc).__name__})") from None
        for name, settings in entries.items() if isinstance(entries, dict) else ():
            have = settings.get("version") if isinstance(settings, dict) else None
            if name in versions and have != versions[name]:
                stale.append((file, str(name), str(have)))
    return stale


def stamp_gdk_configs(root: Path, versions: Mapping[str, str]) -> list[Path]:
    """Write each component's version into the gdk-config.json files naming it; the changed files.

    The GDK takes the version it publishes from there, so it follows `edgeinfer.__version__` too.
    """
    changed = []
    for file in gdk_config_files(root):
        try:
            config = json.loads(file.read_text(encoding="utf-8"))
            entries = config["component"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise BuildError(f"{file}: not a readable GDK configuration ({type(exc).__name__})") from None
        dirty = False
        for name, settings in entries.items() if isinstance(entries, dict) else ():
            if name in versions and isinstance(settings, dict) and settings.get("version") != versions[name]:
                settings["version"] = versions[name]
                dirty = True
        if dirty:
            atomic_write(file, (json.dumps(config, indent=2) + "\n").encode())
            changed.append(file)
    return changed


# --------------------------------------------------------------------------------------------- files


def _write_if_changed(path: Path, data: bytes) -> bool:
    if path.is_file() and path.stat().st_size == len(data) and path.read_bytes() == data:
        return False
    atomic_write(path, data)
    return True


def _zip_wheelhouse(folder: Path) -> bytes:
    wheels = sorted(folder.glob("*.whl"))
    if not wheels:
        raise BuildError(f"wheelhouse {folder} holds no wheels")
    for wheel in wheels:
        if not zipfile.is_zipfile(wheel):
            raise BuildError(f"wheelhouse {folder}: {wheel.name} is not a valid wheel")
    with tempfile.SpooledTemporaryFile(max_size=1 << 26) as out:
        with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zf:
            for wheel in wheels:
                info = zipfile.ZipInfo(wheel.name, date_time=_EPOCH)
                info.external_attr = 0o644 << 16
                with wheel.open("rb") as src, zf.open(info, "w") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
        out.seek(0)
        return out.read()


def _check_model_store(folder: Path, listed: Iterable[str]) -> None:
    from edgeinfer.model.manifest import Manifest, ManifestError

    try:
        manifest = Manifest.load(folder)
        manifest.verify()
    except ManifestError as exc:
        raise BuildError(f"{MODEL_STORE}: {exc}") from None
    shipped = set(listed)
    needed = {"manifest.json", manifest.labels_file, *(v.file for v in manifest.variants)}
    missing = sorted(needed - shipped)
    if missing:
        raise BuildError(
            f"recipes/{MODEL_STORE}.yaml does not list {', '.join(missing)} "
            "(the model store's manifest.json needs them on the device)"
        )


# --------------------------------------------------------------------------------------------- build


def _artifacts_for(
    comp: Component, artifacts_dir: Path, wheel: tuple[str, bytes] | None, wheelhouse: Path | None
) -> list[Artifact]:
    folder = artifacts_dir / comp.name / comp.version
    listed: list[tuple[str, str]] = []
    for manifest in cget(comp.recipe, "Manifests") or []:
        for art in cget(manifest, "Artifacts") or []:
            uri = cget(art, "URI")
            if not uri:
                raise BuildError(f"{comp.recipe_file}: an artifact has no URI")
            unarchive = str(cget(art, "Unarchive") or "NONE").upper()
            name = artifact_filename(str(uri))
            if name not in {n for n, _ in listed}:
                listed.append((name, unarchive))
    if comp.name == MODEL_STORE and listed:
        _check_model_store(folder, [n for n, _ in listed])
    out: list[Artifact] = []
    for name, unarchive in listed:
        path = folder / name
        if name.startswith("edgeinfer-") and name.endswith(".whl"):
            assert wheel is not None
            if name != wheel[0]:
                raise BuildError(
                    f"{comp.recipe_file}: lists {name} but the project builds {wheel[0]} "
                    "(update the recipe's artifact URI and Install script)"
                )
            if _write_if_changed(path, wheel[1]):
                log.info("wrote %s", path)
        elif not path.is_file():
            hint = " (run 'edgeinfer model build')" if comp.name == MODEL_STORE else ""
            raise BuildError(f"{comp.recipe_file}: artifact {name} not found at {path}{hint}")
        out.append(Artifact(name, path, sha256_file(path), path.stat().st_size, unarchive))
    if wheelhouse is not None and comp.name == RUNTIME_INSTALLER:
        path = folder / WHEELHOUSE_ZIP
        if _write_if_changed(path, _zip_wheelhouse(wheelhouse)):
            log.info("wrote %s", path)
        if WHEELHOUSE_ZIP not in {a.filename for a in out}:
            out.append(Artifact(WHEELHOUSE_ZIP, path, sha256_file(path), path.stat().st_size, "ZIP"))
    return out


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


class _RecipeDumper(yaml.SafeDumper):
    """Multi-line strings (lifecycle scripts) as literal blocks, the way the sources write them."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value and not value.startswith((" ", "\n")) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_RecipeDumper.add_representer(str, _str)


def _dump_recipe(recipe: dict[str, Any]) -> bytes:
    text = yaml.dump(recipe, Dumper=_RecipeDumper, sort_keys=False, allow_unicode=True, width=100)
    return ("---\n" + text).encode()


_JUNK = frozenset({".DS_Store", "Thumbs.db"})


def _is_layout(path: Path, components: Iterable[str]) -> bool:
    """A layout this tool (or GDK) wrote for these components: `recipes/` holds only their recipe
    files (any version, or GDK's recipe.yaml) and `artifacts/` only their folders. A folder that
    merely has the same two names, e.g. a greengrass-cli local deployment, is somebody's work."""
    names = set(components)
    if {e.name for e in path.iterdir()} - _JUNK - {"artifacts", "recipes"}:
        return False
    recipes, artifacts = path / "recipes", path / "artifacts"
    for entry in recipes.iterdir() if recipes.is_dir() else ():
        ours = entry.name in ("recipe.yaml", "recipe.json") or any(
            entry.name.startswith(f"{n}-") or entry.name in (f"{n}.yaml", f"{n}.json") for n in names
        )
        if not ours and entry.name not in _JUNK:
            return False
    return all(
        entry.name in names or entry.name in _JUNK
        for entry in (artifacts.iterdir() if artifacts.is_dir() else ())
    )


def _write_layout(
    out_dir: Path, components: list[Component], recipe_names: Mapping[str, Sequence[str]]
) -> None:
    """Write greengrass-build/ beside itself, then swap it in (never a half-written layout)."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        for comp in components:
            (staging / "recipes").mkdir(parents=True, exist_ok=True)
            built = comp.built_recipe()
            for recipe_name in recipe_names[comp.name]:
                data = (
                    (json.dumps(built, indent=2) + "\n").encode()
                    if recipe_name.endswith(".json")
                    else _dump_recipe(built)
                )
                (staging / "recipes" / recipe_name).write_bytes(data)
            (staging / "artifacts" / comp.name / comp.version).mkdir(parents=True, exist_ok=True)
            for art in comp.artifacts:
                _link_or_copy(art.path, staging / "artifacts" / comp.name / comp.version / art.filename)
        old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
        if out_dir.exists():
            os.replace(out_dir, old)
        os.replace(staging, out_dir)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _gdk_target(
    gdk: str, gdk_dir: Path | None, out_dir: Path | None, project: Path, recipes: Mapping[str, Component]
) -> tuple[Path, GdkProject, bool]:
    """Where a GDK build of `gdk` writes, its GDK project, and whether that is the project's own
    whole-bundle folder (the root's GDK folder)."""
    folder = (gdk_dir or Path.cwd()).resolve()
    gp = gdk_project(folder)
    if gp.component != gdk:
        raise BuildError(f"{gp.config_file}: is the GDK folder of {gp.component}, not of {gdk}")
    if gp.version != recipes[gdk].version:
        raise BuildError(
            f"{gp.config_file}: version {gp.version}, but the bundle builds {gdk} {recipes[gdk].version} "
            "(a plain 'edgeinfer build' writes the version there)"
        )
    target = (out_dir or folder / "greengrass-build").resolve()
    return target, gp, target == (project / "greengrass-build").resolve()


def _check_sources(
    project: Path,
    recipes: Mapping[str, Component],
    wanted: set[str],
    *,
    check_schema: bool,
    nuclei: Sequence[str],
) -> None:
    """Refuse, before anything is written: an unknown component asked for, a recipe file named for
    another component, one the schema refuses, a missing edgeinfer dependency, any nucleus finding."""
    unknown = sorted(wanted - set(recipes))
    if unknown:
        raise BuildError(f"unknown component {', '.join(unknown)} (recipes: {', '.join(sorted(recipes))})")
    for comp in recipes.values():
        if comp.recipe_file.stem != comp.name:
            raise BuildError(f"{comp.recipe_file}: file name must be {comp.name}{comp.recipe_file.suffix}")
        if check_schema:
            errors = validate_recipe(comp.recipe)
            if errors:
                raise BuildError(f"{comp.recipe_file}: not a valid Greengrass recipe: {errors[0]}")
        for dep in comp.dependencies:
            if dep.startswith("com.edgeinfer.") and dep not in recipes:
                raise BuildError(f"{comp.recipe_file}: depends on {dep}, which has no recipe in recipes/")
    refused = [f for check in check_recipes(project, nuclei) for fs in check.findings.values() for f in fs]
    if refused:
        more = f"; {len(refused)} findings in all" if len(refused) > 1 else ""
        raise BuildError(f"{refused[0]}{more} ('edgeinfer build --check' lists them)")


def _layout(
    project: Path,
    recipes: Mapping[str, Component],
    wanted: set[str],
    *,
    gdk: str | None,
    gdk_dir: Path | None,
    out_dir: Path | None,
) -> tuple[Path, list[Component], dict[str, list[str]]]:
    """Where the layout goes, the components it holds in dependency order, and each one's recipe
    file names there."""
    names: dict[str, list[str]] = {}
    if gdk:
        target, gp, whole = _gdk_target(gdk, gdk_dir, out_dir, project, recipes)
        if whole:
            # The project root: `gdk component build` has just deleted the whole-bundle layout.
            # Write it back, with this component's recipe also under the name publish reads.
            wanted = set()
            names[gdk] = [f"{gdk}-{recipes[gdk].version}.yaml", gp.build_recipe_name]
        else:
            names[gdk] = [gp.build_recipe_name]
    else:
        target = (out_dir or project / "greengrass-build").resolve()
        names.update(_root_gdk_names(project, target, recipes, wanted))
    order = [n for n in dependency_order(recipes) if not wanted or n in wanted]
    components = [recipes[name] for name in order]
    for comp in components:
        names.setdefault(comp.name, [f"{comp.name}-{comp.version}.yaml"])
    return target, components, names


def _root_gdk_names(
    project: Path, target: Path, recipes: Mapping[str, Component], wanted: set[str]
) -> dict[str, list[str]]:
    """A plain build into the root's greengrass-build/ keeps the recipe of the root's GDK component
    under the name `gdk component publish` reads there (the recipe.yaml link's target's file name),
    so a bare publish after it finds its component built, as after `gdk component build`."""
    if target != (project / "greengrass-build").resolve() or not (project / GDK_CONFIG).is_file():
        return {}
    gp = gdk_project(project)
    comp = recipes.get(gp.component)
    if comp is None or (wanted and comp.name not in wanted):
        return {}
    return {comp.name: list(dict.fromkeys([f"{comp.name}-{comp.version}.yaml", gp.build_recipe_name]))}


def _needs_wheel(components: Sequence[Component]) -> bool:
    """Whether a recipe ships the device wheel (an artifact named edgeinfer-*)."""
    return any(
        artifact_filename(str(cget(a, "URI") or "")).startswith("edgeinfer-")
        for comp in components
        for m in (cget(comp.recipe, "Manifests") or [])
        for a in (cget(m, "Artifacts") or [])
    )


def _write(
    project: Path,
    recipes: Mapping[str, Component],
    target: Path,
    components: list[Component],
    names: Mapping[str, Sequence[str]],
    *,
    artifacts: Path,
    wheelhouse: Path | None,
    stamp_gdk: bool,
    nuclei: Sequence[str] = NUCLEI,
) -> None:
    """The artifacts, then the layout (refused where a nucleus would refuse a recipe as built); with
    `stamp_gdk`, the bundle's version into every GDK config."""
    written = artifacts
    try:  # an OSError here: an output folder that cannot be created or written
        check_replaceable(
            target,
            "a bundle layout of this project's components",
            lambda p: _is_layout(p, recipes),
        )
        wheel = build_wheel(project) if _needs_wheel(components) else None
        for comp in components:
            comp.artifacts = _artifacts_for(comp, artifacts, wheel, wheelhouse)
        _check_built(components, nuclei)
        written = target
        with new_parents(target):
            _write_layout(target, components, names)
        if stamp_gdk:  # the GDK publishes the version its gdk-config.json names: the bundle's
            versions = {c.name: c.version for c in recipes.values()}
            for file in stamp_gdk_configs(project, versions):
                log.warning("%s: version set to %s", file, ", ".join(sorted(set(versions.values()))))
    except OSError as exc:
        raise BuildError(f"cannot write {written}: {exc.strerror or exc}") from None
    except BuildError:
        raise
    except EdgeinferError as exc:  # the output folder's checks: the bundle's own error type
        raise BuildError(str(exc)) from None


def build_bundle(
    root: Path | None = None,
    *,
    artifacts_dir: Path | None = None,
    out_dir: Path | None = None,
    only: Iterable[str] | None = None,
    gdk: str | None = None,
    gdk_dir: Path | None = None,
    wheelhouse: Path | None = None,
    check_schema: bool = True,
    nuclei: Sequence[str] = NUCLEI,
) -> Bundle:
    """Build every component (or `only` those / the `gdk` one) and return what was built.

    `gdk` names the component of a GDK folder (`gdk_dir`, default the current folder: its
    gdk-config.json and recipe.yaml); `nuclei` those the recipes must run on: a finding of
    `check_recipes` is a BuildError (the first one, and how many) before anything is written.
    """
    project = find_project(root) if root is None or not (root / "recipes").is_dir() else root.resolve()
    artifacts = (artifacts_dir or project / "artifacts").resolve()
    recipes = load_recipes(project)
    wanted = set(only or ()) | ({gdk} if gdk else set())
    _check_sources(project, recipes, wanted, check_schema=check_schema, nuclei=nuclei)
    target, components, names = _layout(project, recipes, wanted, gdk=gdk, gdk_dir=gdk_dir, out_dir=out_dir)
    if wheelhouse is not None and not wheelhouse.is_dir():
        raise BuildError(f"wheelhouse {wheelhouse} is not a folder")
    _write(
        project,
        recipes,
        target,
        components,
        names,
        artifacts=artifacts,
        wheelhouse=wheelhouse,
        stamp_gdk=not gdk,
        nuclei=nuclei,
    )
    return Bundle(root=project, artifacts_dir=artifacts, out_dir=target, components=components)
