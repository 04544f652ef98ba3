"""`MqttPubSub`: the `PubSub` seam over the awsiotsdk / awscrt MQTT 5 client.

Two ways to connect, one object:

* `MqttPubSub.connect_tcp(host, port)`: plain TCP, for the simulated core's local mosquitto broker.
* `MqttPubSub.connect_iot_core(endpoint, cert_filepath=..., pri_key_filepath=..., ca_filepath=...)`:
  mutual TLS to AWS IoT Core, built with `awsiot.mqtt5_client_builder.mtls_from_path`.

Both wait until the broker has accepted the connection (or raise `TransportError` with the reason).
Publishes wait for their completion (the socket write for QoS 0, the PUBACK for QoS 1) and raise
`TransportError` when the client is offline, so the caller can spool or fall back at once instead of
having an operation queued behind its back. Subscriptions accept any MQTT filter, including shared
subscriptions (`$share/{group}/{filter}`): the broker gives each message of a shared subscription to
one member of the group, which is how several cloud routers split the offload stream.

The CRT leaves Nagle's algorithm on (it has no TCP_NODELAY option), which with delayed ACKs costs
about 40 ms per QoS 1 exchange and per payload over one segment, even on loopback. On Linux the
client therefore sets TCP_NODELAY on its own connection after every (re)connect (`tcp_nodelay=True`).

Received messages are handed to handlers on one dispatcher thread per client, never on the CRT's
event-loop thread: a handler may publish (and wait for the PUBACK) without deadlocking the client.
The hand-off (the client's inbox) is unbounded unless `connect_tcp(inbox_max_messages=...,
inbox_max_bytes=...)` bounds it: then, while it is full, the CRT's callback waits for the dispatcher,
so the client stops reading its socket and the broker holds the rest (TCP backpressure, whatever the
broker makes of MQTT 5 flow control). That also holds up everything else on the same event-loop
thread, the PUBACKs of the client's own publishes included, so such a client is for receiving only
and gets its own event-loop thread (`own_event_loop=True`, or implied by the bound).
Handlers should still return quickly; long work belongs on the caller's own workers. A handler
subscribed with `inline=True` runs on the event-loop thread itself (no hand-off) and must not wait
on the client. The client
reconnects by itself (exponential back-off); after a reconnect without a resumed session it
subscribes again to everything it had subscribed to.

`target` is accepted for the `PubSub` protocol and ignored: an MQTT connection has one broker.
Over 500 lines because it is the one MQTT client: connecting, reconnecting, resubscribing and the
hand-off from the CRT's threads all act on one connection's state.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass
from typing import Any

from edgeinfer.transport.base import (
    Message,
    MessageHandler,
    MqttProperties,
    Target,
    TransportError,
    UnauthorizedError,
    topic_matches,
)

log = logging.getLogger(__name__)

__all__ = ["MqttPubSub", "MqttSubscription", "parse_broker", "set_tcp_nodelay", "subscription_topic_filter"]

ConnectionHandler = Callable[[bool], None]
"""Called with True when the client (re)connects and False when it loses the connection."""

_SUBACK_ERROR_MIN = 0x80
_NOT_AUTHORIZED = 0x87
INBOX_WAIT_LOG_S = 30.0  # a publish callback held this long by a full inbox says so, once
_CLOSE_SENTINEL: Any = object()
_ids = itertools.count(1)


# Connection failures that retrying within seconds will not cure.
_DEFINITE_FAILURES = ("CONNECTION_REFUSED", "DNS_INVALID_NAME", "DNS_QUERY_FAILED", "DNS_NO_ADDRESS")
REFUSED_GRACE_S = 2.0  # a broker started beside this client (a service unit) has that long


def parse_broker(text: str, default_port: int = 1883) -> tuple[str, int]:
    """`HOST:PORT` (or `HOST`, or `[v6]:PORT`) → (host, port). Raises ValueError with a clear message."""
    text = text.strip()
    if not text:
        raise ValueError("broker address is empty: expected HOST:PORT")
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, ""
    if not host:
        raise ValueError(f"broker address {text!r} has no host: expected HOST:PORT")
    if not port_text:
        return host, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"broker address {text!r} has a bad port: expected HOST:PORT with PORT 1-65535")
    return host, int(port_text)


def connect_client(
    *, broker: str | None, endpoint: str | None, cert: str | None, key: str | None, ca: str | None
) -> tuple[MqttPubSub, str]:
    """A command line's MQTT connection: IoT Core with an X.509 identity (`endpoint`), else a plain
    broker at `HOST:PORT`. Returns the client and where it connected; raises EdgeinferError with one line
    for anything the user can fix."""
    from edgeinfer.errors import EdgeinferError

    try:
        if endpoint:
            if not cert or not key:
                raise EdgeinferError("--endpoint needs --cert and --key (the client's X.509 identity)")
            client = MqttPubSub.connect_iot_core(
                endpoint, cert_filepath=cert, pri_key_filepath=key, ca_filepath=ca
            )
            return client, endpoint
        host, port = parse_broker(broker or "")
        return MqttPubSub.connect_tcp(host, port), f"{host}:{port}"
    except ValueError as exc:
        raise EdgeinferError(str(exc)) from None
    except TransportError as exc:
        raise EdgeinferError(f"cannot connect to the broker: {exc}") from None


def subscription_topic_filter(topic_filter: str) -> str:
    """The filter that incoming topics are matched against: `$share/group/a/+` → `a/+`."""
    if topic_filter.startswith("$share/"):
        parts = topic_filter.split("/", 2)
        if len(parts) == 3 and parts[1]:
            return parts[2]
    return topic_filter


@dataclass
class _Entry:
    id: int
    topic_filter: str  # as subscribed (may be `$share/...`)
    match_filter: str  # what incoming topics are matched against
    qos: int
    handler: MessageHandler
    inline: bool = False
    active: bool = True  # False once unsubscribed: what the inbox still holds for it is not run


def _run(message: Message, handlers: list[MessageHandler]) -> None:
    for handler in handlers:
        try:
            handler(message)
        except Exception:
            log.exception("handler for %s failed", message.topic)


class _Inbox:
    """The CRT threads' hand-off to the dispatcher: FIFO, optionally bounded by messages and bytes.

    `put` (a message) waits while the inbox is full; `put_control` (connection events, the close
    sentinel) never waits and is not counted. `close()` releases the waiting producers: what they
    held is dropped (unacknowledged, so a broker that keeps the session sends it again)."""

    def __init__(self, max_messages: int | None = None, max_bytes: int | None = None) -> None:
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._items: collections.deque[tuple[Any, int]] = collections.deque()
        self._lock = threading.Lock()
        self._readable = threading.Condition(self._lock)
        self._room = threading.Condition(self._lock)
        self._consumer_waiting = False
        self._producers_waiting = 0
        self._closed = False
        self.messages = 0  # held now
        self.bytes = 0
        self.peak_messages = 0
        self.peak_bytes = 0
        self.waits = 0  # puts that found the inbox full

    def _full(self, size: int) -> bool:
        if self.messages == 0:
            return False  # one message always fits, however large
        if self.max_messages is not None and self.messages >= self.max_messages:
            return True
        return self.max_bytes is not None and self.bytes + size > self.max_bytes

    def put(self, item: Any, size: int, describe: str = "") -> bool:
        """Append `item`; False when the inbox was closed instead (the item is dropped)."""
        with self._lock:
            if self._full(size) and not self._closed:
                self.waits += 1
                self._producers_waiting += 1
                since = time.monotonic()
                logged = False
                try:
                    while self._full(size) and not self._closed:
                        self._room.wait(1.0)
                        waited = time.monotonic() - since
                        if waited >= INBOX_WAIT_LOG_S and not logged:
                            logged = True
                            log.warning(
                                "%s: inbox full (%d messages, %d bytes) for %.0f s: its handlers are "
                                "not draining it; the broker holds what follows",
                                describe,
                                self.messages,
                                self.bytes,
                                waited,
                            )
                finally:
                    self._producers_waiting -= 1
            if self._closed:
                return False
            self._items.append((item, size))
            self.messages += 1
            self.bytes += size
            self.peak_messages = max(self.peak_messages, self.messages)
            self.peak_bytes = max(self.peak_bytes, self.bytes)
            if self._consumer_waiting:
                self._readable.notify()
        return True

    def put_control(self, item: Any) -> None:
        with self._lock:
            self._items.append((item, -1))
            if self._consumer_waiting:
                self._readable.notify()

    def get(self) -> Any:
        with self._lock:
            while not self._items:
                self._consumer_waiting = True
                self._readable.wait()
                self._consumer_waiting = False
            item, size = self._items.popleft()
            if size >= 0:
                self.messages -= 1
                self.bytes -= size
                if self._producers_waiting:
                    self._room.notify()
            return item

    def qsize(self) -> int:
        with self._lock:
            return len(self._items)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._room.notify_all()


class MqttSubscription:
    """Returned by `MqttPubSub.subscribe`; `close()` unsubscribes (once the last handler goes)."""

    def __init__(self, owner: MqttPubSub, entry: _Entry) -> None:
        self._owner = owner
        self._entry = entry
        self._closed = False

    @property
    def topic_filter(self) -> str:
        return self._entry.topic_filter

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._owner._unsubscribe(self._entry)


class MqttPubSub:
    """A connected MQTT 5 client. Build it with `connect_tcp` or `connect_iot_core`; `close()` it."""

    def __init__(
        self,
        build_client: Callable[[dict[str, Any]], Any],
        *,
        client_id: str,
        describe: str,
        operation_timeout_s: float = 10.0,
        peer: tuple[str, int] | None = None,
        tcp_nodelay: bool = True,
        inbox_max_messages: int | None = None,
        inbox_max_bytes: int | None = None,
    ) -> None:
        """Low-level: `build_client(callbacks)` returns an unstarted `awscrt.mqtt5.Client` wired to
        the callbacks given. Use the `connect_*` class methods instead."""
        self.client_id = client_id
        self.describe = describe
        self.operation_timeout_s = operation_timeout_s
        self._peer = _resolve(peer) if peer is not None and tcp_nodelay else None
        self._lock = threading.Lock()
        self._entries: list[_Entry] = []
        self._connected = threading.Event()
        self._stopped = threading.Event()
        self._closed = False
        self._last_error: str | None = None
        self._sub_ids: dict[str, int] = {}  # topic filter -> MQTT 5 subscription identifier
        self._sub_ids_available = False
        self._connection_handlers: list[ConnectionHandler] = []
        self._ack_when_handled = False  # see `connect_tcp(receive_maximum=...)`
        self._bootstrap: Any = None  # the client's own event loop, when it has one
        self._inbox = _Inbox(inbox_max_messages, inbox_max_bytes)
        self._dispatcher = threading.Thread(
            target=self._dispatch_loop, name=f"mqtt-dispatch-{client_id}", daemon=True
        )
        self._dispatcher.start()
        callbacks = {
            "on_publish_received": self._on_publish_received,
            "on_lifecycle_connection_success": self._on_connection_success,
            "on_lifecycle_connection_failure": self._on_connection_failure,
            "on_lifecycle_disconnection": self._on_disconnection,
            "on_lifecycle_stopped": self._on_stopped,
        }
        self._client = build_client(callbacks)

    # ------------------------------------------------------------------------------ construction

    @classmethod
    def connect_tcp(
        cls,
        host: str,
        port: int,
        *,
        client_id: str | None = None,
        timeout_s: float = 10.0,
        keep_alive_interval_sec: int = 30,
        min_reconnect_delay_ms: int = 200,
        max_reconnect_delay_ms: int = 5000,
        username: str | None = None,
        password: str | None = None,
        tcp_nodelay: bool = True,
        receive_maximum: int | None = None,
        ping_timeout_ms: int | None = None,
        inbox_max_messages: int | None = None,
        inbox_max_bytes: int | None = None,
        own_event_loop: bool = False,
        operation_timeout_s: float = 10.0,
    ) -> MqttPubSub:
        """Plain TCP to a local broker (the simulated core's mosquitto). No TLS: loopback/LAN only.

        `receive_maximum` (MQTT 5 flow control): the broker sends at most that many QoS 1 messages
        that this client has not acknowledged, and the client acknowledges each one only once its
        handlers have run — so handlers that wait (a bounded hand-off downstream) keep the backlog in
        the broker, while the client's own thread stays free for keep-alives (and for the PUBACKs of
        its own publishes). A broker may ignore it: mosquitto 2.0.11 holds to it only until
        acknowledgements flow, and then sends several hundred more. `ping_timeout_ms`: how long a
        keep-alive's answer may take (it waits in the socket behind whatever the broker sent first).

        `inbox_max_messages` / `inbox_max_bytes` bound what the client holds between its socket and
        its handlers (see the module's docstring): beyond it the broker holds the rest. Either bound
        gives the client its own CRT event-loop thread, as `own_event_loop=True` does, so that a
        held inbox holds up no other connection of this process. `operation_timeout_s`: how long a
        subscribe waits for its SUBACK (which, on a held connection, waits behind the backlog)."""
        from awscrt import io, mqtt5

        cid = client_id or _default_client_id()
        bootstrap = None
        if own_event_loop or inbox_max_messages is not None or inbox_max_bytes is not None:
            group = io.EventLoopGroup(1)
            bootstrap = io.ClientBootstrap(group, io.DefaultHostResolver(group))

        def build(cb: dict[str, Any]) -> Any:
            options = mqtt5.ClientOptions(
                host_name=host,
                port=int(port),
                bootstrap=bootstrap,
                connect_options=mqtt5.ConnectPacket(
                    client_id=cid,
                    keep_alive_interval_sec=keep_alive_interval_sec,
                    username=username,
                    password=password.encode() if password is not None else None,
                    receive_maximum=receive_maximum,
                ),
                session_behavior=mqtt5.ClientSessionBehaviorType.CLEAN,
                extended_validation_and_flow_control_options=(
                    mqtt5.ExtendedValidationAndFlowControlOptions.NONE
                ),
                offline_queue_behavior=mqtt5.ClientOperationQueueBehaviorType.FAIL_ALL_ON_DISCONNECT,
                min_reconnect_delay_ms=min_reconnect_delay_ms,
                max_reconnect_delay_ms=max_reconnect_delay_ms,
                connack_timeout_ms=int(timeout_s * 1000),
                ping_timeout_ms=ping_timeout_ms,
                on_publish_callback_fn=cb["on_publish_received"],
                on_lifecycle_event_connection_success_fn=cb["on_lifecycle_connection_success"],
                on_lifecycle_event_connection_failure_fn=cb["on_lifecycle_connection_failure"],
                on_lifecycle_event_disconnection_fn=cb["on_lifecycle_disconnection"],
                on_lifecycle_event_stopped_fn=cb["on_lifecycle_stopped"],
                disable_metrics=True,
            )
            return mqtt5.Client(options)

        self = cls(
            build,
            client_id=cid,
            describe=f"mqtt://{host}:{port}",
            peer=(host, port),
            tcp_nodelay=tcp_nodelay,
            operation_timeout_s=operation_timeout_s,
            inbox_max_messages=inbox_max_messages,
            inbox_max_bytes=inbox_max_bytes,
        )
        self._bootstrap = bootstrap  # the client's event loop lives as long as the client
        self._ack_when_handled = receive_maximum is not None
        self.start(timeout_s)
        return self

    @classmethod
    def connect_iot_core(
        cls,
        endpoint: str,
        *,
        cert_filepath: str,
        pri_key_filepath: str,
        ca_filepath: str | None = None,
        client_id: str | None = None,
        port: int = 8883,
        timeout_s: float = 20.0,
        keep_alive_interval_sec: int = 30,
        tcp_nodelay: bool = True,
        receive_maximum: int | None = None,
    ) -> MqttPubSub:
        """Mutual TLS to AWS IoT Core (`xxxx-ats.iot.<region>.amazonaws.com`) with an X.509 cert/key.
        `receive_maximum`: as for `connect_tcp` (acknowledged once the handlers have run)."""
        for label, path in (("certificate", cert_filepath), ("private key", pri_key_filepath)):
            if not os.path.isfile(path):
                raise TransportError(f"{label} file {path} does not exist")
        if ca_filepath is not None and not os.path.isfile(ca_filepath):
            raise TransportError(f"CA file {ca_filepath} does not exist")
        from awscrt import mqtt5
        from awsiot import mqtt5_client_builder

        cid = client_id or _default_client_id()

        def build(cb: dict[str, Any]) -> Any:
            try:
                return mqtt5_client_builder.mtls_from_path(
                    endpoint=endpoint,
                    port=port,
                    cert_filepath=cert_filepath,
                    pri_key_filepath=pri_key_filepath,
                    ca_filepath=ca_filepath,
                    client_id=cid,
                    keep_alive_interval_sec=keep_alive_interval_sec,
                    receive_maximum=receive_maximum,
                    session_behavior=mqtt5.ClientSessionBehaviorType.CLEAN,
                    offline_queue_behavior=mqtt5.ClientOperationQueueBehaviorType.FAIL_ALL_ON_DISCONNECT,
                    connack_timeout_ms=int(timeout_s * 1000),
                    **cb,
                )
            except Exception as exc:  # awscrt raises its own errors for unreadable certs/keys
                raise TransportError(f"cannot set up TLS for {endpoint}: {exc}") from exc

        self = cls(
            build,
            client_id=cid,
            describe=f"mqtts://{endpoint}:{port}",
            peer=(endpoint, port),
            tcp_nodelay=tcp_nodelay,
        )
        self._ack_when_handled = receive_maximum is not None
        self.start(timeout_s)
        return self

    def start(self, timeout_s: float = 10.0) -> None:
        """Start the client and wait until the broker accepted the connection. A refusal that lasts
        `REFUSED_GRACE_S` (nothing listens there, the name does not resolve) fails then, not after the
        whole `timeout_s`: a broker that is just starting has that long to come up."""
        self._client.start()
        t0 = time.monotonic()
        connected = False
        while not connected and time.monotonic() - t0 < timeout_s:
            connected = self.wait_connected(min(0.1, max(0.0, timeout_s - (time.monotonic() - t0))))
            refused = any(code in (self._last_error or "") for code in _DEFINITE_FAILURES)
            if not connected and refused and time.monotonic() - t0 >= REFUSED_GRACE_S:
                break
            if self._closed:
                break
        if not connected:
            reason = self._last_error or "no answer"
            waited = time.monotonic() - t0
            self._shutdown(timeout_s=2.0)
            raise TransportError(f"cannot connect to {self.describe} within {waited:.1f} s: {reason}")
        log.debug("connected to %s as %s", self.describe, self.client_id)

    # ------------------------------------------------------------------------------------ state

    @property
    def is_connected(self) -> bool:
        return self._connected.is_set()

    def wait_connected(self, timeout_s: float | None = None) -> bool:
        """True once connected (now or within `timeout_s`); False if closed or still offline."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._closed:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return self._connected.is_set()
            step = 0.05 if remaining is None else min(0.05, remaining)
            if self._connected.wait(step):
                return True
        return False

    def inbox_stats(self) -> dict[str, int]:
        """What the inbox holds now and at most so far (messages, payload bytes), and how many
        received messages had to wait for room."""
        box = self._inbox
        return {
            "messages": box.messages,
            "bytes": box.bytes,
            "peak_messages": box.peak_messages,
            "peak_bytes": box.peak_bytes,
            "waits": box.waits,
        }

    def on_connection_change(self, handler: ConnectionHandler) -> None:
        """`handler(True)` on every (re)connect, `handler(False)` on every loss (dispatcher thread)."""
        self._connection_handlers.append(handler)

    # --------------------------------------------------------------------------------- PubSub API

    def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        target: Target = "iot",
        qos: int = 0,
        wait: bool = True,
        properties: MqttProperties | None = None,
    ) -> None:
        """Publish and wait for completion (QoS 0: written; QoS 1: PUBACK). TransportError otherwise.

        `wait=False` hands the message to the client and returns at once (still TransportError when
        offline); a later failure is only logged. For senders that must not spend a round trip.
        `properties` go out as the publish's MQTT 5 properties."""
        from awscrt import mqtt5

        if self._closed:
            raise TransportError(f"publish to {topic} failed: client is closed")
        if not self._connected.is_set():
            raise TransportError(f"publish to {topic} failed: not connected to {self.describe}")
        packet = mqtt5.PublishPacket(payload=bytes(payload), qos=mqtt5.QoS(_qos(qos)), topic=topic)
        if properties is not None:
            _set_properties(packet, properties)
        try:
            future = self._client.publish(packet)
        except Exception as exc:
            raise TransportError(f"publish to {topic} failed: {exc}") from exc
        if not wait:
            future.add_done_callback(lambda f: self._log_failure(f"publish to {topic}", f))
            return
        done = self._wait(future, f"publish to {topic}")
        puback = getattr(done, "puback", None)
        code = getattr(puback, "reason_code", None)
        if code is not None and int(code) >= _SUBACK_ERROR_MIN:
            err = UnauthorizedError if int(code) == _NOT_AUTHORIZED else TransportError
            raise err(f"publish to {topic} refused by {self.describe}: {_name(code)}")

    def publish_future(
        self,
        topic: str,
        payload: bytes,
        *,
        qos: int = 0,
        retain: bool = False,
        properties: MqttProperties | None = None,
    ) -> Future[None]:
        """Hand a publish to the client, in call order, and return its completion (QoS 0: written;
        QoS 1: PUBACK) as a future that fails with TransportError. TransportError at once when
        closed or offline. For senders that keep several publishes in flight and must know when
        each one is done (the simulated core's IoT bridge)."""
        from awscrt import mqtt5

        if self._closed:
            raise TransportError(f"publish to {topic} failed: client is closed")
        if not self._connected.is_set():
            raise TransportError(f"publish to {topic} failed: not connected to {self.describe}")
        packet = mqtt5.PublishPacket(
            payload=bytes(payload), qos=mqtt5.QoS(_qos(qos)), topic=topic, retain=retain
        )
        if properties is not None:
            _set_properties(packet, properties)
        try:
            crt_future = self._client.publish(packet)
        except Exception as exc:
            raise TransportError(f"publish to {topic} failed: {exc}") from exc
        out: Future[None] = Future()

        def completed(done: Future[Any]) -> None:  # on the CRT's thread: only settle the future
            try:
                puback = getattr(done.result(), "puback", None)
            except Exception as exc:
                out.set_exception(TransportError(f"publish to {topic} failed: {exc}"))
                return
            code = getattr(puback, "reason_code", None)
            if code is not None and int(code) >= _SUBACK_ERROR_MIN:
                err = UnauthorizedError if int(code) == _NOT_AUTHORIZED else TransportError
                out.set_exception(err(f"publish to {topic} refused by {self.describe}: {_name(code)}"))
                return
            out.set_result(None)

        crt_future.add_done_callback(completed)
        return out

    def subscribe(
        self,
        topic: str,
        handler: MessageHandler,
        *,
        target: Target = "iot",
        qos: int = 0,
        inline: bool = False,
    ) -> MqttSubscription:
        """Subscribe `handler` to an MQTT filter (`a/+/b`, `a/#`, `$share/group/a/+`)."""
        if self._closed:
            raise TransportError(f"subscribe to {topic} failed: client is closed")
        entry = _Entry(next(_ids), topic, subscription_topic_filter(topic), _qos(qos), handler, inline)
        with self._lock:
            already = any(e.topic_filter == topic for e in self._entries)
            self._entries.append(entry)
            self._sub_ids.setdefault(topic, next(_ids))
        if not already:
            try:
                self._send_subscribe(topic, entry.qos, wait=True)
            except TransportError:
                with self._lock:
                    self._entries.remove(entry)
                raise
        return MqttSubscription(self, entry)

    def close(self) -> None:
        """Disconnect cleanly and stop the dispatcher. Idempotent."""
        if self._closed:
            return
        self._shutdown(timeout_s=5.0)

    def __enter__(self) -> MqttPubSub:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------------------------- internals

    def _shutdown(self, timeout_s: float) -> None:
        self._closed = True
        self._inbox.close()  # a callback held by a full inbox lets go, so that the client can stop
        try:
            self._client.stop()
        except Exception as exc:
            log.debug("stop failed: %s", exc)
        self._stopped.wait(timeout_s)
        self._connected.clear()
        self._inbox.put_control(_CLOSE_SENTINEL)
        if threading.current_thread() is not self._dispatcher:
            self._dispatcher.join(timeout_s)

    def _wait(self, future: Future[Any], what: str) -> Any:
        try:
            return future.result(self.operation_timeout_s)
        except FutureTimeoutError:
            raise TransportError(f"{what} timed out after {self.operation_timeout_s:g} s") from None
        except Exception as exc:
            raise TransportError(f"{what} failed: {exc}") from exc

    def _send_subscribe(self, topic_filter: str, qos: int, *, wait: bool) -> None:
        from awscrt import mqtt5

        # With subscription identifiers the broker tells which subscription a message matched, so
        # overlapping filters (`a/x` and `a/#`) each deliver once to their own handlers.
        packet = mqtt5.SubscribePacket(
            subscriptions=[mqtt5.Subscription(topic_filter=topic_filter, qos=mqtt5.QoS(qos))],
            subscription_identifier=self._sub_ids.get(topic_filter) if self._sub_ids_available else None,
        )
        try:
            future = self._client.subscribe(packet)
        except Exception as exc:
            raise TransportError(f"subscribe to {topic_filter} failed: {exc}") from exc
        if not wait:
            future.add_done_callback(lambda f: self._log_resubscribe(topic_filter, f))
            return
        suback = self._wait(future, f"subscribe to {topic_filter}")
        for code in suback.reason_codes or ():
            if int(code) >= _SUBACK_ERROR_MIN:
                err = UnauthorizedError if int(code) == _NOT_AUTHORIZED else TransportError
                raise err(f"subscribe to {topic_filter} refused by {self.describe}: {_name(code)}")

    @staticmethod
    def _log_resubscribe(topic_filter: str, future: Future[Any]) -> None:
        exc = future.exception()
        if exc is not None:
            log.warning("re-subscribe to %s failed: %s", topic_filter, exc)

    @staticmethod
    def _log_failure(what: str, future: Future[Any]) -> None:
        exc = future.exception()
        if exc is not None:
            log.warning("%s failed: %s", what, exc)

    def _unsubscribe(self, entry: _Entry) -> None:
        from awscrt import mqtt5

        entry.active = False
        with self._lock:
            if entry in self._entries:
                self._entries.remove(entry)
            still_used = any(e.topic_filter == entry.topic_filter for e in self._entries)
            if not still_used:
                self._sub_ids.pop(entry.topic_filter, None)
        if still_used or self._closed or not self._connected.is_set():
            return
        try:
            future = self._client.unsubscribe(mqtt5.UnsubscribePacket(topic_filters=[entry.topic_filter]))
            self._wait(future, f"unsubscribe from {entry.topic_filter}")
        except TransportError as exc:
            log.debug("%s", exc)

    # CRT callbacks: these run on the CRT event-loop thread and must not block.

    def _on_publish_received(self, data: Any) -> None:
        packet = data.publish_packet
        payload = packet.payload
        if isinstance(payload, str):
            payload = payload.encode("utf-8")
        ids = tuple(packet.subscription_identifiers or ())
        message = Message(packet.topic, bytes(payload or b""), "iot", _properties(packet))
        entries = self._matching(message, ids)
        queued = [e for e in entries if not e.inline]
        if len(queued) < len(entries):
            _run(message, [e.handler for e in entries if e.inline])
        if queued:
            ack = None
            if self._ack_when_handled:
                take = getattr(data, "acquire_publish_acknowledgement_control", None)
                if take is not None:
                    ack = take()  # sent by the dispatcher once the handlers have run
            # Waits while the inbox is full (when bounded): this thread then reads no more.
            self._inbox.put((message, queued, ack), len(message.payload), self.client_id)

    def _on_connection_success(self, data: Any) -> None:
        session_present = bool(getattr(getattr(data, "connack_packet", None), "session_present", False))
        settings = getattr(data, "negotiated_settings", None)
        self._sub_ids_available = bool(getattr(settings, "subscription_identifiers_available", False))
        self._last_error = None
        if self._peer is not None:
            set_tcp_nodelay(*self._peer)
        self._connected.set()
        if not session_present:
            with self._lock:
                filters = {e.topic_filter: e.qos for e in self._entries}
            for topic_filter, qos in filters.items():
                try:
                    self._send_subscribe(topic_filter, qos, wait=False)
                except TransportError as exc:
                    log.warning("%s", exc)
        self._inbox.put_control(True)

    def _on_connection_failure(self, data: Any) -> None:
        self._last_error = str(getattr(data, "exception", None) or "connection refused")
        log.debug("connection to %s failed: %s", self.describe, self._last_error)

    def _on_disconnection(self, data: Any) -> None:
        was = self._connected.is_set()
        self._connected.clear()
        self._last_error = str(getattr(data, "exception", None) or "disconnected")
        if was and not self._closed:
            log.warning("lost the connection to %s: %s", self.describe, self._last_error)
            self._inbox.put_control(False)

    def _on_stopped(self, data: Any) -> None:
        self._connected.clear()
        self._stopped.set()

    def _dispatch_loop(self) -> None:
        while True:
            item = self._inbox.get()
            if item is _CLOSE_SENTINEL:
                return
            if isinstance(item, bool):
                for conn_handler in list(self._connection_handlers):
                    try:
                        conn_handler(item)
                    except Exception:
                        log.exception("connection handler failed")
                continue
            message, entries, ack = item
            _run(message, [e.handler for e in entries if e.active])
            if ack is not None:
                try:
                    self._client.invoke_publish_acknowledgement(ack)
                except Exception as exc:  # the connection went meanwhile: the broker sends it again
                    log.debug("PUBACK for %s not sent: %s", message.topic, exc)

    def _matching(self, message: Message, ids: tuple[int, ...]) -> list[_Entry]:
        with self._lock:
            if ids:
                return [e for e in self._entries if self._sub_ids.get(e.topic_filter) in ids]
            return [e for e in self._entries if topic_matches(e.match_filter, message.topic)]


def _resolve(peer: tuple[str, int]) -> tuple[frozenset[str], int] | None:
    host, port = peer
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:  # unresolvable now: match on the port alone
        return frozenset(), int(port)
    return frozenset(str(info[4][0]) for info in infos), int(port)


def set_tcp_nodelay(addresses: frozenset[str], port: int) -> int:
    """TCP_NODELAY on this process's TCP sockets connected to (one of `addresses`, `port`).

    No addresses: every socket connected to `port`. Returns how many sockets it set; Linux only.
    """
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:  # not Linux: leave Nagle on
        return 0
    done = 0
    for fd in fds:
        try:
            sock = socket.socket(fileno=fd)
        except OSError:
            continue  # not a socket (or already closed)
        try:
            if sock.type == socket.SOCK_STREAM and sock.family in (socket.AF_INET, socket.AF_INET6):
                peer = sock.getpeername()
                if peer[1] == port and (not addresses or peer[0] in addresses):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    done += 1
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sock.detach()
    return done


def _properties(packet: Any) -> MqttProperties | None:
    """The MQTT 5 properties of a received `awscrt.mqtt5.PublishPacket` (None when it has none)."""
    correlation = packet.correlation_data_bytes
    if isinstance(correlation, str):
        correlation = correlation.encode()
    fmt = packet.payload_format_indicator
    props = MqttProperties(
        content_type=packet.content_type or None,
        correlation_data=bytes(correlation) if correlation is not None else None,
        response_topic=packet.response_topic or None,
        user_properties=tuple((str(p.name), str(p.value)) for p in packet.user_properties or ()),
        message_expiry_s=packet.message_expiry_interval_sec,
        payload_format=None if fmt is None else "utf8" if int(fmt) == 1 else "bytes",
    )
    return None if props == MqttProperties() else props


def _set_properties(packet: Any, props: MqttProperties) -> None:
    from awscrt import mqtt5

    packet.content_type = props.content_type
    packet.correlation_data_bytes = props.correlation_data
    packet.response_topic = props.response_topic
    packet.message_expiry_interval_sec = props.message_expiry_s
    if props.user_properties:
        packet.user_properties = [mqtt5.UserProperty(name=k, value=v) for k, v in props.user_properties]
    if props.payload_format is not None:
        packet.payload_format_indicator = (
            mqtt5.PayloadFormatIndicator.AWS_MQTT5_PFI_UTF8
            if props.payload_format == "utf8"
            else mqtt5.PayloadFormatIndicator.AWS_MQTT5_PFI_BYTES
        )


def _qos(qos: int) -> int:
    if qos not in (0, 1):
        raise TransportError(f"QoS {qos} is not supported: use 0 or 1 (AWS IoT Core has no QoS 2)")
    return qos


def _name(code: Any) -> str:
    return getattr(code, "name", None) or str(code)


def _default_client_id() -> str:
    return f"edgeinfer-{os.getpid()}-{uuid.uuid4().hex[:8]}"
