"""`GreengrassIpcBus`: the production `Bus`, over the Greengrass IPC socket (awsiotsdk ClientV2).

    bus = GreengrassIpcBus.connect()        # SVCUID + AWS_GG_NUCLEUS_DOMAIN_SOCKET_FILEPATH_FOR_COMPONENT
    bus.subscribe("edgeinfer/thing/infer", handler)                 # local pub/sub
    bus.subscribe("edgeinfer/thing/infer", handler, target="iot")   # IoT Core
    bus.publish("edgeinfer/thing/result", payload, target="iot", qos=1)

Publishes go out as binary messages; JSON messages other components send arrive as their UTF-8 JSON
bytes. Handlers run on one SDK callback thread per bus, in arrival order (so a handler may call the
bus synchronously); `inline=True` handlers run on the connection's event-loop thread itself, one
thread hand-off sooner, and may only use `publish_nowait`. SDK errors become `TransportError`; the
nucleus's refusals `UnauthorizedError`.
`update_configuration(path, value)` is Greengrass's MERGE at `path[:-1]`: a mapping value merges into
an existing mapping, and the nucleus refuses to replace a mapping with a leaf value.
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any, Literal

from edgeinfer import codec
from edgeinfer.transport import _sdk_codec
from edgeinfer.transport.base import (
    ConfigUpdateHandler,
    ConfigValidator,
    Message,
    MessageHandler,
    MqttProperties,
    PublishDone,
    Target,
    TransportError,
    UnauthorizedError,
)

log = logging.getLogger(__name__)

SOCKET_ENV = "AWS_GG_NUCLEUS_DOMAIN_SOCKET_FILEPATH_FOR_COMPONENT"
TOKEN_ENV = "SVCUID"


def _describe(exc: BaseException) -> str:
    message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {message}"


def _error(what: str, exc: BaseException) -> TransportError:
    """The SDK's exception as ours: the nucleus's refusal is `UnauthorizedError`."""
    from awsiot.greengrasscoreipc import model

    if isinstance(exc, model.UnauthorizedError):
        return UnauthorizedError(f"{what}: {exc.message or 'not authorized'}")
    return TransportError(f"{what}: {_describe(exc)}")


class _InlineHandler:
    """An SDK stream handler called on the client's event-loop thread (no executor hand-off)."""

    def __init__(self, on_event: Callable[[Any], None], on_error: Callable[[Exception], bool]) -> None:
        self.on_stream_event = on_event
        self.on_stream_error = on_error

    def on_stream_closed(self) -> None:
        pass


def _start(what: str, fn: Callable[[], Any]) -> Any:
    """Call the SDK; whatever it raises before the request is sent becomes TransportError."""
    try:
        return fn()
    except Exception as exc:
        raise TransportError(f"{what}: {_describe(exc)}") from exc


PAYLOAD_BYTES, PAYLOAD_UTF8 = "0", "1"  # awsiotsdk's PayloadFormat.BYTES / .UTF8 (the MQTT 5 indicator)


def _properties(msg: Any) -> MqttProperties | None:
    """The MQTT 5 properties of an awsiotsdk `MQTTMessage` (None when it carries none)."""
    correlation = msg.correlation_data
    if isinstance(correlation, str):
        correlation = correlation.encode()
    users = tuple((str(p.key or ""), str(p.value or "")) for p in msg.user_properties or ())
    fmt = msg.payload_format
    props = MqttProperties(
        content_type=msg.content_type or None,
        correlation_data=bytes(correlation) if correlation is not None else None,
        response_topic=msg.response_topic or None,
        user_properties=users,
        message_expiry_s=msg.message_expiry_interval_seconds,
        payload_format="utf8" if fmt == PAYLOAD_UTF8 else "bytes" if fmt == PAYLOAD_BYTES else None,
    )
    return None if props == MqttProperties() else props


def _sdk_properties(props: MqttProperties) -> dict[str, Any]:
    """`PublishToIoTCore` keyword arguments for MQTT 5 properties (only the ones set)."""
    from awsiot.greengrasscoreipc import model

    out: dict[str, Any] = {}
    if props.content_type is not None:
        out["content_type"] = props.content_type
    if props.correlation_data is not None:
        out["correlation_data"] = props.correlation_data
    if props.response_topic is not None:
        out["response_topic"] = props.response_topic
    if props.user_properties:
        out["user_properties"] = [model.UserProperty(key=k, value=v) for k, v in props.user_properties]
    if props.message_expiry_s is not None:
        out["message_expiry_interval_seconds"] = props.message_expiry_s
    if props.payload_format is not None:
        out["payload_format"] = (
            model.PayloadFormat.UTF8 if props.payload_format == "utf8" else model.PayloadFormat.BYTES
        )
    return out


class _Sub:
    def __init__(self, operation: Any) -> None:
        self._operation = operation
        self.closed = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self._operation.close()
            except Exception as exc:  # closing an already closed stream
                log.debug("closing subscription: %s", exc)


class GreengrassIpcBus:
    """A `Bus` on the Greengrass nucleus's IPC. Create with `connect()`; `close()` when done."""

    def __init__(self, client: Any, timeout: float = 10.0) -> None:
        self._client = client
        self.timeout = timeout
        self._subs: list[_Sub] = []

    @classmethod
    def connect(
        cls, socket_path: str | None = None, token: str | None = None, timeout: float = 10.0
    ) -> GreengrassIpcBus:
        """Connect as the component the environment names (or the given socket and token)."""
        from awsiot.eventstreamrpc import AccessDeniedError
        from awsiot.greengrasscoreipc import connect as ipc_connect
        from awsiot.greengrasscoreipc.clientv2 import GreengrassCoreIPCClientV2

        socket_path = socket_path or os.environ.get(SOCKET_ENV)
        token = token or os.environ.get(TOKEN_ENV)
        if not socket_path or not token:
            raise TransportError(
                f"not running under Greengrass: {SOCKET_ENV} and {TOKEN_ENV} must be set by the nucleus"
            )
        try:
            raw = ipc_connect(ipc_socket=socket_path, authtoken=token, timeout=timeout)
        except AccessDeniedError as exc:
            raise UnauthorizedError(
                f"Greengrass IPC refused the connection at {socket_path}: bad token"
            ) from exc
        except Exception as exc:
            raise TransportError(
                f"cannot connect to Greengrass IPC at {socket_path}: {_describe(exc)}"
            ) from exc
        _sdk_codec.install()
        executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ipc-handler")
        return cls(GreengrassCoreIPCClientV2(client=raw, executor=executor), timeout)

    # ------------------------------------------------------------ plumbing

    def _wait(self, future: concurrent.futures.Future[Any], what: str) -> Any:
        try:
            return future.result(self.timeout)
        except concurrent.futures.TimeoutError as exc:
            raise TransportError(f"{what}: no answer from the nucleus in {self.timeout}s") from exc
        except Exception as exc:
            raise _error(what, exc) from exc

    def _call(self, what: str, fn: Callable[[], concurrent.futures.Future[Any]]) -> Any:
        return self._wait(_start(what, fn), what)

    def _stream(self, what: str, fn: Callable[[], tuple[Any, Any]]) -> _Sub:
        """Open a streaming operation (`fn` returns the SDK's (future, operation)) and wait until the
        nucleus accepts it; on refusal the stream is closed again and TransportError raised."""
        future, operation = _start(what, fn)
        sub = _Sub(operation)
        try:
            self._wait(future, what)
        except TransportError:
            sub.close()
            raise
        self._subs.append(sub)
        return sub

    @staticmethod
    def _guard(handler: Callable[..., None], what: str) -> Callable[..., None]:
        def run(*args: Any) -> None:
            try:
                handler(*args)
            except Exception:
                log.exception("handler for %s raised", what)

        return run

    # ------------------------------------------------------------ pub/sub

    def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        target: Target = "local",
        qos: int = 0,
        properties: MqttProperties | None = None,
    ) -> None:
        what, future = self._publish(topic, payload, target, qos, properties)
        self._wait(future, what)

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
        what, future = self._publish(topic, payload, target, qos, properties)
        if on_done is not None:

            def done(f: concurrent.futures.Future[Any]) -> None:
                exc = f.exception()
                on_done(None if exc is None else _error(what, exc))

            future.add_done_callback(done)

    def _publish(
        self, topic: str, payload: bytes, target: Target, qos: int, properties: MqttProperties | None
    ) -> tuple[str, concurrent.futures.Future[Any]]:
        from awsiot.greengrasscoreipc import model

        if target == "iot":
            what = f"PublishToIoTCore {topic}"
            extra = _sdk_properties(properties) if properties is not None else {}
            return what, _start(
                what,
                lambda: self._client.publish_to_iot_core_async(
                    topic_name=topic,
                    qos=model.QOS.AT_LEAST_ONCE if qos else model.QOS.AT_MOST_ONCE,
                    payload=payload,
                    **extra,
                ),
            )
        what = f"PublishToTopic {topic}"
        message = model.PublishMessage(binary_message=model.BinaryMessage(message=bytes(payload)))
        return what, _start(
            what, lambda: self._client.publish_to_topic_async(topic=topic, publish_message=message)
        )

    def subscribe(
        self,
        topic: str,
        handler: MessageHandler,
        *,
        target: Target = "local",
        qos: int = 0,
        inline: bool = False,
    ) -> _Sub:
        from awsiot.greengrasscoreipc import model

        safe = self._guard(handler, topic)
        on_error: Callable[[Exception], bool] = lambda exc: self._stream_error(topic, exc)  # noqa: E731
        if target == "iot":

            def on_iot(event: Any) -> None:
                msg = event.message
                payload = msg.payload.encode() if isinstance(msg.payload, str) else bytes(msg.payload or b"")
                safe(Message(msg.topic_name or topic, payload, "iot", _properties(msg)))

            iot_qos = model.QOS.AT_LEAST_ONCE if qos else model.QOS.AT_MOST_ONCE
            if inline:
                return self._inline(
                    f"SubscribeToIoTCore {topic}",
                    lambda: self._client.client.new_subscribe_to_iot_core(_InlineHandler(on_iot, on_error)),
                    model.SubscribeToIoTCoreRequest(topic_name=topic, qos=iot_qos),
                )
            return self._stream(
                f"SubscribeToIoTCore {topic}",
                lambda: self._client.subscribe_to_iot_core_async(
                    topic_name=topic, qos=iot_qos, on_stream_event=on_iot, on_stream_error=on_error
                ),
            )

        def on_local(event: Any) -> None:
            if event.json_message is not None:
                ctx = event.json_message.context
                payload = codec.dumps(event.json_message.message).encode()
            elif event.binary_message is not None:
                ctx = event.binary_message.context
                payload = bytes(event.binary_message.message or b"")
            else:
                return
            safe(Message(ctx.topic if ctx is not None and ctx.topic else topic, payload, "local"))

        if inline:
            return self._inline(
                f"SubscribeToTopic {topic}",
                lambda: self._client.client.new_subscribe_to_topic(_InlineHandler(on_local, on_error)),
                model.SubscribeToTopicRequest(topic=topic),
            )
        return self._stream(
            f"SubscribeToTopic {topic}",
            lambda: self._client.subscribe_to_topic_async(
                topic=topic, on_stream_event=on_local, on_stream_error=on_error
            ),
        )

    def _inline(self, what: str, new_operation: Callable[[], Any], request: Any) -> _Sub:
        """Open a stream on the SDK's own client (ClientV2 would hand every event to its executor): the
        handler runs on the connection's event-loop thread."""

        def activate() -> tuple[Any, Any]:
            operation = new_operation()
            operation.activate(request)
            return operation.get_response(), operation

        return self._stream(what, activate)

    @staticmethod
    def _stream_error(topic: str, exc: Exception) -> bool:
        log.warning("subscription %s: %s", topic, _describe(exc))
        return False  # keep the stream open, as the nucleus does

    # ------------------------------------------------------------ configuration

    def get_configuration(self, key_path: Sequence[str] = (), component: str | None = None) -> Any:
        """The value at key_path (a subtree for an inner node); TransportError when it is missing."""
        path = list(key_path)
        parent = path[:-1]
        resp = self._call(
            f"GetConfiguration {'/'.join(path) or '/'}",
            lambda: self._client.get_configuration_async(component_name=component, key_path=parent),
        )
        value = resp.value if resp.value is not None else {}
        if not path:
            return value
        if not isinstance(value, dict) or path[-1] not in value:
            raise TransportError(f"configuration key {'/'.join(path)} not found")
        return value[path[-1]]

    def update_configuration(self, key_path: Sequence[str], value: Any) -> None:
        path = list(key_path)
        if not path:
            raise TransportError("update_configuration needs a key path")
        self._call(
            f"UpdateConfiguration {'/'.join(path)}",
            lambda: self._client.update_configuration_async(
                key_path=path[:-1],
                timestamp=dt.datetime.now(dt.timezone.utc),
                value_to_merge={path[-1]: value},
            ),
        )

    def on_configuration_update(self, handler: ConfigUpdateHandler) -> _Sub:
        safe = self._guard(handler, "configuration update")

        def on_event(event: Any) -> None:
            update = event.configuration_update_event
            if update is not None:
                safe(list(update.key_path or []))

        return self._stream(
            "SubscribeToConfigurationUpdate",
            lambda: self._client.subscribe_to_configuration_update_async(
                key_path=[],
                on_stream_event=on_event,
                on_stream_error=lambda e: self._stream_error("config", e),
            ),
        )

    def on_validate_configuration(self, validator: ConfigValidator) -> _Sub:
        from awsiot.greengrasscoreipc import model

        def on_event(event: Any) -> None:
            proposed = event.validate_configuration_update_event
            if proposed is None:
                return
            try:
                reason = validator(dict(proposed.configuration or {}))
            except Exception as exc:
                log.exception("configuration validator raised")
                reason = f"validator failed: {exc}"
            report = model.ConfigurationValidityReport(
                status=model.ConfigurationValidityStatus.ACCEPTED
                if reason is None
                else model.ConfigurationValidityStatus.REJECTED,
                deployment_id=proposed.deployment_id,
                message=reason,
            )
            try:
                self._call(
                    "SendConfigurationValidityReport",
                    lambda: self._client.send_configuration_validity_report_async(
                        configuration_validity_report=report
                    ),
                )
            except TransportError as exc:
                log.warning("%s", exc)

        return self._stream(
            "SubscribeToValidateConfigurationUpdates",
            lambda: self._client.subscribe_to_validate_configuration_updates_async(
                on_stream_event=on_event, on_stream_error=lambda e: self._stream_error("validate", e)
            ),
        )

    def on_component_update(self, handler: Callable[[Literal["pre", "post"], str], None]) -> _Sub:
        """SubscribeToComponentUpdates: `handler("pre" | "post", deployment_id)`. A "pre" must be
        answered with `defer_component_update` (the classic nucleus waits for it); nucleus lite does
        not serve the operation (TransportError)."""
        safe = self._guard(handler, "component update")

        def on_event(event: Any) -> None:
            if event.pre_update_event is not None:
                safe("pre", str(event.pre_update_event.deployment_id or ""))
            elif event.post_update_event is not None:
                safe("post", str(event.post_update_event.deployment_id or ""))

        return self._stream(
            "SubscribeToComponentUpdates",
            lambda: self._client.subscribe_to_component_updates_async(
                on_stream_event=on_event, on_stream_error=lambda e: self._stream_error("updates", e)
            ),
        )

    def defer_component_update(self, deployment_id: str, message: str, recheck_after_ms: int) -> None:
        """DeferComponentUpdate: 0 lets the deployment proceed, more asks again after that long."""
        self._call(
            "DeferComponentUpdate",
            lambda: self._client.defer_component_update_async(
                deployment_id=deployment_id, message=message, recheck_after_ms=recheck_after_ms
            ),
        )

    def update_state(self, state: Literal["RUNNING", "ERRORED"]) -> None:
        self._call(f"UpdateState {state}", lambda: self._client.update_state_async(state=state))

    def close(self) -> None:
        for sub in self._subs:
            sub.close()
        self._subs.clear()
        try:
            self._client.close(executor_wait=False)
        except Exception as exc:
            log.debug("closing the IPC client: %s", exc)
