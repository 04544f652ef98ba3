"""The two Greengrass nuclei as a component sees them, and what each would refuse in a recipe.

Since 2.14 two device runtimes run Greengrass components: the classic Java nucleus
(`aws.greengrass.Nucleus`) and nucleus lite (`aws.greengrass.NucleusLite`, C, systemd). They run the
same recipes only where a recipe keeps to what both accept. `NucleusProfile` holds each one's
observable differences (measured against nucleus lite, read from the classic nucleus's source), the
simulated core (`edgeinfer.sim`, `--nucleus classic|lite`) reproduces them, and `check_recipe` says,
with the line and the reason, what a nucleus would refuse or run differently.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
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
    "SYSTEMD_DEFAULT_PATH",
    "Finding",
    "NucleusProfile",
    "check_deployable",
    "check_recipe",
    "check_subobject_budget",
    "object_depth",
    "profile",
    "subobject_count",
    "with_digests",
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
# What systemd gives a unit that sets no PATH (nucleus lite's components run as such units).
SYSTEMD_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


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
    refused_operations_say_why: bool  # their ServiceError has a message (lite's has none)
    empty_error_messages: frozenset[str]  # modeled errors sent with an empty message
    # an IPC message (event-stream frame) larger than this closes the component's whole connection
    ipc_max_message_bytes: int | None
    # processes
    component_user: str  # "user" or "user:group"
    env_socket_variable: bool  # AWS_GG_NUCLEUS_DOMAIN_SOCKET_FILEPATH besides ..._FOR_COMPONENT
    env_ca_bundle: bool  # AWS_CA_BUNDLE
    component_path: str | None  # PATH of every component (None: the nucleus's own)
    # IoT Core
    mqtt_max_message_bytes: int  # PublishToIoTCore above this: ServiceError before the network
    max_in_flight_publishes: int | None  # QoS 1 publishes in flight (None: no limit modeled)
    spooler_bytes: int | None  # queued publishes beyond the in-flight ones (None: no spooler)
    # the largest MQTT packet IoT Core may send the device (its CONNECT's Maximum Packet Size): the
    # broker drops larger ones silently (None: IoT Core's own limit only)
    iot_inbound_max_packet_bytes: int | None
    mqtt5_properties: bool  # content type, correlation data, response topic, user properties carried
    # deployments
    recipe_subobject_limit: int | None  # a recipe counting more sub-objects fails the deployment
    recipe_depth_limit: int | None  # a recipe nested deeper fails the deployment
    # a deployment waits this long for every component's run unit, then reports FAILED where one
    # has none (None: a component without a run step simply FINISHES)
    run_unit_wait_s: float | None
    unarchives_local_artifacts: bool  # a local deployment unpacks `Unarchive: ZIP` artifacts

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
    refused_operations_say_why=True,
    empty_error_messages=frozenset(),
    ipc_max_message_bytes=None,  # 16 MiB, not modeled
    component_user="ggc_user:ggc_group",
    env_socket_variable=True,
    env_ca_bundle=True,
    component_path=None,
    mqtt_max_message_bytes=131072,
    max_in_flight_publishes=5,
    spooler_bytes=2_621_440,  # mqtt.spooler.maxSizeInBytes: 2.5 MiB
    iot_inbound_max_packet_bytes=None,
    mqtt5_properties=True,
    recipe_subobject_limit=None,
    recipe_depth_limit=None,
    run_unit_wait_s=None,
    unarchives_local_artifacts=True,
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
    refused_operations_say_why=False,
    empty_error_messages=frozenset({"UnauthorizedError", "ResourceNotFoundError"}),
    ipc_max_message_bytes=10_000,  # GGL_IPC_MAX_MSG_LEN, GGL_COREBUS_MAX_MSG_LEN
    component_user="gg_component",
    env_socket_variable=False,
    env_ca_bundle=False,
    component_path=SYSTEMD_DEFAULT_PATH,
    mqtt_max_message_bytes=131072,
    max_in_flight_publishes=None,
    spooler_bytes=None,
    iot_inbound_max_packet_bytes=5_000,  # iotcored's IOTCORED_NETWORK_BUFFER_SIZE (compile-time)
    mqtt5_properties=False,  # ggipcd's mqttproxy passes topic, payload and QoS only
    recipe_subobject_limit=255,  # GG_MAX_OBJECT_SUBOBJECTS: each recipe is deep-copied within it
    recipe_depth_limit=15,  # GG_MAX_OBJECT_DEPTH: a scalar is depth 1, {"a": 5} depth 2
    run_unit_wait_s=300.0,  # waits for ggl.<name>.service to be RUNNING or FINISHED
    unarchives_local_artifacts=False,  # only what it downloads for a cloud deployment
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
_STEP_KEYS = {k.lower(): k for k in ("Script", "Setenv", "Timeout", "RequiresPrivilege", "SkipIf")}
# What nucleus lite's recipe runner substitutes (any other {type:arg} fails the step).
_LITE_VARIABLES = frozenset(
    {"kernel:rootPath", "iot:thingName", "work:path", "artifacts:path", "artifacts:decompressedPath"}
)

# A rule's findings: (place in the recipe, reason), in the order the rule meets them.
_Found = Iterator[tuple[_Path, str]]


@dataclass(frozen=True)
class _Subject:
    """The recipe every rule reads, and the nucleus it is read for."""

    raw: Mapping[str, Any]
    prof: NucleusProfile
    bundle: Mapping[str, RecipeSource]
    defaults: Any  # ComponentConfiguration.DefaultConfiguration
    deps_key: str | None  # ComponentDependencies as spelled
    deps: Any


@dataclass(frozen=True)
class _Manifest:
    path: _Path  # ("Manifests", i)
    platform_key: str | None  # Platform as spelled
    platform: Any


@dataclass(frozen=True)
class _Lifecycle:
    path: _Path  # ("Manifests", i, "Lifecycle")
    value: Any
    steps: dict[str, tuple[str, Any]]  # lower-case step → (key as spelled, value); the last one wins


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

    Each rule is a small function listed in RECIPE_RULES (the manifest's in MANIFEST_RULES, the
    lifecycle's in LIFECYCLE_RULES, one step's in STEP_RULES); findings on one line keep the order
    the tables give them.
    """
    return _run(RECIPE_RULES, recipe, nucleus, bundle)


def check_subobject_budget(
    recipe: RecipeSource | Path, nucleus: NucleusProfile | str = "lite"
) -> list[Finding]:
    """Whether `recipe`, as built (`with_digests`), fits the sub-objects `nucleus` copies a recipe
    into (nucleus lite: over it the whole deployment fails); a Finding with the count and the budget
    when it does not. One of RECIPE_RULES; on its own for a recipe `edgeinfer build` has written."""
    return _run((_subobject_budget,), recipe, nucleus, None)


def check_deployable(recipe: RecipeSource | Path, nucleus: NucleusProfile | str) -> list[Finding]:
    """What fails a whole deployment on `nucleus` before any component is installed (nucleus lite:
    the recipe's sub-object budget and nesting depth, at dependency resolution)."""
    return _run((_subobject_budget, _depth_limit), recipe, nucleus, None)


def _run(
    rules: Sequence[Callable[[_Subject], _Found]],
    recipe: RecipeSource | Path,
    nucleus: NucleusProfile | str,
    bundle: Mapping[str, RecipeSource] | None,
) -> list[Finding]:
    prof = profile(nucleus)
    if isinstance(recipe, Path):
        raw, file = read_recipe(recipe), recipe
    else:
        raw, file = recipe.raw, recipe.file
    deps_key = _key(raw, "ComponentDependencies")
    subject = _Subject(
        raw=raw,
        prof=prof,
        bundle=bundle or {},
        defaults=cget(cget(raw, "ComponentConfiguration"), "DefaultConfiguration") or {},
        deps_key=deps_key,
        deps=raw.get(deps_key) if deps_key else None,
    )
    found = [item for rule in rules for item in rule(subject)]
    lines = _lines(file)
    out = [Finding(file, _line_of(lines, p), _field(p), reason, prof.name) for p, reason in found]
    return sorted(out, key=lambda f: f.line)


def _line_of(lines: Mapping[_Path, int], path: _Path) -> int:
    """The line of `path`, else of the nearest enclosing place written in the file; 0 for none."""
    while path:
        if path in lines:
            return lines[path]
        path = path[:-1]
    return 0


# ------------------------------------------------------------------------------- the recipe's rules


def _component_type(s: _Subject) -> _Found:
    ctype_key = _key(s.raw, "ComponentType")
    ctype = str(s.raw[ctype_key]) if ctype_key else "aws.greengrass.generic"
    if ctype not in s.prof.component_types:
        yield (ctype_key or "ComponentType",), f"{ctype} components are not supported"


def _manifests(s: _Subject) -> _Found:
    """Every manifest through MANIFEST_RULES, and its Lifecycle (where it has one) through
    LIFECYCLE_RULES."""
    man_key = _key(s.raw, "Manifests")
    manifests = s.raw.get(man_key) if man_key else None
    for i, manifest in enumerate(manifests if isinstance(manifests, list) else []):
        plat_key = _key(manifest, "Platform")
        m = _Manifest((man_key or "Manifests", i), plat_key, manifest.get(plat_key) if plat_key else None)
        for manifest_rule in MANIFEST_RULES:
            yield from manifest_rule(s, m)
        lc_key = _key(manifest, "Lifecycle")
        if lc_key is None:
            continue
        value = manifest[lc_key]
        lc = _Lifecycle((*m.path, lc_key), value, {k.lower(): (k, v) for k, v in _items(value)})
        for lifecycle_rule in LIFECYCLE_RULES:
            yield from lifecycle_rule(s, lc)


def subobject_count(doc: Any) -> int:
    """The sub-objects nucleus lite counts in a parsed document against its budget
    (`GG_MAX_OBJECT_SUBOBJECTS`): a list counts its items, a map twice its entries (key and value),
    over every level; a scalar counts nothing.

    As aws-greengrass-component-sdk's include/gg/object.h defines the count and src/object_visit.c
    (`gg_obj_visit`) enforces it: `subobjects += list.len` for a list, `+= map.len * 2` for a map,
    failing with "Visited object's subobjects exceeds maximum" once the sum passes the budget.
    """
    if isinstance(doc, Mapping):
        return 2 * len(doc) + sum(subobject_count(v) for v in doc.values())
    if isinstance(doc, list):
        return len(doc) + sum(subobject_count(v) for v in doc)
    return 0


def object_depth(doc: Any) -> int:
    """The depth nucleus lite gives a parsed document (`GG_MAX_OBJECT_DEPTH`, component-sdk's
    include/gg/object.h): a scalar or an empty list or map is 1, `{"a": 5}` 2, `[{"a": 5}]` 3."""
    children: list[Any] = []
    if isinstance(doc, Mapping):
        children = list(doc.values())
    elif isinstance(doc, list):
        children = doc
    return 1 + max((object_depth(c) for c in children), default=0)


def with_digests(raw: Mapping[str, Any]) -> dict[str, Any]:
    """`raw` as `edgeinfer build` writes it: `Digest` and `Algorithm` on every artifact that has
    none (their values do not change the count or the depth)."""
    out: dict[str, Any] = copy.deepcopy(dict(raw))
    for manifest in cget(out, "Manifests") or []:
        for artifact in cget(manifest, "Artifacts") or [] if isinstance(manifest, Mapping) else []:
            if isinstance(artifact, dict):
                for key in ("Digest", "Algorithm"):
                    if _key(artifact, key) is None:
                        artifact[key] = ""
    return out


def _subobject_budget(s: _Subject) -> _Found:
    limit = s.prof.recipe_subobject_limit
    built = with_digests(s.raw)
    count = subobject_count(built)
    if limit is None or count <= limit:
        return
    # Named at the top-level field that holds the most, where slimming down pays most.
    key, held = max(((k, 2 + subobject_count(v)) for k, v in _items(built)), key=lambda kv: kv[1])
    yield (
        (key,),
        f"the recipe counts {count} sub-objects as built (a list item once, a map entry twice; Digest "
        f"and Algorithm on every artifact), over the {limit} this nucleus copies a recipe into: the "
        f'deployment fails ("Visited object\'s subobjects exceeds maximum"); {key} counts {held}',
    )


def _depth_limit(s: _Subject) -> _Found:
    limit = s.prof.recipe_depth_limit
    if limit is None or object_depth(s.raw) <= limit:
        return
    path: _Path = ()
    node: Any = s.raw
    while isinstance(node, (Mapping, list)) and node:  # down the deepest branch, to name its line
        pairs = list(node.items()) if isinstance(node, Mapping) else list(enumerate(node))
        step, node = max(pairs, key=lambda kv: object_depth(kv[1]))
        path = (*path, step if isinstance(step, int) else str(step))
        if len(path) >= limit:
            break
    yield (
        path,
        f"the recipe nests {object_depth(s.raw)} levels deep, over the {limit} this nucleus reads "
        '("Visited object\'s depth exceeds maximum"): the deployment fails',
    )


def _hard_dependency_on_install_only(s: _Subject) -> _Found:
    if not (s.deps_key and isinstance(s.deps, Mapping) and s.prof.hard_dependency_needs_running_unit):
        return
    for dep_name, spec in s.deps.items():
        dtype = str(cget(spec, "DependencyType", "HARD")).upper()
        other = s.bundle.get(str(dep_name))
        if dtype == "HARD" and other is not None and not _has_running_unit(other.raw, s.prof):
            yield (
                (s.deps_key, str(dep_name)),
                f"HARD dependency on {dep_name}, which has no run or startup step: the dependant never "
                "starts (systemd BindsTo=); make it SOFT",
            )


# ----------------------------------------------------------------------------- a manifest's rules


def _runtime_selectable(s: _Subject, m: _Manifest) -> _Found:
    if not manifest_selectable(m.platform, s.prof):
        yield (
            (*m.path, m.platform_key) if m.platform_key else m.path,
            f'skipped: Platform has no runtime "*" or "{s.prof.runtime}" ("No lifecycle was found")',
        )


def _platform_regex(s: _Subject, m: _Manifest) -> _Found:
    if s.prof.platform_regex:
        return
    for k, v in _items(m.platform):
        text = str(v)
        if len(text) > 1 and text.startswith("/") and text.endswith("/"):
            yield (
                (*m.path, m.platform_key or "Platform", k),
                f"regular expressions are not supported ({text})",
            )


# ---------------------------------------------------------------------------- a lifecycle's rules


def _lower_case_steps(s: _Subject, lc: _Lifecycle) -> _Found:
    if not s.prof.lifecycle_keys_lower_case_only:
        return
    for k, _ in _items(lc.value):
        if k.lower() in STEPS and k.lower() != "setenv" and k != k.lower():
            yield (*lc.path, k), f"lifecycle keys are read in lower case only: {k} is not seen"


def _step_key_spelling(s: _Subject, lc: _Lifecycle) -> _Found:
    if not s.prof.step_keys_case_sensitive:
        return
    for k, v in _items(lc.value):
        if k.lower() == "setenv":
            if k != "Setenv":
                yield (*lc.path, k), f"read only as Setenv: {k} is not seen"
            continue
        for sk, _ in _items(v):
            spelled = _STEP_KEYS.get(sk.lower())
            if spelled is not None and sk != spelled:
                yield (*lc.path, k, sk), f"read only as {spelled}: {sk} is not seen"


def _no_lifecycle_step(s: _Subject, lc: _Lifecycle) -> _Found:
    if not s.prof.artifacts_only_supported and not set(lc.steps) - {"setenv"}:
        yield (
            lc.path,
            "a component without a lifecycle step is not supported: it never reaches FINISHED "
            "and the deployment reports FAILED",
        )


def _no_run_unit(s: _Subject, lc: _Lifecycle) -> _Found:
    wait = s.prof.run_unit_wait_s
    steps = set(lc.steps) - {"setenv"}
    if s.prof.lifecycle_keys_lower_case_only:
        steps = {k for k in steps if lc.steps[k][0] == k}
    if wait is None or not steps or steps & {"run", "startup"}:
        return  # without any step, _no_lifecycle_step says so
    yield (
        lc.path,
        f"no run or startup step: the deployment waits {wait:.0f} s for the component's run unit, "
        'then reports FAILED; add a run step that exits at once (run: "true")',
    )


def _steps_not_run(s: _Subject, lc: _Lifecycle) -> _Found:
    seen_steps = {
        k.lower()
        for k, _ in _items(lc.value)
        if k.lower() != "setenv" and (k == k.lower() or not s.prof.lifecycle_keys_lower_case_only)
    }
    for step in sorted(seen_steps - s.prof.steps):
        yield (*lc.path, lc.steps[step][0]), f"the {step} step is not run"


def _each_step(s: _Subject, lc: _Lifecycle) -> _Found:
    """Every step but Setenv through STEP_RULES."""
    for step, (k, value) in lc.steps.items():
        if step == "setenv":
            continue
        for step_rule in STEP_RULES:
            yield from step_rule(s, (*lc.path, k), value)


# ---------------------------------------------------------------------------------- a step's rules


def _skip_if(s: _Subject, path: _Path, value: Any) -> _Found:
    skip_if = _key(value, "SkipIf") if isinstance(value, Mapping) else None
    if s.prof.name == "lite" and skip_if is not None:
        yield (*path, skip_if), "SkipIf is not supported"


def _script_variables(s: _Subject, path: _Path, value: Any) -> _Found:
    """The recipe variables of the step's script, and (nucleus lite) every `{` that is none."""
    texts: list[tuple[_Path, str]] = []
    if isinstance(value, str):
        texts.append((path, value))
    elif isinstance(value, Mapping):
        texts += [((*path, sk), str(sv)) for sk, sv in _items(value) if sk.lower() == "script"]
    for text_path, text in texts:
        for m in _VAR_RE.finditer(text):
            yield from _variable(s, text_path, m)
        if s.prof.script_braces_are_variables:
            for brace in _not_variables(text):
                yield (
                    text_path,
                    f"{brace}: every {{ of a script starts a recipe variable here: the step fails",
                )


RECIPE_RULES: tuple[Callable[[_Subject], _Found], ...] = (
    _component_type,
    _subobject_budget,
    _depth_limit,
    _manifests,
    _hard_dependency_on_install_only,
)
MANIFEST_RULES: tuple[Callable[[_Subject, _Manifest], _Found], ...] = (_runtime_selectable, _platform_regex)
LIFECYCLE_RULES: tuple[Callable[[_Subject, _Lifecycle], _Found], ...] = (
    _lower_case_steps,
    _step_key_spelling,
    _no_lifecycle_step,
    _no_run_unit,
    _steps_not_run,
    _each_step,
)
STEP_RULES: tuple[Callable[[_Subject, _Path, Any], _Found], ...] = (_skip_if, _script_variables)


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


def _variable(s: _Subject, path: _Path, m: re.Match[str]) -> _Found:
    """One `{…}` recipe variable of a script, as `s.prof` resolves it."""
    whole, first, rest = m.group(0), m.group(1), m.group(2)
    if first == "configuration":
        yield from _configuration_variable(s, path, whole, rest)
        return
    if first in _OWN_NAMESPACES:
        return
    ns = rest.partition(":")[0]
    if ns in _OWN_NAMESPACES and "." in first and first != str(cget(s.raw, "ComponentName", "")):
        if not s.prof.cross_component_variables:
            yield path, f"{whole}: variables of another component are not supported: the step fails"
        elif not (isinstance(s.deps, Mapping) and _key(s.deps, first) is not None):
            yield path, f"{whole}: {first} is not a direct dependency"


def _configuration_variable(s: _Subject, path: _Path, whole: str, pointer: str) -> _Found:
    try:
        parts = pointer_parts(pointer)
    except ValueError:
        yield path, f"{whole}: not a JSON pointer"
        return
    value = pointer_get(s.defaults, parts)
    if value is MISSING and s.prof.missing_configuration_fails:
        yield path, f"{whole} is not in DefaultConfiguration: the step fails"
    elif isinstance(value, (dict, list)) and s.prof.interpolation == "escaped-json-strings":
        yield (
            path,
            f"{whole} is a {'list' if isinstance(value, list) else 'map'}: it reads as JSON with "
            "backslash-escaped quotes and every scalar a string; read it with GetConfiguration",
        )
