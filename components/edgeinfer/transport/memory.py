"""An in-process `Bus` for unit tests of core logic: no sockets, deterministic, synchronous delivery."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from edgeinfer.transport.base import (
    ConfigUpdateHandler,
    ConfigValidator,
    Message,
    MessageHandler,
    MqttProperties,
    PublishDone,
    Target,
    TransportError,
    topic_matches,
)


@dataclass
class _Sub:
    remove: Callable[[], None]
    closed: bool = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.remove()


@dataclass
class MemoryBus:
    """Delivers publishes synchronously to matching subscribers on the same bus and records them.

    `published` keeps every message in order, so tests can assert on what a component sent;
    `states` records UpdateState calls. Share one instance between components to wire them up.
    `validation=False` answers SubscribeToValidateConfigurationUpdates as nucleus lite does (a
    ServiceError): proposed configurations are then applied unvalidated.
    """

    config: dict[str, Any] = field(default_factory=dict)
    published: list[Message] = field(default_factory=list)
    states: list[str] = field(default_factory=list)
    fail_publish: bool = False
    validation: bool = True

    def __post_init__(self) -> None:
        self._lock = threading.RLock()
        self._subs: list[tuple[str, Target, MessageHandler]] = []
        self._config_handlers: list[ConfigUpdateHandler] = []
        self._validators: list[ConfigValidator] = []

    def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        target: Target = "local",
        qos: int = 0,
        properties: MqttProperties | None = None,
    ) -> None:
        if self.fail_publish:
            raise TransportError(f"publish to {topic} failed: bus is offline")
        message = Message(topic, bytes(payload), target, properties if target == "iot" else None)
        with self._lock:
            self.published.append(message)
            handlers = [h for f, t, h in self._subs if t == target and topic_matches(f, topic)]
        for handler in handlers:
            handler(message)

    def publish_nowait(
        self,
        topic: str,
        payload: bytes,
        *,
        target: Target = "local",
        qos: int = 0,
        on_done: PublishDone | None = None,
        properties: MqttProperties | None = None,
    ) -> None:
        """`publish`, then `on_done` with its outcome: in memory the refusal a nucleus would send back
        (e.g. a subclass's `UnauthorizedError`) arrives through `on_done` as well."""
        try:
            self.publish(topic, payload, target=target, qos=qos, properties=properties)
        except TransportError as exc:
            if on_done is None:
                raise
            on_done(exc)
            return
        if on_done is not None:
            on_done(None)

    def subscribe(
        self,
        topic: str,
        handler: MessageHandler,
        *,
        target: Target = "local",
        qos: int = 0,
        inline: bool = False,  # handlers always run on the publisher's thread here
    ) -> _Sub:
        entry = (topic, target, handler)
        with self._lock:
            self._subs.append(entry)
        return _Sub(lambda: self._discard(self._subs, entry))

    def get_configuration(self, key_path: Sequence[str] = (), component: str | None = None) -> Any:
        node: Any = self.config
        for key in key_path:
            if not isinstance(node, dict) or key not in node:
                raise TransportError(f"configuration key {'/'.join(key_path)} not found")
            node = node[key]
        return copy.deepcopy(node)

    def update_configuration(self, key_path: Sequence[str], value: Any) -> None:
        if not key_path:
            raise TransportError("update_configuration needs a key path")
        node = self.config
        for key in key_path[:-1]:
            node = node.setdefault(key, {})
        node[key_path[-1]] = copy.deepcopy(value)
        for handler in list(self._config_handlers):
            handler(list(key_path))

    def propose_configuration(self, proposed: dict[str, Any]) -> str | None:
        """Run the validators as a deployment would; apply and notify when all accept."""
        for validator in list(self._validators):
            reason = validator(copy.deepcopy(proposed))
            if reason is not None:
                return reason
        changed = [k for k in proposed if self.config.get(k) != proposed[k]]
        self.config = copy.deepcopy(proposed)
        for key in changed:
            for handler in list(self._config_handlers):
                handler([key])
        return None

    def on_configuration_update(self, handler: ConfigUpdateHandler) -> _Sub:
        self._config_handlers.append(handler)
        return _Sub(lambda: self._discard(self._config_handlers, handler))

    def on_validate_configuration(self, validator: ConfigValidator) -> _Sub:
        if not self.validation:
            raise TransportError(
                "SubscribeToValidateConfigurationUpdates: ServiceError: the nucleus does not serve it"
            )
        self._validators.append(validator)
        return _Sub(lambda: self._discard(self._validators, validator))

    def update_state(self, state: Literal["RUNNING", "ERRORED"]) -> None:
        self.states.append(state)

    def close(self) -> None:
        with self._lock:
            self._subs.clear()
        self._config_handlers.clear()
        self._validators.clear()

    def messages_on(self, topic_filter: str, target: Target | None = None) -> list[Message]:
        return [
            m
            for m in self.published
            if topic_matches(topic_filter, m.topic) and (target is None or m.target == target)
        ]

    def _discard(self, items: list[Any], item: Any) -> None:
        with self._lock:
            items.remove(item)
