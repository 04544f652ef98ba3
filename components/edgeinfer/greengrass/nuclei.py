"""The two Greengrass nuclei as a component sees them, and what each would refuse in a recipe.

Since 2.14 two device runtimes run Greengrass components: the classic Java nucleus
(`aws.greengrass.Nucleus`) and nucleus lite (`aws.greengrass.NucleusLite`, C, systemd). They run the
same recipes only where a recipe keeps to what both accept. `NucleusProfile` holds each one's
observable differences (measured against nucleus lite, read from the classic nucleus's source), the
simulated core (`edgeinfer.sim`, `--nucleus classic|lite`) reproduces them, and `check_recipe` says,
with the line and the reason, what a nucleus would refuse or run differently.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from edgeinfer.greengrass.recipe import (
    MISSING,
    STEPS,
    Reader,
    RecipeError,
    RecipeSource,
    cget,
    config_text,
    pointer_get,
    pointer_parts,
    read_recipe,
)

__all__ = [
    "CLASSIC",
    "LITE",
    "NUCLEI",
    "NUCLEUS_OWNED_OPERATIONS",
    "Finding",
    "NucleusProfile",
    "check_recipe",
    "profile",
]

# Operations the classic nucleus serves itself (not through a plugin component).
NUCLEUS_OWNED_OPERATIONS = frozenset(
    {
        "SubscribeToComponentUpdates",
        "DeferComponentUpdate",
        "PauseComponent",
        "ResumeComponent",
        "PutComponentMetric",
        "ValidateAuthorizationToken",
    }
)
VALIDATION_OPERATIONS = frozenset(
    {"SubscribeToValidateConfigurationUpdates", "SendConfigurationValidityReport"}
)


@dataclass(frozen=True)
class NucleusProfile:
    """One nucleus's observable behaviour towards components (DESIGN: "What the real nuclei do")."""

    name: Literal["classic", "lite"]
    component_name: str  # the nucleus's own component name
    runtime: str  # the value a manifest's Platform.runtime names it by
    # recipe acceptance
    platform_runtime_required: bool  # a manifest without Platform.runtime "*" or `runtime` is skipped
    lifecycle_keys_lower_case_only: bool  # `Install:` is not seen, only `install:`
    artifacts_only_supported: bool  # a component with no lifecycle step reaches FINISHED
    hard_dependency_needs_running_unit: bool  # HARD on an install-only component: never starts
    platform_regex: bool  # `/regex/` platform values
    component_types: frozenset[str]
    steps: frozenset[str]  # lifecycle steps that are run
    # variables
    interpolation: Literal["json", "escaped-json-strings"]  # how a list/map {configuration:/x} reads
    missing_configuration_fails: bool  # a missing {configuration:/x}: the step fails (else left as is)
    cross_component_variables: bool  # {Other.Component:artifacts:path}
    trailing_slash_paths: bool  # {work:path}, {artifacts:path} end in "/"
    # every "{" of a script starts a variable: one that is none (shell ${X}, JSON) fails the step
    script_braces_are_variables: bool
    # Setenv, Script, Timeout, RequiresPrivilege read only as spelled so
    step_keys_case_sensitive: bool
    # configuration
    default_scalars_as_strings: bool  # YAML DefaultConfiguration scalars stored as strings
    update_leaf: Literal["merge-into-parent", "replace"]  # UpdateConfiguration whose keyPath is a leaf
    update_events: Literal["per-node", "per-leaf"]  # configuration-update events of one merge
    # IPC
    refused_operations: frozenset[str]  # answered ServiceError although in the model
    empty_error_messages: frozenset[str]  # modeled errors sent with an empty message
    # processes
    component_user: str  # "user" or "user:group"
    env_socket_variable: bool  # AWS_GG_NUCLEUS_DOMAIN_SOCKET_FILEPATH besides ..._FOR_COMPONENT
    env_ca_bundle: bool  # AWS_CA_BUNDLE
    # IoT Core
    mqtt_max_message_bytes: int  # PublishToIoTCore above this: ServiceError before the network
    max_in_flight_publishes: int | None  # QoS 1 publishes in flight (None: no limit modeled)
    spooler_bytes: int | None  # queued publishes beyond the in-flight ones (None: no spooler)

    @property
    def user_and_group(self) -> tuple[str, str]:
        user, _, group = self.component_user.partition(":")
        return user, group or user


CLASSIC = NucleusProfile(
    name="classic",
    component_name="aws.greengrass.Nucleus",
    runtime="aws_nucleus_classic",
    platform_runtime_required=False,
    lifecycle_keys_lower_case_only=False,
    artifacts_only_supported=True,
    hard_dependency_needs_running_unit=False,
    platform_regex=True,
    component_types=frozenset({"aws.greengrass.generic", "aws.greengrass.plugin", "aws.greengrass.nucleus"}),
    steps=frozenset(STEPS),
    interpolation="json",
    missing_configuration_fails=False,
    cross_component_variables=True,
    trailing_slash_paths=False,
    script_braces_are_variables=False,
    step_keys_case_sensitive=False,
    default_scalars_as_strings=False,
    update_leaf="merge-into-parent",
    update_events="per-node",
    refused_operations=frozenset(),
    empty_error_messages=frozenset(),
    component_user="ggc_user:ggc_group",
    env_socket_variable=True,
    env_ca_bundle=True,
    mqtt_max_message_bytes=131072,
    max_in_flight_publishes=5,
    spooler_bytes=2_621_440,  # mqtt.spooler.maxSizeInBytes: 2.5 MiB
)

LITE = NucleusProfile(
    name="lite",
    component_name="aws.greengrass.NucleusLite",
    runtime="aws_nucleus_lite",
    platform_runtime_required=True,
    lifecycle_keys_lower_case_only=True,
    artifacts_only_supported=False,
    hard_dependency_needs_running_unit=True,
    platform_regex=False,
    component_types=frozenset({"aws.greengrass.generic"}),
    steps=frozenset({"setenv", "bootstrap", "install", "startup", "run"}),
    interpolation="escaped-json-strings",
    missing_configuration_fails=True,
    cross_component_variables=False,
    trailing_slash_paths=True,
    script_braces_are_variables=True,  # recipe-runner's handle_escape / substitute_escape
    step_keys_case_sensitive=True,  # ggl-recipe's fetch_script_section, recipe-runner's Setenv
    default_scalars_as_strings=True,
    update_leaf="replace",
    update_events="per-leaf",
    refused_operations=VALIDATION_OPERATIONS | (NUCLEUS_OWNED_OPERATIONS - {"ValidateAuthorizationToken"}),
    empty_error_messages=frozenset({"UnauthorizedError", "ResourceNotFoundError"}),
    component_user="gg_component",
    env_socket_variable=False,
    env_ca_bundle=False,
    mqtt_max_message_bytes=131072,
    max_in_flight_publishes=None,
    spooler_bytes=None,
)

NUCLEI: dict[str, NucleusProfile] = {"classic": CLASSIC, "lite": LITE}


def profile(nucleus: str | NucleusProfile) -> NucleusProfile:
    """The profile named `classic` or `lite` (a profile passes through); RecipeError otherwise."""
    if isinstance(nucleus, NucleusProfile):
        return nucleus
    try:
        return NUCLEI[nucleus]
    except KeyError:
        raise RecipeError(f"unknown nucleus {nucleus!r} (classic or lite)") from None


def reader(nucleus: NucleusProfile) -> Reader:
    """How `nucleus` reads recipes (for `edgeinfer.greengrass.recipe.load_recipes`)."""
    if nucleus is CLASSIC or not nucleus.platform_runtime_required:
        return Reader(
            lower_case_steps_only=nucleus.lifecycle_keys_lower_case_only,
            platform_regex=nucleus.platform_regex,
        )
    return Reader(
        platform_regex=nucleus.platform_regex,
        manifest_filter=lambda platform: manifest_selectable(platform, nucleus),
        skipped_reason=(
            f"No lifecycle was found for linux: nucleus {nucleus.name} reads only manifests whose "
            f'Platform.runtime is "*" or "{nucleus.runtime}"'
        ),
        lower_case_steps_only=nucleus.lifecycle_keys_lower_case_only,
    )


def var_context_options(nucleus: NucleusProfile) -> dict[str, Any]:
    """The `VarContext` fields in which `nucleus` resolves recipe variables its own way."""
    return {
        "structured": nucleus.interpolation,
        "missing_configuration": "fail" if nucleus.missing_configuration_fails else "keep",
        "cross_component": nucleus.cross_component_variables,
    }


def typed_defaults(value: Any, nucleus: NucleusProfile) -> Any:
    """DefaultConfiguration as `nucleus` stores it: lite keeps every YAML scalar as a string."""
    if not nucleus.default_scalars_as_strings:
        return value
    if isinstance(value, dict):
        return {k: typed_defaults(v, nucleus) for k, v in value.items()}
    if isinstance(value, list):
        return [typed_defaults(v, nucleus) for v in value]
    return value if value is None or isinstance(value, str) else config_text(value)


def manifest_selectable(platform_spec: Any, nucleus: NucleusProfile) -> bool:
    """Whether the nucleus considers a manifest at all, by its `Platform.runtime` (classic ignores it)."""
    if not nucleus.platform_runtime_required:
        return True
    runtime = cget(platform_spec, "runtime") if isinstance(platform_spec, Mapping) else None
    return runtime is not None and str(runtime) in ("*", nucleus.runtime)


# ------------------------------------------------------------------------------------------ findings


@dataclass(frozen=True)
class Finding:
    """What one nucleus would refuse (or run differently) in one recipe, at one place."""

    file: Path
    line: int  # 1-based; 0 when the place is not in the file (e.g. a missing key)
    field: str  # e.g. "Manifests[0].Lifecycle.Install"
    reason: str
    nucleus: str  # "classic" or "lite"

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else str(self.file)
        return f"{where}: {self.field}: {self.reason} (nucleus {self.nucleus})"


_Path = tuple[str | int, ...]


def _field(path: _Path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _lines(file: Path) -> dict[_Path, int]:
    """Line of every key and list item of a YAML/JSON recipe; empty when it cannot be composed."""
    try:
        root = yaml.compose(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    lines: dict[_Path, int] = {}

    def walk(node: yaml.Node, path: _Path) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                sub = (*path, str(key_node.value))
                lines[sub] = key_node.start_mark.line + 1
                walk(value_node, sub)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                sub = (*path, i)
                lines[sub] = item.start_mark.line + 1
                walk(item, sub)

    if root is not None:
        walk(root, ())
    return lines


def _items(mapping: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(mapping, Mapping):
        for k, v in mapping.items():
            yield str(k), v


def _key(mapping: Any, name: str) -> str | None:
    """The key as written that matches `name` case-insensitively."""
    for k, _ in _items(mapping):
        if k.lower() == name.lower():
            return k
    return None


_VAR_RE = re.compile(r"\{([A-Za-z0-9_.\-]+):([^{}\s]*)\}")
_OWN_NAMESPACES = ("artifacts", "configuration", "work", "kernel", "iot")


def check_recipe(
    recipe: RecipeSource | Path,
    nucleus: NucleusProfile | str,
    bundle: Mapping[str, RecipeSource] | None = None,
) -> list[Finding]:
    """What `nucleus` would refuse, skip or run differently in `recipe`, in file order.

    `recipe` is a recipe file or a `RecipeSource` (`edgeinfer.greengrass.recipe.read_sources`);
    `nucleus` is "classic", "lite" or a `NucleusProfile`; `bundle` (name → RecipeSource, optional)
    lets checks that depend on another recipe see it (a HARD dependency on an install-only component).
    Each `Finding` carries the file, the 1-based line (0 when the place is a missing key), the field
    ("Manifests[0].Lifecycle.Install") and a one-line reason; `str(finding)` is
    "file:line: field: reason (nucleus lite)". An unreadable file raises RecipeError. This signature
    is stable: `edgeinfer build --check` is built on it.
    """
    prof = profile(nucleus)
    if isinstance(recipe, Path):
        raw, file = read_recipe(recipe), recipe
    else:
        raw, file = recipe.raw, recipe.file
    lines = _lines(file)
    found: list[tuple[_Path, str]] = []

    def add(path: _Path, reason: str) -> None:
        found.append((path, reason))

    ctype_key = _key(raw, "ComponentType")
    ctype = str(raw[ctype_key]) if ctype_key else "aws.greengrass.generic"
    if ctype not in prof.component_types:
        add((ctype_key or "ComponentType",), f"{ctype} components are not supported")

    defaults = cget(cget(raw, "ComponentConfiguration"), "DefaultConfiguration") or {}

    deps_key = _key(raw, "ComponentDependencies")
    deps = raw.get(deps_key) if deps_key else None

    man_key = _key(raw, "Manifests")
    manifests = raw.get(man_key) if man_key else None
    for i, manifest in enumerate(manifests if isinstance(manifests, list) else []):
        base: _Path = (man_key or "Manifests", i)
        plat_key = _key(manifest, "Platform")
        plat = manifest.get(plat_key) if plat_key else None
        if not manifest_selectable(plat, prof):
            add(
                (*base, plat_key) if plat_key else base,
                f'skipped: Platform has no runtime "*" or "{prof.runtime}" ("No lifecycle was found")',
            )
        if not prof.platform_regex:
            for k, v in _items(plat):
                text = str(v)
                if len(text) > 1 and text.startswith("/") and text.endswith("/"):
                    add((*base, plat_key or "Platform", k), f"regular expressions are not supported ({text})")
        lc_key = _key(manifest, "Lifecycle")
        if lc_key is None:
            continue
        lifecycle = manifest[lc_key]
        lc_path: _Path = (*base, lc_key)
        steps = {k.lower(): (k, v) for k, v in _items(lifecycle)}
        if prof.lifecycle_keys_lower_case_only:
            for k, _ in _items(lifecycle):
                if k.lower() in STEPS and k.lower() != "setenv" and k != k.lower():
                    add((*lc_path, k), f"lifecycle keys are read in lower case only: {k} is not seen")
        if prof.step_keys_case_sensitive:
            for k, v in _items(lifecycle):
                if k.lower() == "setenv" and k != "Setenv":
                    add((*lc_path, k), f"read only as Setenv: {k} is not seen")
                for sk, _ in _items(v) if k.lower() != "setenv" else ():
                    spelled = _STEP_KEYS.get(sk.lower())
                    if spelled is not None and sk != spelled:
                        add((*lc_path, k, sk), f"read only as {spelled}: {sk} is not seen")
        seen_steps = {
            k.lower()
            for k, _ in _items(lifecycle)
            if k.lower() != "setenv" and (k == k.lower() or not prof.lifecycle_keys_lower_case_only)
        }
        written_steps = set(steps) - {"setenv"}
        if not prof.artifacts_only_supported and not written_steps:
            add(
                lc_path,
                "a component without a lifecycle step is not supported: it never reaches FINISHED "
                "and the deployment reports FAILED",
            )
        for step in sorted(seen_steps - prof.steps):
            add((*lc_path, steps[step][0]), f"the {step} step is not run")
        for step, (k, value) in steps.items():
            if step == "setenv":
                continue
            if isinstance(value, Mapping) and prof.name == "lite" and _key(value, "SkipIf") is not None:
                add((*lc_path, k, str(_key(value, "SkipIf"))), "SkipIf is not supported")
            texts: list[tuple[_Path, str]] = []
            if isinstance(value, str):
                texts.append(((*lc_path, k), value))
            elif isinstance(value, Mapping):
                for sk, sv in _items(value):
                    if sk.lower() == "script":
                        texts.append(((*lc_path, k, sk), str(sv)))
            for path, text in texts:
                for m in _VAR_RE.finditer(text):
                    _check_variable(m=m, path=path, prof=prof, defaults=defaults, deps=deps, raw=raw, add=add)
                if prof.script_braces_are_variables:
                    for brace in _not_variables(text):
                        add(
                            path,
                            f"{brace}: every {{ of a script starts a recipe variable here: the step fails",
                        )

    if deps_key and isinstance(deps, Mapping) and prof.hard_dependency_needs_running_unit and bundle:
        for dep_name, spec in deps.items():
            dtype = str(cget(spec, "DependencyType", "HARD")).upper()
            other = bundle.get(str(dep_name))
            if dtype == "HARD" and other is not None and not _has_running_unit(other.raw, prof):
                add(
                    (deps_key, str(dep_name)),
                    f"HARD dependency on {dep_name}, which has no run or startup step: the dependant never "
                    "starts (systemd BindsTo=); make it SOFT",
                )

    def line_of(path: _Path) -> int:
        while path:
            if path in lines:
                return lines[path]
            path = path[:-1]
        return 0

    out = [Finding(file, line_of(p), _field(p), reason, prof.name) for p, reason in found]
    return sorted(out, key=lambda f: f.line)


_STEP_KEYS = {k.lower(): k for k in ("Script", "Setenv", "Timeout", "RequiresPrivilege", "SkipIf")}
# What nucleus lite's recipe runner substitutes (any other {type:arg} fails the step).
_LITE_VARIABLES = frozenset(
    {"kernel:rootPath", "iot:thingName", "work:path", "artifacts:path", "artifacts:decompressedPath"}
)


def _not_variables(text: str) -> list[str]:
    """The `{...}` of a script that nucleus lite cannot substitute, other than another component's
    variables (reported on their own): shell `${X}`, JSON, `{kernel:unknown}`, a `{` never closed."""
    out: list[str] = []
    i = text.find("{")
    while i >= 0:
        j = text.find("}", i + 1)
        if j < 0:
            out.append(text[i : i + 20] + ("…" if len(text) > i + 20 else ""))
            break
        inner = text[i + 1 : j]
        kind, colon, arg = inner.partition(":")
        known = inner in _LITE_VARIABLES or (kind == "configuration" and arg.startswith("/"))
        other_component = colon and "." in kind and kind not in _OWN_NAMESPACES
        if not known and not other_component:
            out.append(text[i : j + 1])
        i = text.find("{", j + 1)
    return out


def _has_running_unit(raw: Mapping[str, Any], prof: NucleusProfile) -> bool:
    for manifest in cget(raw, "Manifests") or []:
        if not manifest_selectable(cget(manifest, "Platform"), prof):
            continue
        for k, _ in _items(cget(manifest, "Lifecycle")):
            if k.lower() in ("run", "startup") and (
                k == k.lower() or not prof.lifecycle_keys_lower_case_only
            ):
                return True
    return False


def _check_variable(
    *,
    m: re.Match[str],
    path: _Path,
    prof: NucleusProfile,
    defaults: Any,
    deps: Any,
    raw: Mapping[str, Any],
    add: Any,
) -> None:
    whole, first, rest = m.group(0), m.group(1), m.group(2)
    if first in _OWN_NAMESPACES:
        if first == "configuration":
            try:
                parts = pointer_parts(rest)
            except ValueError:
                add(path, f"{whole}: not a JSON pointer")
                return
            value = pointer_get(defaults, parts)
            if value is MISSING and prof.missing_configuration_fails:
                add(path, f"{whole} is not in DefaultConfiguration: the step fails")
            elif isinstance(value, (dict, list)) and prof.interpolation == "escaped-json-strings":
                add(
                    path,
                    f"{whole} is a {'list' if isinstance(value, list) else 'map'}: it reads as JSON with "
                    "backslash-escaped quotes and every scalar a string; read it with GetConfiguration",
                )
        return
    ns = rest.partition(":")[0]
    if ns in _OWN_NAMESPACES and "." in first and first != str(cget(raw, "ComponentName", "")):
        if not prof.cross_component_variables:
            add(path, f"{whole}: variables of another component are not supported: the step fails")
        elif not (isinstance(deps, Mapping) and _key(deps, first) is not None):
            add(path, f"{whole}: {first} is not a direct dependency")
