"""The one configuration reader of every component: plain dataclasses in, recipe keys out.

A component's configuration is a dataclass with snake_case fields. Its recipe key is derived here,
in one place: the camelCase form of the field name (`max_queue_delay_us` → `maxQueueDelayUs`), or the
name given by `recipe_key("…")` in the field's metadata where AWS's own spelling differs
(`enableTensorRT`). `read(Config, doc, component=…)` builds the dataclass from the component's
`configuration` subtree (GetConfiguration over IPC, the whole map):

- a key the dataclass does not know is logged as a warning that names it and the component, and
  skipped (the nucleus keeps `accessControl` there too; it is not warned about);
- values are coerced to the field's type, accepting what either nucleus hands over: the classic
  nucleus keeps YAML/JSON types, nucleus lite stores every DefaultConfiguration scalar as a string
  (`"8"`, `"true"`, `"0.5"`) and interpolates lists and maps as JSON with its quotes backslash-escaped;
  a string holding JSON is read where a list or map is expected;
- what cannot be coerced, and what a dataclass's `check()` refuses, raises one `ConfigError` naming
  every key path and its reason on one line. Nothing is half-applied: the caller keeps its old value.

`check(self) -> list[tuple[str, str]]` on a dataclass returns (key relative to it, reason) pairs;
the reader calls it on every nested dataclass after building it.

Standard library only: the installer imports this on the device's system Python.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from edgeinfer.errors import EdgeinferError

if typing.TYPE_CHECKING:
    from edgeinfer.transport.base import Bus, ConfigUpdateHandler, ConfigValidator, Subscription

__all__ = [
    "ConfigError",
    "camel",
    "key_of",
    "merge",
    "parse_overrides",
    "read",
    "recipe_key",
    "subscribe",
    "to_recipe",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

# Keys the nucleus itself keeps in a component's configuration: never a component's own.
NUCLEUS_KEYS = frozenset({"accessControl"})
_KEY = "edgeinfer.recipe_key"
_ESCAPED = re.compile(r"\\(.)", re.DOTALL)


class ConfigError(EdgeinferError):
    """A configuration the component cannot use: every key path with its reason, on one line."""

    def __init__(self, component: str, problems: Sequence[tuple[str, str]] | None = None) -> None:
        """`ConfigError(component, [(key path, reason), ...])`, or `ConfigError(message)` for a
        problem that is no one key's (an unreadable file, a malformed option)."""
        if problems is None:
            component, problems = "", [("", component)]
        self.component = component
        self.problems = list(problems) or [("", "invalid")]
        text = "; ".join(f"{path}: {reason}" if path else reason for path, reason in self.problems)
        super().__init__(f"configuration of {component}: {text}" if component else text)

    @property
    def path(self) -> str:
        """The first refused key path (`tensorrt.trtFp16Enable`)."""
        return self.problems[0][0]

    @property
    def reason(self) -> str:
        return self.problems[0][1]

    @property
    def reasons(self) -> str:
        """The problems without the component's name: what a validity report says."""
        return "; ".join(f"{path}: {reason}" if path else reason for path, reason in self.problems)


def camel(name: str) -> str:
    """`max_queue_delay_us` → `maxQueueDelayUs`."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def recipe_key(name: str) -> dict[str, str]:
    """Field metadata for a recipe key that is not the field's camelCase form (AWS's own spelling):
    `enable_tensor_rt: bool = field(default=False, metadata=recipe_key("enableTensorRT"))`."""
    return {_KEY: name}


def key_of(f: dataclasses.Field[Any]) -> str:
    """The recipe key of a dataclass field."""
    return str(f.metadata.get(_KEY) or camel(f.name))


def key_for(cls: type[Any], name: str) -> str:
    """The recipe key of the field `name` of `cls` (for messages)."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            return key_of(f)
    raise KeyError(name)


def to_recipe(obj: Any) -> dict[str, Any]:
    """The dataclass as recipe configuration (camelCase keys, nested dataclasses as maps)."""
    return {key_of(f): _export(getattr(obj, f.name)) for f in dataclasses.fields(obj)}


def _export(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_recipe(value)
    if isinstance(value, list):
        return [_export(v) for v in value]
    if isinstance(value, dict):
        return {k: _export(v) for k, v in value.items()}
    return value


# ------------------------------------------------------------------------------------------ reading


def read(cls: type[T], doc: Any, *, component: str, path: str = "") -> T:
    """Build `cls` from recipe configuration `doc` (None: all defaults). Raises ConfigError."""
    problems: list[tuple[str, str]] = []
    if doc is None:
        doc = {}
    value = _coerce(cls, doc, path, component, problems)
    if problems:
        raise ConfigError(component, problems)
    return typing.cast(T, value)


class _Bad:
    pass


_BAD = _Bad()


def _hints(cls: type[Any]) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _read_dataclass(
    cls: type[Any], doc: Mapping[str, Any], path: str, component: str, problems: list[tuple[str, str]]
) -> Any:
    hints = _hints(cls)
    by_key = {key_of(f): f for f in dataclasses.fields(cls) if f.init}
    kwargs: dict[str, Any] = {}
    unread = False
    for key, raw in doc.items():
        where = f"{path}.{key}" if path else str(key)
        f = by_key.get(str(key))
        if f is None:
            if not (path == "" and key in NUCLEUS_KEYS):
                log.warning("%s: unknown configuration key %s (ignored)", component or "configuration", where)
            continue
        value = _coerce(hints[f.name], raw, where, component, problems)
        if value is _BAD:
            unread = True
        else:
            kwargs[f.name] = value
    if unread:
        return _BAD
    # Built even when a nested check refused something, so that this level's check reports too.
    obj = cls(**kwargs)
    check = getattr(obj, "check", None)
    if callable(check):
        for key, reason in check():
            problems.append((f"{path}.{key}" if path and key else key or path, reason))
    return obj


def _coerce(tp: Any, raw: Any, path: str, component: str, problems: list[tuple[str, str]]) -> Any:
    """`raw` as type `tp`, or _BAD with the reason added to `problems`; one reader per kind of type."""
    if tp is Any:
        return raw
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _coerce_dataclass(tp, raw, path, component, problems)
    origin = typing.get_origin(tp)
    if origin is list:
        return _coerce_list(tp, raw, path, component, problems)
    if origin is dict:
        return _coerce_dict(tp, raw, path, component, problems)
    scalar = _SCALARS.get(tp)
    if scalar is None:
        raise TypeError(f"{path}: the reader does not handle {tp!r}")  # pragma: no cover - a coding error
    value = scalar(raw)
    if isinstance(value, _Refused):
        problems.append((path, value.reason))
        return _BAD
    return value


@dataclass(frozen=True)
class _Refused:
    """What a scalar reader answers for a value it cannot read: the reason."""

    reason: str


def _coerce_dataclass(
    tp: type[Any], raw: Any, path: str, component: str, problems: list[tuple[str, str]]
) -> Any:
    doc = _json_container(raw, dict)
    if not isinstance(doc, Mapping):
        problems.append((path, f"must be a map, got {_show(raw)}"))
        return _BAD
    return _read_dataclass(tp, doc, path, component, problems)


def _coerce_list(tp: Any, raw: Any, path: str, component: str, problems: list[tuple[str, str]]) -> Any:
    (item,) = typing.get_args(tp) or (Any,)
    items = _json_container(raw, list)
    if not isinstance(items, list):
        problems.append((path, f"must be a list, got {_show(raw)}"))
        return _BAD
    out = [_coerce(item, v, f"{path}[{i}]", component, problems) for i, v in enumerate(items)]
    return _BAD if any(v is _BAD for v in out) else out


def _coerce_dict(tp: Any, raw: Any, path: str, component: str, problems: list[tuple[str, str]]) -> Any:
    _, item = typing.get_args(tp) or (str, Any)
    doc = _json_container(raw, dict)
    if not isinstance(doc, Mapping):
        problems.append((path, f"must be a map, got {_show(raw)}"))
        return _BAD
    out = {str(k): _coerce(item, v, f"{path}.{k}", component, problems) for k, v in doc.items()}
    return _BAD if any(v is _BAD for v in out.values()) else out


def _read_bool(raw: Any) -> bool | _Refused:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in ("true", "false"):
        return raw.strip().lower() == "true"
    return _Refused(f"must be true or false, got {_show(raw)}")


def _read_int(raw: Any) -> int | _Refused:
    number = _number(raw)
    if number is None or not float(number).is_integer():
        return _Refused(f"must be an integer, got {_show(raw)}")
    return int(number)


def _read_float(raw: Any) -> float | _Refused:
    number = _number(raw)
    if number is None:
        return _Refused(f"must be a number, got {_show(raw)}")
    return float(number)


def _read_str(raw: Any) -> str | _Refused:
    if isinstance(raw, str):
        return raw
    if isinstance(raw, int) and not isinstance(raw, bool):
        return str(raw)  # `cudaMajors: [12]` written without quotes
    return _Refused(f"must be a string, got {_show(raw)}")


_SCALARS: dict[Any, Callable[[Any], Any]] = {
    bool: _read_bool,
    int: _read_int,
    float: _read_float,
    str: _read_str,
}


def _number(raw: Any) -> float | int | None:
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, float):
        return raw if math.isfinite(raw) else None
    if isinstance(raw, str):
        text = raw.strip()
        try:
            return int(text)
        except ValueError:
            pass
        try:
            value = float(text)
        except ValueError:
            return None
        return value if math.isfinite(value) else None
    return None


def _json_container(raw: Any, kind: type) -> Any:
    """A list or map as given, or read from a JSON string (nucleus lite's interpolation escapes the
    JSON's quotes with backslashes); anything else comes back as it was, for the caller to refuse."""
    if not isinstance(raw, str):
        return raw
    text = raw.strip()
    if not text:
        return kind()
    if text[:1] not in "[{":
        return raw
    for candidate in (text, _ESCAPED.sub(r"\1", text)):
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, kind):
            return value
    return raw


def _show(raw: Any) -> str:
    text = repr(raw)
    return text if len(text) <= 60 else text[:57] + "..."


# ------------------------------------------------------------------------------- local overrides


def parse_overrides(options: Iterable[str]) -> dict[str, Any]:
    """`-o KEY=VALUE` options as a configuration map: `tensorrt.trtFp16Enable=false` →
    `{"tensorrt": {"trtFp16Enable": "false"}}`. Values stay text; `read` coerces them as it does a
    nucleus lite's strings. Raises ConfigError for an option without `=`."""
    out: dict[str, Any] = {}
    for option in options:
        key, sep, value = option.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError("", [("", f"-o expects KEY=VALUE, got {option!r}")])
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError("", [(key, f"{part} is set as a value and as a map")])
            node = child
        node[leaf] = value
    return out


def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """`override` over `base`, maps merged key by key (as a deployment's MERGE does)."""
    out = dict(base)
    for key, value in override.items():
        old = out.get(key)
        if isinstance(old, Mapping) and isinstance(value, Mapping):
            out[key] = merge(old, value)
        else:
            out[key] = value
    return out


# ------------------------------------------------------------------------------ live configuration


def subscribe(
    bus: Bus,
    component: str,
    on_update: ConfigUpdateHandler,
    validate: ConfigValidator | None = None,
) -> list[Subscription]:
    """Follow configuration updates (both nuclei serve SubscribeToConfigurationUpdate) and, where the
    nucleus serves SubscribeToValidateConfigurationUpdates (classic), validate proposed changes; where
    it does not (nucleus lite answers ServiceError), run without live validation and say so once."""
    from edgeinfer.transport.base import TransportError

    subs = [bus.on_configuration_update(on_update)]
    if validate is not None:
        try:
            subs.append(bus.on_validate_configuration(validate))
        except TransportError as exc:
            log.warning(
                "%s: live configuration validation is off, the nucleus does not serve it (%s); "
                "a change this component cannot use is ignored when it arrives, with its reasons here",
                component,
                exc,
            )
    return subs


def validator(
    check: Callable[[dict[str, Any]], object],
) -> Callable[[dict[str, Any]], str | None]:
    """A ConfigValidator from a function that raises ConfigError: its reasons, or None to accept."""

    def validate(proposed: dict[str, Any]) -> str | None:
        try:
            check(proposed)
        except ConfigError as exc:
            return exc.reasons
        return None

    return validate
