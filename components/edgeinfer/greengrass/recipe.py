"""The Greengrass recipe model: read, validate, variables, semver, platform selection, dependency order.

One model for everything that reads a recipe: the simulated core (`edgeinfer.sim`), the bundle build
(`edgeinfer.bundle.build`) and publishing (`edgeinfer_cloud.publish`). What a particular nucleus accepts
beyond this model lives in `edgeinfer.greengrass.nuclei`.

Keys are case-insensitive (as the classic nucleus reads them); the first manifest whose `Platform`
matches this host wins (`*`, `/regex/`); `ComponentDependencies` resolve with npm-style semver ranges
(`>=1.0.0 <2.0.0`, `^1.2`, `~1.2.3`, `1.x`, `||`); recipe variables resolve against the component's
own paths and configuration and, for direct dependencies only, `{Other.Component:artifacts:path}` and
friends. Every problem is a `RecipeError` whose one line names the recipe file and the field.
"""

from __future__ import annotations

import copy
import json
import platform
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from edgeinfer.errors import EdgeinferError

STEPS = ("setenv", "bootstrap", "install", "startup", "run", "shutdown", "recover")
_STEP_NAMES = {s: s.capitalize() for s in STEPS}


class RecipeError(EdgeinferError):
    """A recipe, artifact or dependency problem: one line naming the file and the field."""


# ---------------------------------------------------------------- case-insensitive access


def cget(mapping: Any, key: str, default: Any = None) -> Any:
    """`mapping[key]` with the key matched case-insensitively (recipe keys are, in Greengrass)."""
    if not isinstance(mapping, Mapping):
        return default
    if key in mapping:
        return mapping[key]
    low = key.lower()
    for k, v in mapping.items():
        if isinstance(k, str) and k.lower() == low:
            return v
    return default


# ---------------------------------------------------------------- semver


_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$")
_PARTIAL_RE = re.compile(r"^v?(\d+|[xX*])(?:\.(\d+|[xX*]))?(?:\.(\d+|[xX*]))?(?:-([0-9A-Za-z.-]+))?$")

Version = tuple[int, int, int, tuple[Any, ...]]


def parse_version(text: str) -> Version:
    m = _VERSION_RE.match(str(text).strip())
    if not m:
        raise ValueError(f"{text!r} is not a semantic version (MAJOR.MINOR.PATCH)")
    pre: tuple[Any, ...] = ()
    if m.group(4):
        pre = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in m.group(4).split("."))
    # a release sorts after its prereleases: mark releases with a sentinel greater than any prerelease
    return (int(m.group(1)), int(m.group(2)), int(m.group(3)), pre or ((2, 0, ""),))


def _bound(text: str) -> tuple[Version, int]:
    """The lowest version a (possibly partial) version names, and how many parts were given."""
    m = _PARTIAL_RE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a version")
    parts = [m.group(1), m.group(2), m.group(3)]
    given = 0
    nums = []
    for p in parts:
        if p is None or p in "xX*":
            nums.append(0)
        else:
            nums.append(int(p))
            given += 1
        if p is None or p in "xX*":
            break
    while len(nums) < 3:
        nums.append(0)
    pre: tuple[Any, ...] = ((2, 0, ""),)
    if m.group(4) and given == 3:
        pre = parse_version(f"{nums[0]}.{nums[1]}.{nums[2]}-{m.group(4)}")[3]
    return (nums[0], nums[1], nums[2], pre), given


def _bump(v: Version, index: int) -> Version:
    nums = [v[0], v[1], v[2]]
    nums[index] += 1
    for i in range(index + 1, 3):
        nums[i] = 0
    return (nums[0], nums[1], nums[2], ((0, 0, ""),))  # lowest prerelease of the bumped version


Comparator = tuple[str, Version]


def _comparators(token: str) -> list[Comparator]:
    op_m = re.match(r"^(>=|<=|>|<|=|\^|~>?|)\s*(.*)$", token)
    assert op_m is not None
    op, rest = op_m.group(1), op_m.group(2)
    if rest in ("", "*", "x", "X"):
        return []
    low, given = _bound(rest)
    if op in ("", "="):
        if given == 3:
            return [("=", low)]
        if given == 0:
            return []
        return [(">=", low), ("<", _bump(low, given - 1))]
    if op == "^":
        if low[0] > 0 or given == 1:
            return [(">=", low), ("<", _bump(low, 0))]
        if low[1] > 0 or given == 2:
            return [(">=", low), ("<", _bump(low, 1))]
        return [(">=", low), ("<", _bump(low, 2))]
    if op.startswith("~"):
        return [(">=", low), ("<", _bump(low, 0 if given == 1 else 1))]
    if op == ">" and given < 3:
        return [(">=", _bump(low, given - 1))]
    if op == "<=" and given < 3:
        return [("<", _bump(low, given - 1))]
    return [(op, low)]


def parse_requirement(text: str) -> list[list[Comparator]]:
    """npm-style range → alternatives (OR) of comparator lists (AND). Raises ValueError."""
    alternatives: list[list[Comparator]] = []
    for alt_text in str(text).split("||"):
        alt = alt_text.strip()
        hyphen = re.match(r"^(\S+)\s+-\s+(\S+)$", alt)
        comps: list[Comparator] = []
        if hyphen:
            comps += [(">=", _bound(hyphen.group(1))[0])]
            hi, given = _bound(hyphen.group(2))
            comps += [("<=", hi)] if given == 3 else [("<", _bump(hi, given - 1))]
        else:
            tokens = re.findall(r"(?:>=|<=|>|<|=|\^|~>?)?\s*[^\s,]+", alt.replace(",", " "))
            for token in tokens:
                comps += _comparators(token.strip())
        alternatives.append(comps)
    return alternatives


def satisfies(version: str, requirement: str) -> bool:
    v = parse_version(version)
    for comps in parse_requirement(requirement):
        ok = True
        for op, bound in comps:
            if not {
                "=": v == bound,
                ">": v > bound,
                ">=": v >= bound,
                "<": v < bound,
                "<=": v <= bound,
            }[op]:
                ok = False
                break
        if ok:
            return True
    return False


# ---------------------------------------------------------------- platform


def host_platform() -> dict[str, str]:
    machine = platform.machine().lower()
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "aarch64", "arm64": "aarch64"}.get(machine)
    if arch is None:
        arch = "arm" if machine.startswith("arm") else ("x86" if machine in ("i386", "i686") else machine)
    system = platform.system().lower()
    return {"os": {"darwin": "darwin", "windows": "windows"}.get(system, "linux"), "architecture": arch}


def platform_matches(spec: Any, host: Mapping[str, str], regex: bool = True) -> bool:
    """Whether a manifest's `Platform` admits this host (`*`/`all`; `/regex/` values where `regex`)."""
    if not spec:
        return True
    if not isinstance(spec, Mapping):
        return False
    for key, want_value in spec.items():
        want = str(want_value)
        if str(key).lower() == "runtime":
            continue  # which nucleus a manifest is for: `ManifestFilter` decides that
        if want in ("*", "all"):
            continue
        have = cget(host, str(key))
        if have is None:
            return False
        if regex and len(want) > 1 and want.startswith("/") and want.endswith("/"):
            if not re.fullmatch(want[1:-1], have):
                return False
        elif want.lower() != str(have).lower():
            return False
    return True


# ---------------------------------------------------------------- recipes


@dataclass(frozen=True)
class Dependency:
    name: str
    requirement: str
    hard: bool


@dataclass(frozen=True)
class Artifact:
    uri: str
    filename: str
    unarchive: str  # "NONE" or "ZIP"
    field: str


@dataclass
class Recipe:
    name: str
    version: str
    file: Path
    dependencies: dict[str, Dependency]
    default_config: dict[str, Any]
    lifecycle: dict[str, Any]  # lower-case step name → str | dict (keys as written)
    artifacts: list[Artifact]
    manifest_field: str  # e.g. "Manifests[0]"
    component_type: str = "aws.greengrass.generic"
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def access_control(self) -> dict[str, Any]:
        ac = cget(self.default_config, "accessControl", {})
        return ac if isinstance(ac, dict) else {}

    def where(self, field_name: str) -> str:
        return f"{self.file}: {field_name}"


def _fail(path: Path, field_name: str, problem: str) -> RecipeError:
    return RecipeError(f"{path}: {field_name}: {problem}")


RECIPE_SUFFIXES = (".yaml", ".yml", ".json")


def recipe_files(recipes_dir: Path) -> list[Path]:
    """The recipe files of a folder (`*.yaml`, `*.yml`, `*.json`), sorted; RecipeError when none."""
    recipes_dir = Path(recipes_dir)
    if not recipes_dir.is_dir():
        raise RecipeError(f"{recipes_dir}: recipe folder not found")
    files = sorted(p for p in recipes_dir.iterdir() if p.suffix.lower() in RECIPE_SUFFIXES)
    if not files:
        raise RecipeError(f"{recipes_dir}: no recipes in this folder (*.yaml, *.yml or *.json)")
    return files


# This project's recipes name their own version (ComponentVersion, dependency ranges, wheel file
# names) by this placeholder, so that a version bump is one edit of `edgeinfer.__version__`. Every
# reader of a recipe (the simulated core, the bundle build, publishing, the nucleus checks) sees it
# replaced; the recipes `edgeinfer build` writes carry the version itself.
VERSION_PLACEHOLDER = "{edgeinfer:version}"


def stamp_version(text: str, version: str | None = None) -> str:
    """`text` with every VERSION_PLACEHOLDER replaced by `version` (default `edgeinfer.__version__`)."""
    if VERSION_PLACEHOLDER not in text:
        return text
    if version is None:
        from edgeinfer import __version__

        version = __version__
    return text.replace(VERSION_PLACEHOLDER, version)


def read_recipe(path: Path) -> dict[str, Any]:
    """A recipe file's top-level mapping as written (JSON by suffix, else YAML), nothing checked
    beyond that but VERSION_PLACEHOLDER stamped; RecipeError naming the file when it cannot be read
    or is not a mapping."""
    try:
        text = stamp_version(path.read_text(encoding="utf-8"))
        raw = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, yaml.YAMLError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RecipeError(f"{path}: not a readable recipe: {first}") from exc
    if not isinstance(raw, dict):
        raise RecipeError(f"{path}: not a recipe (expected a mapping at the top level)")
    return raw


_SCHEME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def artifact_filename(uri: str) -> str:
    """The file name an artifact URI names: its last path segment, without the scheme
    (`s3://b/k/model.onnx`, `file:model.onnx` and `file:///abs/model.onnx` all name model.onnx)."""
    text = str(uri).rstrip("/")
    m = _SCHEME_RE.match(text)
    if m:
        text = text[m.end() :]
    return text.rsplit("/", 1)[-1]


def artifact_local_path(uri: str) -> Path | None:
    """The absolute path a `file:` URI names (`file:///abs/x`, `file:/abs/x`), else None."""
    text = str(uri)
    if not text.lower().startswith("file:"):
        return None
    rest = text[5:]
    if rest.startswith("//"):
        rest = rest[2:]
        rest = rest[rest.index("/") :] if "/" in rest else ""
    return Path(rest) if rest.startswith("/") else None


@dataclass(frozen=True)
class RecipeSource:
    """A recipe file as written (every manifest, any platform): what a build or publish works on."""

    file: Path
    raw: dict[str, Any]
    name: str
    version: str
    dependencies: tuple[str, ...]


def read_sources(recipes_dir: Path) -> dict[str, RecipeSource]:
    """The recipes of a folder as written, one per component name: name → RecipeSource.

    RecipeError (one line naming the file) when a file cannot be read, lacks its name or version, or
    names a component another file already defines.
    """
    sources: dict[str, RecipeSource] = {}
    for path in recipe_files(recipes_dir):
        raw = read_recipe(path)
        name, version = cget(raw, "ComponentName"), cget(raw, "ComponentVersion")
        if not name or not version:
            raise RecipeError(f"{path}: ComponentName and ComponentVersion are required")
        if str(name) in sources:
            raise RecipeError(f"{path}: {name} is also defined in {sources[str(name)].file}")
        deps = cget(raw, "ComponentDependencies") or {}
        names = tuple(str(d) for d in deps) if isinstance(deps, Mapping) else ()
        sources[str(name)] = RecipeSource(path, raw, str(name), str(version), names)
    return sources


class DependencyCycleError(RecipeError):
    """Components that depend on each other in a circle; `cycle` lists them, first one repeated last."""

    def __init__(self, cycle: list[str]) -> None:
        super().__init__("dependency cycle: " + " -> ".join(cycle))
        self.cycle = cycle


def dependency_order(dependencies: Mapping[str, Iterable[str]]) -> list[str]:
    """Names with every dependency before its dependants; alphabetical where the order is free.

    `dependencies` maps each component to the names it depends on; names outside the mapping are
    ignored (a dependency provided elsewhere). DependencyCycleError when they form a circle.
    """
    order: list[str] = []
    state: dict[str, int] = {}

    def visit(name: str, chain: tuple[str, ...]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            raise DependencyCycleError([*chain[chain.index(name) :], name])
        state[name] = 1
        for dep in sorted(dependencies[name]):
            if dep in dependencies:
                visit(dep, (*chain, name))
        state[name] = 2
        order.append(name)

    for name in sorted(dependencies):
        visit(name, ())
    return order


@dataclass(frozen=True)
class Reader:
    """How a nucleus reads recipes beyond the model: which manifests it considers at all and
    whether it sees lifecycle keys in any case (classic) or only in lower case (nucleus lite)."""

    manifest_filter: Callable[[Any], bool] | None = None  # Platform mapping → considered
    skipped_reason: str = ""  # said when manifests exist but the filter leaves none
    lower_case_steps_only: bool = False
    platform_regex: bool = True  # `/regex/` platform values (nucleus lite compares them literally)


CLASSIC_READER = Reader()


def load_recipe_file(
    path: Path, host: Mapping[str, str] | None = None, reader: Reader = CLASSIC_READER
) -> Recipe:
    """One recipe file as `reader`'s nucleus runs it on `host` (default: this machine).

    Each field is read by its own function below, in the order they are checked, so that the first
    problem found is the one a reader of the file would meet first; RecipeError names the field.
    """
    host = host or host_platform()
    raw = read_recipe(path)
    name, version = _identity(path, raw)
    ctype = _component_type(path, raw)
    deps = _dependencies(path, raw)
    default_cfg = _default_configuration(path, raw)
    chosen, mfield = _chosen_manifest(path, raw, host, reader)
    lifecycle = _lifecycle(path, raw, chosen, mfield, reader)
    artifacts = _artifacts(path, chosen, mfield)
    return Recipe(
        name=name,
        version=version,
        file=path,
        dependencies=deps,
        default_config=copy.deepcopy(default_cfg),
        lifecycle=lifecycle,
        artifacts=artifacts,
        manifest_field=mfield,
        component_type=ctype,
        raw=raw,
    )


_REQUIRED_FIELDS = ("RecipeFormatVersion", "ComponentName", "ComponentVersion")
_COMPONENT_TYPES = ("aws.greengrass.generic", "aws.greengrass.plugin", "aws.greengrass.nucleus")


def _identity(path: Path, raw: Mapping[str, Any]) -> tuple[str, str]:
    """ComponentName and ComponentVersion (a semantic version), RecipeFormatVersion present."""
    for key in _REQUIRED_FIELDS:
        if cget(raw, key) in (None, ""):
            raise _fail(path, key, "required field is missing")
    version = str(cget(raw, "ComponentVersion"))
    try:
        parse_version(version)
    except ValueError as exc:
        raise _fail(path, "ComponentVersion", str(exc)) from exc
    return str(cget(raw, "ComponentName")), version


def _component_type(path: Path, raw: Mapping[str, Any]) -> str:
    ctype = str(cget(raw, "ComponentType", "aws.greengrass.generic"))
    if ctype not in _COMPONENT_TYPES:
        raise _fail(path, "ComponentType", f"{ctype} is not a supported component type")
    return ctype


def _dependencies(path: Path, raw: Mapping[str, Any]) -> dict[str, Dependency]:
    raw_deps = cget(raw, "ComponentDependencies") or {}
    if not isinstance(raw_deps, dict):
        raise _fail(path, "ComponentDependencies", "must be a mapping of component name to requirement")
    return {str(name): _dependency(path, str(name), spec) for name, spec in raw_deps.items()}


def _dependency(path: Path, name: str, spec_value: Any) -> Dependency:
    fld = f"ComponentDependencies.{name}"
    spec = spec_value or {}
    if not isinstance(spec, dict):
        raise _fail(path, fld, "must be a mapping with VersionRequirement and DependencyType")
    req = str(cget(spec, "VersionRequirement", "*"))
    try:
        parse_requirement(req)
    except ValueError as exc:
        raise _fail(path, f"{fld}.VersionRequirement", str(exc)) from exc
    dtype = str(cget(spec, "DependencyType", "HARD")).upper()
    if dtype not in ("HARD", "SOFT"):
        raise _fail(path, f"{fld}.DependencyType", f"must be HARD or SOFT, not {dtype}")
    return Dependency(name, req, dtype == "HARD")


def _default_configuration(path: Path, raw: Mapping[str, Any]) -> dict[str, Any]:
    default_cfg = cget(cget(raw, "ComponentConfiguration") or {}, "DefaultConfiguration") or {}
    if not isinstance(default_cfg, dict):
        raise _fail(path, "ComponentConfiguration.DefaultConfiguration", "must be a mapping")
    return default_cfg


def _chosen_manifest(
    path: Path, raw: Mapping[str, Any], host: Mapping[str, str], reader: Reader
) -> tuple[dict[str, Any] | None, str]:
    """The first manifest `reader` considers whose Platform admits `host`, and its field name
    ("Manifests[1]"); (None, "Lifecycle") for a recipe without manifests."""
    manifests = cget(raw, "Manifests") or []
    if not isinstance(manifests, list):
        raise _fail(path, "Manifests", "must be a list")
    filtered = 0
    for i, manifest in enumerate(manifests):
        if not isinstance(manifest, dict):
            raise _fail(path, f"Manifests[{i}]", "must be a mapping")
        if reader.manifest_filter is not None and not reader.manifest_filter(cget(manifest, "Platform")):
            filtered += 1
            continue
        if platform_matches(cget(manifest, "Platform"), host, reader.platform_regex):
            return manifest, f"Manifests[{i}]"
    if manifests and filtered == len(manifests) and reader.skipped_reason:
        raise _fail(path, "Manifests", reader.skipped_reason)
    if manifests:
        raise _fail(path, "Manifests", f"no manifest matches this platform {dict(host)}")
    return None, "Lifecycle"


def _lifecycle(
    path: Path, raw: Mapping[str, Any], chosen: dict[str, Any] | None, mfield: str, reader: Reader
) -> dict[str, Any]:
    """The chosen manifest's Lifecycle (else the recipe's own), lower-case step name → value."""
    lifecycle_raw = cget(chosen, "Lifecycle") if chosen is not None else None
    if lifecycle_raw is None:
        lifecycle_raw = cget(raw, "Lifecycle") or {}
    if not isinstance(lifecycle_raw, dict):
        raise _fail(path, f"{mfield}.Lifecycle", "must be a mapping")
    lifecycle: dict[str, Any] = {}
    for key, value in lifecycle_raw.items():
        low = str(key).lower()
        if reader.lower_case_steps_only and low in STEPS and low != "setenv" and str(key) != low:
            continue  # not seen by this nucleus
        _check_step(path, f"{mfield}.Lifecycle.{key}", low, value)
        lifecycle[low] = value
    if "startup" in lifecycle and "run" in lifecycle:
        raise _fail(path, f"{mfield}.Lifecycle", "Startup and Run cannot both be set")
    return lifecycle


def _check_step(path: Path, fld: str, low: str, value: Any) -> None:
    """One lifecycle step: a known step, a script or a mapping with Script (Setenv: anything)."""
    if low not in STEPS:
        raise _fail(path, fld, f"unknown lifecycle step (one of {', '.join(_STEP_NAMES.values())})")
    if low == "setenv":
        return
    if not isinstance(value, (str, dict)):
        raise _fail(path, fld, "must be a script or a mapping with Script")
    if isinstance(value, dict) and cget(value, "Script") is None:
        raise _fail(path, f"{fld}.Script", "required field is missing")


def _artifacts(path: Path, chosen: dict[str, Any] | None, mfield: str) -> list[Artifact]:
    """The chosen manifest's Artifacts: each with a URI, unarchived NONE or ZIP."""
    artifacts: list[Artifact] = []
    for j, art in enumerate((cget(chosen, "Artifacts") if chosen else None) or []):
        fld = f"{mfield}.Artifacts[{j}]"
        uri = cget(art, "URI") or cget(art, "Uri")
        if not uri:
            raise _fail(path, f"{fld}.URI", "required field is missing")
        unarchive = str(cget(art, "Unarchive", "NONE")).upper()
        if unarchive not in ("NONE", "ZIP"):
            raise _fail(path, f"{fld}.Unarchive", f"must be NONE or ZIP, not {unarchive}")
        artifacts.append(Artifact(str(uri), artifact_filename(uri), unarchive, f"{fld}.URI"))
    return artifacts


def load_recipes(
    recipes_dir: Path, host: Mapping[str, str] | None = None, reader: Reader = CLASSIC_READER
) -> dict[str, dict[str, Recipe]]:
    """All recipes in a folder: name → version → Recipe, taken as the classic nucleus takes a local
    deployment's recipe folder (greengrass-cli's `--recipeDir`).

    The classic nucleus's `DeploymentService.copyRecipesToComponentStore` walks the folder
    (`Files.walk`) and `copyRecipeFileToComponentStore` parses each file and writes it back with
    `ComponentStore.savePackageRecipe` under its name and version, overwriting what an earlier file of
    that name and version wrote. So two files holding the same recipe are one recipe (GDK's
    `greengrass-build/recipes` holds the recipe it was built from beside its own `Name-Version.yaml`).
    Two that differ are refused, naming both: which one the nucleus keeps is whichever its walk meets
    last, and `Files.walk` lists a folder in the file system's order, not one a recipe author can rely on.
    """
    index: dict[str, dict[str, Recipe]] = {}
    for path in recipe_files(recipes_dir):
        recipe = load_recipe_file(path, host, reader)
        other = index.get(recipe.name, {}).get(recipe.version)
        if other is not None and other.raw != recipe.raw:
            raise _fail(
                path,
                "ComponentVersion",
                f"{recipe.name} {recipe.version} is also defined in {other.file}, differently: a nucleus "
                "keeps whichever of the two it reads last, in an order the file system decides",
            )
        if other is None:
            index.setdefault(recipe.name, {})[recipe.version] = recipe
    return index


# Components the nucleus itself provides: a dependency on one resolves with no recipe in the folder.
# The classic nucleus's cloud deployment resolves them as AWS-provided components (the nucleus is one,
# the token exchange service runs inside it); nucleus lite serves the token exchange service itself
# (tesd) and sets its dependants' AWS_CONTAINER_CREDENTIALS_FULL_URI, as the simulator does
# (`edgeinfer.sim.tes`).
PROVIDED_BY_NUCLEUS = frozenset(
    {"aws.greengrass.Nucleus", "aws.greengrass.NucleusLite", "aws.greengrass.TokenExchangeService"}
)


def resolve(index: Mapping[str, Mapping[str, Recipe]], targets: Iterable[str] | None = None) -> list[Recipe]:
    """Pick one version of each target and of everything it depends on; return them in start order.

    A target is `Name` or `Name=Version`. A dependency on a component in `PROVIDED_BY_NUCLEUS` that the
    folder has no recipe for is taken as provided (not in the result). Missing components,
    unsatisfiable ranges and cycles raise `RecipeError` naming the recipe that asked and the field.
    """
    pinned: dict[str, str] = {}
    wanted: list[str] = []
    for target in targets if targets is not None else sorted(index):
        name, _, version = target.partition("=")
        if name not in index:
            raise RecipeError(f"component {name} not found: no recipe for it in the recipe folder")
        if version:
            if version not in index[name]:
                raise RecipeError(f"component {name} {version} not found: have {', '.join(index[name])}")
            pinned[name] = version
        wanted.append(name)

    # requirements[name] = [(requirement, asking recipe)]
    requirements: dict[str, list[tuple[str, Recipe]]] = {}
    chosen: dict[str, Recipe] = {}
    for _ in range(50):
        changed = False
        queue = list(wanted)
        seen: set[str] = set()
        new_chosen: dict[str, Recipe] = {}
        new_reqs: dict[str, list[tuple[str, Recipe]]] = {}
        while queue:
            name = queue.pop(0)
            if name in seen:
                continue
            seen.add(name)
            reqs = requirements.get(name, [])
            candidates = [pinned[name]] if name in pinned else list(index[name])
            ok = [v for v in candidates if all(satisfies(v, r) for r, _ in reqs)]
            if not ok:
                req, asker = next(
                    ((r, a) for r, a in reqs if not any(satisfies(v, r) for v in candidates)), reqs[-1]
                )
                raise _fail(
                    asker.file,
                    f"ComponentDependencies.{name}.VersionRequirement",
                    f"no version of {name} satisfies {req!r} (available: {', '.join(sorted(index[name]))})",
                )
            recipe = index[name][max(ok, key=parse_version)]
            new_chosen[name] = recipe
            for dep in recipe.dependencies.values():
                if dep.name not in index and dep.name in PROVIDED_BY_NUCLEUS:
                    continue  # the nucleus's own: nothing to deploy, whichever version it runs
                if dep.name not in index:
                    raise _fail(
                        recipe.file,
                        f"ComponentDependencies.{dep.name}",
                        f"unknown dependency: no recipe for {dep.name} in the recipe folder",
                    )
                new_reqs.setdefault(dep.name, []).append((dep.requirement, recipe))
                queue.append(dep.name)
        if {k: v.version for k, v in new_chosen.items()} != {k: v.version for k, v in chosen.items()}:
            changed = True
        chosen = new_chosen
        if new_reqs != requirements:
            changed = True
            requirements = new_reqs
        if not changed:
            break

    try:
        names = dependency_order({name: list(recipe.dependencies) for name, recipe in chosen.items()})
    except DependencyCycleError as exc:
        first = chosen[exc.cycle[0]]
        raise _fail(first.file, f"ComponentDependencies.{exc.cycle[1]}", str(exc)) from None
    return [chosen[name] for name in names]


# ---------------------------------------------------------------- configuration helpers


def deep_merge(base: Any, update: Any) -> Any:
    """Greengrass MERGE: mappings merge key by key, anything else replaces."""
    if isinstance(base, dict) and isinstance(update, dict):
        out = dict(base)
        for key, value in update.items():
            out[key] = deep_merge(base.get(key), value) if key in base else copy.deepcopy(value)
        return out
    return copy.deepcopy(update)


def pointer_parts(pointer: str) -> list[str]:
    if pointer in ("", "/"):
        return []
    if not pointer.startswith("/"):
        raise ValueError(f"{pointer!r} is not a JSON pointer (starts with /)")
    return [p.replace("~1", "/").replace("~0", "~") for p in pointer[1:].split("/")]


MISSING = object()


def pointer_get(doc: Any, parts: Iterable[str]) -> Any:
    node = doc
    for part in parts:
        if isinstance(node, dict):
            node = cget(node, part, MISSING) if part not in node else node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return MISSING
        if node is MISSING:
            return MISSING
    return node


def apply_reset(config: dict[str, Any], defaults: dict[str, Any], pointers: Iterable[str]) -> dict[str, Any]:
    """Greengrass RESET: each JSON pointer goes back to its default value (or away if it has none)."""
    config = copy.deepcopy(config)
    for pointer in pointers:
        parts = pointer_parts(pointer)
        if not parts:
            config = copy.deepcopy(defaults)
            continue
        default = pointer_get(defaults, parts)
        parent = pointer_get(config, parts[:-1])
        if not isinstance(parent, dict):
            continue
        if default is MISSING:
            parent.pop(parts[-1], None)
        else:
            parent[parts[-1]] = copy.deepcopy(default)
    return config


def config_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    if isinstance(value, float) and value.is_integer():
        return str(value)
    return str(value)


# ---------------------------------------------------------------- recipe variables

_VAR_RE = re.compile(r"\{([A-Za-z0-9_.\-]+):([^{}\s]*)\}")
_NAMESPACES = ("artifacts", "configuration", "work", "kernel", "iot")


@dataclass
class VarContext:
    """What a component's recipe variables resolve against, and how (the nuclei differ)."""

    paths: dict[
        str, dict[str, str]
    ]  # component → {"artifacts:path", "artifacts:decompressedPath", "work:path"}
    configs: Mapping[str, Mapping[str, Any]]  # component → configuration
    kernel_root: str
    thing_name: str
    structured: str = "json"  # a list/map value: "json", or "escaped-json-strings" (nucleus lite)
    missing_configuration: str = "keep"  # a missing {configuration:/x}: "keep" as written, or "fail"
    cross_component: bool = True  # {Other.Component:artifacts:path} and friends


def escaped_json(value: Any) -> str:
    """A list or map as nucleus lite writes it on a command line: compact JSON, every scalar a
    string, every quote backslash-escaped (`[{\\"archs\\":[\\"x86_64\\"]}]`)."""

    def strings(v: Any) -> Any:
        if isinstance(v, dict):
            return {str(k): strings(x) for k, x in v.items()}
        if isinstance(v, list):
            return [strings(x) for x in v]
        return v if v is None else config_text(v)

    return json.dumps(strings(value), separators=(",", ":")).replace('"', '\\"')


def interpolate(text: str, recipe: Recipe, ctx: VarContext, field_name: str) -> str:
    """Resolve recipe variables in one string. Unknown variables raise RecipeError (file and field)."""

    def sub(m: re.Match[str]) -> str:
        whole, first, rest = m.group(0), m.group(1), m.group(2)
        if first in _NAMESPACES:
            return _resolve(recipe.name, first, rest, whole, own=True)
        ns, _, key = rest.partition(":")
        if ns in _NAMESPACES and ("." in first or first in ctx.configs):
            if first != recipe.name and not ctx.cross_component:
                raise _fail(
                    recipe.file,
                    field_name,
                    f"{whole}: variables of another component are not supported by this nucleus",
                )
            if first != recipe.name and first not in recipe.dependencies:
                raise _fail(
                    recipe.file,
                    field_name,
                    f"unknown variable {whole}: {first} is not a direct dependency of {recipe.name}",
                )
            return _resolve(first, ns, key, whole, own=False)
        return whole  # not a recipe variable (e.g. shell ${VAR:-default}); Greengrass leaves it too

    def _resolve(component: str, ns: str, key: str, whole: str, own: bool) -> str:
        if ns == "configuration":
            try:
                parts = pointer_parts(key)
            except ValueError as exc:
                raise _fail(recipe.file, field_name, f"unknown variable {whole}: {exc}") from exc
            value = pointer_get(ctx.configs.get(component, {}), parts)
            if value is MISSING:
                if ctx.missing_configuration == "fail":
                    raise _fail(recipe.file, field_name, f"{whole}: no such configuration value")
                return whole
            if isinstance(value, (dict, list)) and ctx.structured == "escaped-json-strings":
                return escaped_json(value)
            return config_text(value)
        if own and ns == "kernel" and key == "rootPath":
            return ctx.kernel_root
        if own and ns == "iot" and key == "thingName":
            return ctx.thing_name
        value_s = ctx.paths.get(component, {}).get(f"{ns}:{key}")
        if value_s is None:
            raise _fail(recipe.file, field_name, f"unknown variable {whole}")
        return value_s

    return _VAR_RE.sub(sub, text)


def lifecycle_strings(recipe: Recipe) -> Iterable[tuple[str, str, str]]:
    """(step, field name, text) for every interpolated string of the lifecycle."""
    base = f"{recipe.manifest_field}.Lifecycle"
    for step, value in recipe.lifecycle.items():
        name = _STEP_NAMES[step]
        if step == "setenv":
            for k, v in (value or {}).items():
                yield step, f"{base}.Setenv.{k}", config_text(v)
            continue
        if isinstance(value, str):
            yield step, f"{base}.{name}", value
            continue
        for k, v in value.items():
            if str(k).lower() == "script":
                yield step, f"{base}.{name}.{k}", str(v)
            elif str(k).lower() == "setenv":
                for ek, ev in (v or {}).items():
                    yield step, f"{base}.{name}.Setenv.{ek}", config_text(ev)
