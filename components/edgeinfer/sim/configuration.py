"""Configuration: Get/UpdateConfiguration, configuration-update events and deployment-time validation
(the classic nucleus's `ConfigStoreIPCEventStreamAgent`; nucleus lite's config service where it differs).

GetConfiguration of a leaf answers `{leaf: value}`, of an inner node the subtree. UpdateConfiguration's
keyPath names the node merged into: on classic a leaf there takes `{leaf: valueToMerge}` into its
parent, which refuses the map; on lite the value is written there, replacing a leaf. An update event
carries the changed key path relative to `configuration`: classic sends one per changed node (an
added or removed subtree once), lite one per leaf.
"""

from __future__ import annotations

import asyncio
import copy
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from awsiot.greengrasscoreipc import model

from edgeinfer.greengrass.recipe import RecipeError, apply_reset, deep_merge
from edgeinfer.sim import ipc_server as ipc
from edgeinfer.sim.pubsub import remove

if TYPE_CHECKING:
    from edgeinfer.sim.core import Nucleus
    from edgeinfer.sim.lifecycle import Component

KEY_NOT_FOUND = "Key not found"
RESTRICTED = "accessControl"  # not writable over IPC, on either nucleus


@dataclass(eq=False)
class ConfigSub:
    component: str
    key_path: list[str]
    stream: ipc.Stream


def changed_paths(old: Any, new: Any, prefix: list[str], per_leaf: bool = False) -> list[list[str]]:
    """The key paths that differ between two configurations: changed leaves, and added or removed
    keys (their leaves instead with `per_leaf`)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[list[str]] = []
        for key in list(old) + [k for k in new if k not in old]:
            if key not in new or key not in old:
                value = new.get(key, old.get(key))
                out += _leaves(value, [*prefix, key]) if per_leaf else [[*prefix, key]]
            else:
                out += changed_paths(old[key], new[key], [*prefix, key], per_leaf)
        return out
    if old == new:
        return []
    if per_leaf and (isinstance(old, dict) or isinstance(new, dict)):
        return _leaves(new if isinstance(new, dict) else old, prefix)
    return [prefix]


def _leaves(value: Any, prefix: list[str]) -> list[list[str]]:
    if isinstance(value, dict) and value:
        out: list[list[str]] = []
        for key, child in value.items():
            out += _leaves(child, [*prefix, key])
        return out
    return [prefix]


class ConfigStore:
    def __init__(self, nucleus: Nucleus) -> None:
        self.nucleus = nucleus
        self.profile = nucleus.profile
        self.subs: list[ConfigSub] = []
        self.validate_subs: dict[str, list[ipc.Stream]] = {}
        self._pending: dict[str, asyncio.Future[tuple[str, str | None]]] = {}

    def handlers(self) -> dict[str, Callable[..., Any]]:
        handlers: dict[str, Callable[..., Any]] = {
            "aws.greengrass#GetConfiguration": self._get,
            "aws.greengrass#UpdateConfiguration": self._update,
            "aws.greengrass#SubscribeToConfigurationUpdate": self._subscribe,
            "aws.greengrass#SubscribeToValidateConfigurationUpdates": self._subscribe_to_validate,
            "aws.greengrass#SendConfigurationValidityReport": self._send_validity_report,
        }
        return handlers

    async def _get(self, conn: ipc.Connection, req: Any, stream: ipc.Stream) -> Any:
        name = str(req.component_name or conn.component)
        comp = self.nucleus.components.get(name)
        if comp is None:
            raise ipc.not_found(KEY_NOT_FOUND)
        key_path = list(req.key_path or [])
        node: Any = comp.config
        for key in key_path:
            if not isinstance(node, dict) or key not in node:
                raise ipc.not_found(KEY_NOT_FOUND)
            node = node[key]
        value = node if isinstance(node, dict) else {key_path[-1]: node}
        return model.GetConfigurationResponse(component_name=name, value=copy.deepcopy(value))

    async def _update(self, conn: ipc.Connection, req: Any, stream: ipc.Stream) -> Any:
        assert conn.component is not None
        comp = self.nucleus.component(conn.component)
        key_path = list(req.key_path or [])
        value = req.value_to_merge
        if req.timestamp is None:
            raise ipc.invalid("Timestamp is required")
        if value is None:
            raise ipc.invalid("ValueToMerge is required")
        if (key_path and key_path[0] == RESTRICTED) or (
            not key_path and isinstance(value, dict) and RESTRICTED in value
        ):
            field = "fields" if self.profile.name == "classic" else "field"
            raise ipc.invalid(f"Config update is not allowed for following {field} [{RESTRICTED}]")
        new = copy.deepcopy(comp.config)
        if self.profile.update_leaf == "replace":
            _write(new, key_path, value)
        else:
            _merge_classic(new, key_path, value)
        self.apply(comp, new)
        return model.UpdateConfigurationResponse()

    def apply(self, comp: Component, new: dict[str, Any]) -> list[list[str]]:
        old = comp.config
        comp.config = new
        self.nucleus.auth.forget()
        paths = changed_paths(old, new, [], per_leaf=self.profile.update_events == "per-leaf")
        for path in paths:
            for sub in list(self.subs):
                if sub.component != comp.name:
                    continue
                n = min(len(path), len(sub.key_path))
                if path[:n] == sub.key_path[:n]:
                    sub.stream.send_event(
                        model.ConfigurationUpdateEvents(
                            configuration_update_event=model.ConfigurationUpdateEvent(
                                component_name=comp.name, key_path=path
                            )
                        )
                    )
        return paths

    async def _subscribe(self, conn: ipc.Connection, req: Any, stream: ipc.Stream) -> Any:
        name = str(req.component_name or conn.component)
        if name not in self.nucleus.components:
            raise ipc.not_found(KEY_NOT_FOUND)
        sub = ConfigSub(name, list(req.key_path or []), stream)
        self.subs.append(sub)
        stream.on_close.append(lambda: remove(self.subs, sub))
        return model.SubscribeToConfigurationUpdateResponse()

    async def _subscribe_to_validate(self, conn: ipc.Connection, req: Any, stream: ipc.Stream) -> Any:
        assert conn.component is not None
        streams = self.validate_subs.setdefault(conn.component, [])
        streams.append(stream)
        stream.on_close.append(lambda: remove(streams, stream))
        return model.SubscribeToValidateConfigurationUpdatesResponse()

    async def _send_validity_report(self, conn: ipc.Connection, req: Any, stream: ipc.Stream) -> Any:
        report = req.configuration_validity_report
        if report is None or not report.deployment_id:
            raise ipc.invalid("configurationValidityReport with a deploymentId is required")
        future = self._pending.get(f"{conn.component}/{report.deployment_id}")
        if future is None or future.done():
            raise ipc.invalid("Validation request either timed out or was never made")
        future.set_result((str(report.status), report.message))
        return model.SendConfigurationValidityReportResponse()

    async def deploy(
        self, name: str, merge: Mapping[str, Any] | None, reset: Iterable[str] | None
    ) -> str | None:
        """A deployment that changes one component's configuration: validate, then apply and notify.

        Returns None when applied, or the reason a validator gave for rejecting it.
        """
        comp = self.nucleus.components[name]
        new = apply_reset(comp.config, comp.recipe.default_config, list(reset or []))
        if merge:
            new = deep_merge(new, dict(merge))
        deployment_id = secrets.token_hex(8)
        futures = []
        for stream in list(self.validate_subs.get(name, [])):
            fut: asyncio.Future[tuple[str, str | None]] = asyncio.get_running_loop().create_future()
            self._pending[f"{name}/{deployment_id}"] = fut
            futures.append(fut)
            stream.send_event(
                model.ValidateConfigurationUpdateEvents(
                    validate_configuration_update_event=model.ValidateConfigurationUpdateEvent(
                        configuration=copy.deepcopy(new), deployment_id=deployment_id
                    )
                )
            )
            break  # one report per component and deployment, as the nucleus takes it
        try:
            for fut in futures:
                try:
                    status, message = await asyncio.wait_for(fut, self.nucleus.options.validation_timeout)
                except asyncio.TimeoutError:
                    continue  # no answer in time: the nucleus proceeds
                if status != "ACCEPTED":
                    comp.log(f"configuration update rejected: {message}")
                    return message or "rejected by the component"
        finally:
            self._pending.pop(f"{name}/{deployment_id}", None)
        before = self._fingerprint(comp)
        self.apply(comp, new)
        comp.log("configuration updated by deployment")
        if self._fingerprint(comp) != before:
            await self.nucleus.lifecycle.restart_component(
                comp, "its lifecycle changed with the new configuration"
            )
        return None

    def _fingerprint(self, comp: Component) -> list[Any]:
        out: list[Any] = []
        for step in comp.recipe.lifecycle:
            if step != "setenv":
                try:
                    out.append(self.nucleus.lifecycle.step_spec(comp, step))
                except RecipeError as exc:
                    out.append(str(exc))
        return out


def _merge_classic(config: dict[str, Any], key_path: list[str], value: Any) -> None:
    """Classic: keyPath names the node merged into (created when missing); a leaf there takes
    `{leaf: value}` into its parent, and no merge replaces a leaf by a map or an inner node by a leaf."""
    if not isinstance(value, dict):
        raise ipc.invalid("valueToMerge must be an object")
    node = config
    for i, key in enumerate(key_path):
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        elif not isinstance(child, dict):
            if i == len(key_path) - 1:
                raise ipc.invalid(f"Cannot merge a map into the leaf {'/'.join(key_path)}")
            raise ipc.invalid(f"Cannot merge into {'/'.join(key_path[: i + 1])}: it is a leaf value")
        node = child
    _check_merge(node, value, key_path)
    node.update(deep_merge({k: node[k] for k in value if k in node}, value))


def _check_merge(node: dict[str, Any], value: dict[str, Any], path: list[str]) -> None:
    for key, val in value.items():
        here = node.get(key)
        if isinstance(here, dict) and not isinstance(val, dict):
            raise ipc.invalid(f"Cannot replace the inner node {'/'.join([*path, key])} with a leaf value")
        if isinstance(val, dict) and here is not None and not isinstance(here, dict):
            raise ipc.invalid(f"Cannot merge a map into the leaf {'/'.join([*path, key])}")
        if isinstance(val, dict) and isinstance(here, dict):
            _check_merge(here, val, [*path, key])


def _write(config: dict[str, Any], key_path: list[str], value: Any) -> None:
    """Lite: the value is written at keyPath: maps merge into a map there, anything else replaces."""
    if not key_path:
        if not isinstance(value, dict):
            raise ipc.invalid("Received invalid parameters.")
        config.update(deep_merge(config, value))
        return
    node = config
    for key in key_path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = node[key] = {}
        node = child
    last = key_path[-1]
    here = node.get(last)
    node[last] = (
        deep_merge(here, value)
        if isinstance(here, dict) and isinstance(value, dict)
        else copy.deepcopy(value)
    )
