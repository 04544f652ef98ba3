"""The simulated core's connection to "IoT Core" (the local mosquitto), with the nucleus's limits.

One `edgeinfer.transport.mqtt.MqttPubSub` carries everything. Publishes are checked as the classic
nucleus's `MqttClient.publish` checks them, then queued in a spooler like its in-memory `Spool`
(`mqtt.spooler.maxSizeInBytes`, 2.5 MiB: a full spool first drops queued QoS 0 messages, then refuses)
and sent in order with at most `maxInFlightPublishes` (5) unacknowledged. The publish is accepted once
spooled, as on the nucleus; offline, QoS 1 messages wait in the spool and QoS 0 ones are refused. A
profile without a spooler (nucleus lite) publishes directly and answers when the broker has.

Messages from IoT Core reach the nucleus's event loop through `LoopHandoff`, which holds at most
`limit` undelivered callbacks and makes the MQTT client's dispatcher wait beyond that; the client
acknowledges a QoS 1 message only once it is handed over, and MQTT 5 flow control (`RECEIVE_MAXIMUM`)
keeps the broker from sending more unacknowledged ones, so a flood from the cloud waits in the broker
instead of growing the core's memory. (mosquitto 2.0.11 holds to that only until acknowledgements
flow: then the MQTT client's inbox holds what it sent ahead. Holding the client's thread instead
would bound it, but the PUBACKs of the bridge's own publishes wait behind it too: measured, results
piled up in the spool until it refused them.) Each
event is written to the subscriber's IPC connection only once that has room
(`Stream.send_event_drained`).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from edgeinfer.greengrass.nuclei import NucleusProfile
from edgeinfer.transport.base import Message, MqttProperties, TransportError
from edgeinfer.transport.mqtt import MqttPubSub

log = logging.getLogger(__name__)

__all__ = ["IotBridge", "LoopHandoff", "PublishRefusedError"]

# MQTT 5 flow control on the connection to IoT Core: at most this many QoS 1 messages from the cloud
# are unacknowledged, each acknowledged once handed to the event loop (MqttPubSub(receive_maximum)).
RECEIVE_MAXIMUM = 64
PING_TIMEOUT_MS = 300_000
KEEP_ALIVE_S = 600  # the CRT holds the ping timeout under the keep-alive interval
MAX_PUBLISH_RETRY = 100  # mqtt.maxPublishRetry: a spooled message is dropped after this many failures
_REQUEST_EXCEPTION = "com.aws.greengrass.mqttclient.MqttRequestException"
_SPOOLER_EXCEPTION = "com.aws.greengrass.mqttclient.spool.SpoolerStoreException"


class PublishRefusedError(Exception):
    """The nucleus refuses this publish before it reaches the network; the text is its reason."""


@dataclass(eq=False)
class _Spooled:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: MqttProperties | None
    delivered: Future[None] = field(default_factory=Future)
    retries: int = 0


@dataclass(eq=False)
class _Sub:
    topic_filter: str
    handler: Callable[[Message], None]
    qos: int
    live: Any = None  # the MqttSubscription while connected


class LoopHandoff:
    """Runs callbacks on an asyncio loop from other threads, with at most `limit` waiting to run."""

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int = 1024) -> None:
        self.loop = loop
        self._slots = threading.BoundedSemaphore(limit)

    def call(self, fn: Callable[..., None], *args: Any) -> None:
        """Queue `fn(*args)` on the loop; blocks while `limit` earlier ones have not run yet."""
        self._slots.acquire()

        def run() -> None:
            try:
                fn(*args)
            finally:
                self._slots.release()

        try:
            self.loop.call_soon_threadsafe(run)
        except RuntimeError:  # the loop is closed: the core is stopping
            self._slots.release()

    def submit(self, fn: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> None:
        """`call` for a coroutine: its slot is held until it has finished, so what it waits for (an
        IPC client reading its events) holds up the caller too. Gives up once the loop has stopped."""
        while not self._slots.acquire(timeout=0.5):
            if self.loop.is_closed() or not self.loop.is_running():
                return

        def run() -> None:
            task = asyncio.ensure_future(fn(*args))
            task.add_done_callback(lambda _t: self._slots.release())

        try:
            self.loop.call_soon_threadsafe(run)
        except RuntimeError:
            self._slots.release()


class IotBridge:
    """Publish to and subscribe on IoT Core as the nucleus does. Thread-safe."""

    def __init__(
        self, host: str, port: int, *, client_id: str, profile: NucleusProfile, timeout_s: float = 10.0
    ) -> None:
        self.host, self.port, self.client_id = host, port, client_id
        self.profile = profile
        self.timeout_s = timeout_s
        self._cond = threading.Condition()
        self._spool: collections.deque[_Spooled] = collections.deque()
        self._spool_bytes = 0
        self._in_flight = 0
        self._offline = False
        self._closed = False
        self._subs: list[_Sub] = []
        self._client: MqttPubSub | None = self._connect()
        self._sender: threading.Thread | None = None
        if profile.spooler_bytes is not None:
            self._sender = threading.Thread(target=self._send_loop, name="ggsim-spooler", daemon=True)
            self._sender.start()

    def _connect(self) -> MqttPubSub:
        return MqttPubSub.connect_tcp(
            self.host,
            self.port,
            client_id=self.client_id,
            timeout_s=self.timeout_s,
            receive_maximum=RECEIVE_MAXIMUM,
            # Under a flood the keep-alive's answer waits in the socket behind the backlog: a
            # disconnect there would lose what the broker had handed over (a clean session).
            ping_timeout_ms=PING_TIMEOUT_MS,
            keep_alive_interval_sec=KEEP_ALIVE_S,
        )

    # ------------------------------------------------------------------------------ state

    @property
    def online(self) -> bool:
        client = self._client
        return not self._offline and client is not None and client.is_connected

    def pending(self) -> tuple[int, int]:
        """(messages, payload bytes) spooled and not yet acknowledged."""
        with self._cond:
            return len(self._spool) + self._in_flight, self._spool_bytes

    def in_flight(self) -> int:
        """Publishes sent and not yet acknowledged (at most `maxInFlightPublishes`)."""
        with self._cond:
            return self._in_flight

    def go_offline(self) -> None:
        """Drop the connection until `go_online()`; queued QoS 0 messages go, as on the nucleus."""
        with self._cond:
            self._offline = True
            client, self._client = self._client, None
            for item in [m for m in self._spool if m.qos == 0]:
                self._spool.remove(item)
                self._forget(item, PublishRefusedError("Device is offline. Dropping QoS 0 message."))
            for sub in self._subs:
                sub.live = None
        if client is not None:
            client.close()

    def go_online(self) -> None:
        """Connect again, subscribe again to every filter, and send what the spool holds."""
        client = self._connect()
        with self._cond:
            subs = list(self._subs)
        for sub in subs:
            sub.live = client.subscribe(sub.topic_filter, sub.handler, qos=sub.qos)
        with self._cond:
            self._client = client
            self._offline = False
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            client, self._client = self._client, None
            self._cond.notify_all()
        if client is not None:
            client.close()
        if self._sender is not None:
            self._sender.join(5)

    # ------------------------------------------------------------------------------ publish

    def publish(
        self,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool = False,
        properties: MqttProperties | None = None,
    ) -> Future[None]:
        """Accept a publish: the future is done once it is spooled (or, without a spooler, sent).

        Raises PublishRefusedError with the nucleus's reason when it refuses the message up front.
        """
        limit = self.profile.mqtt_max_message_bytes
        if len(payload) >= limit:
            raise PublishRefusedError(
                f"{_REQUEST_EXCEPTION}: The publishing message size {len(payload)} bytes exceeds the "
                f"configured limit of {limit} bytes"
            )
        if "#" in topic or "+" in topic:
            raise PublishRefusedError(
                f"{_REQUEST_EXCEPTION}: The topic of publish request should not contain wildcard "
                "characters of '#' or '+'"
            )
        if self.profile.spooler_bytes is None:
            client = self._client
            if client is None or self._offline:
                raise PublishRefusedError("IoT Core is not connected")
            try:
                return client.publish_future(topic, payload, qos=qos, retain=retain, properties=properties)
            except TransportError as exc:
                raise PublishRefusedError(str(exc)) from None
        item = _Spooled(topic, bytes(payload), qos, retain, properties)
        with self._cond:
            if self._offline and qos == 0:
                raise PublishRefusedError(f"{_SPOOLER_EXCEPTION}: Device is offline. Dropping QoS 0 message.")
            self._add(item)
            self._cond.notify_all()
        accepted: Future[None] = Future()
        accepted.set_result(None)
        return accepted

    def _add(self, item: _Spooled) -> None:
        cap = self.profile.spooler_bytes or 0
        size = len(item.payload)
        if size > cap:
            raise PublishRefusedError(
                f"{_SPOOLER_EXCEPTION}: Message is larger than the size of message spool."
            )
        if self._spool_bytes + size > cap:
            for old in [m for m in self._spool if m.qos == 0]:
                if self._spool_bytes + size <= cap:
                    break
                self._spool.remove(old)
                self._forget(old, PublishRefusedError("dropped from a full spool"))
        if self._spool_bytes + size > cap:
            raise PublishRefusedError(
                f"{_SPOOLER_EXCEPTION}: Message spool is full. Message could not be added."
            )
        self._spool_bytes += size
        self._spool.append(item)

    def _forget(self, item: _Spooled, why: BaseException | None) -> None:
        """Called with the lock held: the message leaves the spool for good."""
        self._spool_bytes -= len(item.payload)
        if why is None:
            item.delivered.set_result(None)
        else:
            item.delivered.set_exception(why)

    def _send_loop(self) -> None:
        limit = self.profile.max_in_flight_publishes or 1
        while True:
            with self._cond:
                while not self._closed and not (
                    self._spool and self._client is not None and not self._offline and self._in_flight < limit
                ):
                    self._cond.wait(0.5)
                if self._closed:
                    return
                item = self._spool.popleft()
                client = self._client
                self._in_flight += 1
            assert client is not None
            try:
                future = client.publish_future(
                    item.topic, item.payload, qos=item.qos, retain=item.retain, properties=item.properties
                )
            except TransportError:  # not sent (the client is reconnecting): not a try, wait a little
                with self._cond:
                    self._in_flight -= 1
                    self._spool.appendleft(item)
                    self._cond.wait(0.1)
                continue
            future.add_done_callback(functools.partial(self._settled, item))

    def _settled(self, item: _Spooled, future: Future[None]) -> None:
        self._settle(item, future.exception())

    def _settle(self, item: _Spooled, error: BaseException | None) -> None:
        with self._cond:
            self._in_flight -= 1
            if error is None:
                self._forget(item, None)
            elif item.retries < MAX_PUBLISH_RETRY and not self._closed:
                item.retries += 1
                self._spool.appendleft(item)
            else:
                log.warning(
                    "dropping a spooled publish to %s after %d tries: %s", item.topic, item.retries, error
                )
                self._forget(item, error)
            self._cond.notify_all()

    # ------------------------------------------------------------------------------ subscribe

    def subscribe(
        self, topic_filter: str, handler: Callable[[Message], None], qos: int
    ) -> Callable[[], None]:
        """Subscribe (blocking until the broker's SUBACK when online); returns the unsubscribe."""
        sub = _Sub(topic_filter, handler, min(qos, 1))
        with self._cond:
            self._subs.append(sub)
            client = None if self._offline else self._client
        if client is not None:
            try:
                sub.live = client.subscribe(topic_filter, handler, qos=sub.qos)
            except TransportError:
                with self._cond:
                    self._subs.remove(sub)
                raise

        def remove() -> None:
            with self._cond:
                if sub not in self._subs:
                    return
                self._subs.remove(sub)
                live, sub.live = sub.live, None
            if live is not None:
                live.close()

        return remove
