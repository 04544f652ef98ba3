"""The simulated core's connection to "IoT Core" (the local mosquitto), with the nucleus's limits.

Two `edgeinfer.transport.mqtt.MqttPubSub` connections, each on its own CRT event-loop thread: one
publishes (client id `client_id`), one carries the subscriptions (`client_id#2`, the name the classic
nucleus gives its second connection). Publishes are checked as the classic nucleus's
`MqttClient.publish` checks them, then queued in a spooler like its in-memory `Spool`
(`mqtt.spooler.maxSizeInBytes`, 2.5 MiB: a full spool first drops queued QoS 0 messages, then refuses)
and sent in order with at most `maxInFlightPublishes` (5) unacknowledged, handed to the client on
the thread that spooled the message when fewer are in flight, else by the spooler thread once a
PUBACK makes room. The publish is accepted once spooled, as on the nucleus (`MqttClient.publish`:
"It only represents that the message has been successfully stored in the spooler"); offline, QoS 1
messages wait in the spool and QoS 0 ones are refused. A profile without a spooler (nucleus lite)
publishes directly and answers when the broker has.

Messages from IoT Core reach the nucleus's event loop through `LoopHandoff`, which holds at most
`limit` undelivered events (and `max_bytes` of them) and makes the MQTT client's dispatcher wait
beyond that; the client acknowledges a QoS 1 message only once it is handed over, and MQTT 5 flow
control (`RECEIVE_MAXIMUM`) asks the broker to send no more unacknowledged ones. mosquitto 2.0.11
holds to that only until acknowledgements flow, so the receiving connection's inbox is bounded too
(`INBOX_MAX_MESSAGES`, `INBOX_MAX_BYTES`): when it is full, its CRT thread waits and reads no more
from the socket, and the broker holds the rest. That thread reads nothing else the nucleus needs:
the PUBACKs of the nucleus's own publishes arrive on the other connection, whose thread is never
held. Each event is written to the subscriber's IPC connection only once that has room
(`Stream.send_frame_when_writable`).

A profile with a Maximum Packet Size for what IoT Core sends the device (nucleus lite's iotcored
announces 5,000 bytes) never sees a larger message: the broker drops it silently; here the bridge
does, and counts it (`dropped`, in the simulator's status).
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

__all__ = ["IotBridge", "LoopHandoff", "PublishRefusedError", "publish_packet_size"]

# MQTT 5 flow control on the connection to IoT Core: at most this many QoS 1 messages from the cloud
# are unacknowledged, each acknowledged once handed to the event loop (MqttPubSub(receive_maximum)).
RECEIVE_MAXIMUM = 64
PING_TIMEOUT_MS = 300_000
KEEP_ALIVE_S = 600  # the CRT holds the ping timeout under the keep-alive interval
# What the receiving connection holds between its socket and the dispatcher (payload bytes).
INBOX_MAX_MESSAGES = 1024
INBOX_MAX_BYTES = 32 * 1024 * 1024
# A subscribe's SUBACK waits, on the held receiving connection, behind what the socket holds.
SUBSCRIBE_TIMEOUT_S = 60.0
MAX_PUBLISH_RETRY = 100  # mqtt.maxPublishRetry: a spooled message is dropped after this many failures
_REQUEST_EXCEPTION = "com.aws.greengrass.mqttclient.MqttRequestException"
_SPOOLER_EXCEPTION = "com.aws.greengrass.mqttclient.spool.SpoolerStoreException"
_SENT, _IDLE, _REFUSED = "sent", "idle", "refused"  # what `IotBridge._send_one` did


def _varint_len(n: int) -> int:
    size = 1
    while n >= 128:
        n //= 128
        size += 1
    return size


def publish_packet_size(message: Message, qos: int = 1) -> int:
    """The bytes of the MQTT 5 PUBLISH packet that carries `message`, as a broker measures it
    against the receiver's Maximum Packet Size: fixed header, topic, packet id, properties, payload."""
    props = 0
    p = message.properties
    if p is not None:
        for text in (p.content_type, p.response_topic):
            props += 0 if text is None else 3 + len(text.encode())
        props += 0 if p.correlation_data is None else 3 + len(p.correlation_data)
        props += sum(5 + len(k.encode()) + len(v.encode()) for k, v in p.user_properties)
        props += (0 if p.message_expiry_s is None else 5) + (0 if p.payload_format is None else 2)
    body = 2 + len(message.topic.encode()) + (2 if qos else 0) + _varint_len(props) + props
    body += len(message.payload)
    return 1 + _varint_len(body) + body


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
    """Runs callbacks on an asyncio loop from other threads, with at most `limit` of them (and
    `max_bytes` of what they carry) waiting to run or still in progress; callers wait beyond that.

    Callbacks queued while the loop is busy run together, in order, on one wake-up of the loop."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, limit: int = 1024, max_bytes: int | None = None
    ) -> None:
        self.loop = loop
        self.limit = limit
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._held = 0
        self._bytes = 0
        self._waiting = 0
        self._queue: collections.deque[tuple[Callable[[], None], int]] = collections.deque()
        self._scheduled = False
        self.peak = 0  # the most held at once
        self.peak_bytes = 0

    def held(self) -> tuple[int, int]:
        """(callbacks, bytes) waiting to run or in progress."""
        with self._lock:
            return self._held, self._bytes

    def call(self, fn: Callable[..., None], *args: Any) -> None:
        """Queue `fn(*args)` on the loop; blocks while `limit` earlier ones have not run yet."""

        def run() -> None:
            try:
                fn(*args)
            finally:
                self._release(0)

        if self._acquire(0, stop_when_loop_stops=False):
            self._enqueue(run, 0)

    def submit(self, fn: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> None:
        """`call` for a coroutine: its slot is held until it has finished, so what it waits for (an
        IPC client reading its events) holds up the caller too. Gives up once the loop has stopped."""

        def run() -> None:
            task = asyncio.ensure_future(fn(*args))
            task.add_done_callback(lambda _t: self._release(0))

        if self._acquire(0, stop_when_loop_stops=True):
            self._enqueue(run, 0)

    def hold(self, fn: Callable[..., None], *args: Any, size: int = 0) -> None:
        """`fn(*args, done)` on the loop, its slot (and `size` bytes) held until it calls `done()`
        (once): `submit` without a task per call, for a callback that usually finishes at once."""
        released = False

        def done() -> None:
            nonlocal released
            if not released:
                released = True
                self._release(size)

        def run() -> None:
            try:
                fn(*args, done)
            except BaseException:
                done()
                raise

        if self._acquire(size, stop_when_loop_stops=True):
            self._enqueue(run, size)

    def _acquire(self, size: int, *, stop_when_loop_stops: bool) -> bool:
        with self._lock:
            while self._held and (self._held >= self.limit or self._over_bytes(size)):
                if self.loop.is_closed() or (stop_when_loop_stops and not self.loop.is_running()):
                    return False
                self._waiting += 1
                self._room.wait(0.5)
                self._waiting -= 1
            self._held += 1
            self._bytes += size
            self.peak = max(self.peak, self._held)
            self.peak_bytes = max(self.peak_bytes, self._bytes)
        return True

    def _over_bytes(self, size: int) -> bool:
        return self.max_bytes is not None and self._bytes + size > self.max_bytes

    def _release(self, size: int) -> None:
        with self._lock:
            self._held -= 1
            self._bytes -= size
            if self._waiting:
                self._room.notify()

    def _enqueue(self, run: Callable[[], None], size: int) -> None:
        with self._lock:
            self._queue.append((run, size))
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._pump)
        except RuntimeError:  # the loop is closed: the core is stopping
            with self._lock:
                dropped, self._queue = list(self._queue), collections.deque()
                self._scheduled = False
            for _run, held in dropped:
                self._release(held)

    def _pump(self) -> None:
        with self._lock:
            batch, self._queue = self._queue, collections.deque()
            self._scheduled = False
        for run, _size in batch:
            try:
                run()
            except Exception:
                log.exception("callback handed to the event loop failed")


class IotBridge:
    """Publish to and subscribe on IoT Core as the nucleus does. Thread-safe."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        client_id: str,
        profile: NucleusProfile,
        timeout_s: float = 10.0,
        on_drop: Callable[[], None] | None = None,
    ) -> None:
        self.host, self.port, self.client_id = host, port, client_id
        self.on_drop = on_drop  # called (on the MQTT client's thread) for each message dropped
        self.profile = profile
        self.timeout_s = timeout_s
        self._cond = threading.Condition()
        # Held while a spooled message is taken and handed to the client, so that messages reach
        # the client in spool order whichever thread hands them over (see `_hand_over`).
        self._handing = threading.Lock()
        self._spool: collections.deque[_Spooled] = collections.deque()
        self._spool_bytes = 0
        self._in_flight = 0
        self._offline = False
        self._closed = False
        self._subs: list[_Sub] = []
        self._dropped = 0  # messages over the profile's inbound Maximum Packet Size
        self._client: MqttPubSub | None = None  # publishes
        self._inbound: MqttPubSub | None = None  # subscriptions
        self._client, self._inbound = self._connect()
        self._sender: threading.Thread | None = None
        if profile.spooler_bytes is not None:
            self._sender = threading.Thread(target=self._send_loop, name="ggsim-spooler", daemon=True)
            self._sender.start()

    def _connect(self) -> tuple[MqttPubSub, MqttPubSub]:
        publisher = MqttPubSub.connect_tcp(
            self.host, self.port, client_id=self.client_id, timeout_s=self.timeout_s, own_event_loop=True
        )
        try:
            inbound = MqttPubSub.connect_tcp(
                self.host,
                self.port,
                client_id=f"{self.client_id}#2",
                timeout_s=self.timeout_s,
                receive_maximum=RECEIVE_MAXIMUM,
                inbox_max_messages=INBOX_MAX_MESSAGES,
                inbox_max_bytes=INBOX_MAX_BYTES,
                operation_timeout_s=SUBSCRIBE_TIMEOUT_S,
                # Held by a full inbox, this connection answers no keep-alive: a disconnect there
                # would lose what the broker had handed over (a clean session).
                ping_timeout_ms=PING_TIMEOUT_MS,
                keep_alive_interval_sec=KEEP_ALIVE_S,
            )
        except BaseException:
            publisher.close()
            raise
        return publisher, inbound

    # ------------------------------------------------------------------------------ state

    @property
    def online(self) -> bool:
        client, inbound = self._client, self._inbound
        return (
            not self._offline
            and client is not None
            and client.is_connected
            and inbound is not None
            and inbound.is_connected
        )

    def inbox_stats(self) -> dict[str, int]:
        """The receiving connection's inbox: held now, the most held, how many waited for room."""
        inbound = self._inbound
        return inbound.inbox_stats() if inbound is not None else {}

    def pending(self) -> tuple[int, int]:
        """(messages, payload bytes) spooled and not yet acknowledged."""
        with self._cond:
            return len(self._spool) + self._in_flight, self._spool_bytes

    def dropped(self) -> int:
        """Messages from IoT Core dropped for being larger than the device's Maximum Packet Size."""
        with self._cond:
            return self._dropped

    def in_flight(self) -> int:
        """Publishes sent and not yet acknowledged (at most `maxInFlightPublishes`)."""
        with self._cond:
            return self._in_flight

    def go_offline(self) -> None:
        """Drop the connection until `go_online()`; queued QoS 0 messages go, as on the nucleus."""
        with self._cond:
            self._offline = True
            client, self._client = self._client, None
            inbound, self._inbound = self._inbound, None
            for item in [m for m in self._spool if m.qos == 0]:
                self._spool.remove(item)
                self._forget(item, PublishRefusedError("Device is offline. Dropping QoS 0 message."))
            for sub in self._subs:
                sub.live = None
        for conn in (inbound, client):
            if conn is not None:
                conn.close()

    def go_online(self) -> None:
        """Connect again, subscribe again to every filter, and send what the spool holds."""
        client, inbound = self._connect()
        with self._cond:
            subs = list(self._subs)
        for sub in subs:
            sub.live = inbound.subscribe(sub.topic_filter, sub.handler, qos=sub.qos)
        with self._cond:
            self._client, self._inbound = client, inbound
            self._offline = False
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            client, self._client = self._client, None
            inbound, self._inbound = self._inbound, None
            self._cond.notify_all()
        for conn in (inbound, client):
            if conn is not None:
                conn.close()
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
        self._hand_over()
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

    def _sendable(self, limit: int) -> bool:
        """Called with the lock held: the oldest spooled message may be handed to the client now."""
        online = self._client is not None and not self._offline
        return bool(self._spool) and online and self._in_flight < limit

    def _hand_over(self) -> None:
        """Hand spooled messages to the client while fewer than `maxInFlightPublishes` are in
        flight, on the publishing thread (never the CRT's: see `_settle`). Waking the spooler thread
        for each message cost a thread switch per publish (under load, up to tens of ms at p99)
        before the message left. A caller that finds another thread handing over leaves the spool
        to it; that one looks again before it stops."""
        limit = self.profile.max_in_flight_publishes or 1
        while self._handing.acquire(blocking=False):
            try:
                while (outcome := self._send_one(limit)) == _SENT:
                    pass
            finally:
                self._handing.release()
            if outcome == _REFUSED:  # the spooler thread tries again after a pause
                return
            with self._cond:  # a message spooled while this thread held `_handing`
                if self._closed or not self._sendable(limit):
                    return

    def _send_one(self, limit: int) -> str:
        """Hand the oldest spooled message to the client (`_handing` held): `_SENT`, `_IDLE` (none
        may go now) or `_REFUSED` (the client is reconnecting; the message stays first)."""
        with self._cond:
            if self._closed or not self._sendable(limit):
                return _IDLE
            item = self._spool.popleft()
            client = self._client
            self._in_flight += 1
        assert client is not None
        try:
            future = client.publish_future(
                item.topic, item.payload, qos=item.qos, retain=item.retain, properties=item.properties
            )
        except TransportError:  # not sent (the client is reconnecting): not a try; the spooler retries
            with self._cond:
                self._in_flight -= 1
                self._spool.appendleft(item)
            return _REFUSED
        future.add_done_callback(functools.partial(self._settled, item))
        return _SENT

    def _send_loop(self) -> None:
        """Sends what publishes leave in the spool: once a PUBACK makes room, after a reconnect."""
        limit = self.profile.max_in_flight_publishes or 1
        while True:
            with self._cond:
                while not self._closed and not self._sendable(limit):
                    self._cond.wait(0.5)
                if self._closed:
                    return
            with self._handing:
                outcome = self._send_one(limit)
            if outcome == _REFUSED:
                with self._cond:  # not a try: wait a little for the reconnect
                    self._cond.wait(0.1)

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
            # The spooler thread sends the next one: a publish handed to the CRT from its own
            # event-loop thread (this callback's) is queued ahead of those other threads handed
            # it before, and would leave out of order.
            self._cond.notify_all()

    # ------------------------------------------------------------------------------ subscribe

    def _deliver_within(self, limit: int, handler: Callable[[Message], None], message: Message) -> None:
        size = publish_packet_size(message)
        if size <= limit:
            handler(message)
            return
        with self._cond:
            self._dropped += 1
        if self.on_drop is not None:
            self.on_drop()
        log.warning(
            "dropping a %d-byte PUBLISH to %s: over the device's Maximum Packet Size of %d bytes",
            size,
            message.topic,
            limit,
        )

    def subscribe(
        self, topic_filter: str, handler: Callable[[Message], None], qos: int
    ) -> Callable[[], None]:
        """Subscribe (blocking until the broker's SUBACK when online); returns the unsubscribe."""
        limit = self.profile.iot_inbound_max_packet_bytes
        if limit is not None:
            handler = functools.partial(self._deliver_within, limit, handler)
        sub = _Sub(topic_filter, handler, min(qos, 1))
        with self._cond:
            self._subs.append(sub)
            inbound = None if self._offline else self._inbound
        if inbound is not None:
            try:
                sub.live = inbound.subscribe(topic_filter, handler, qos=sub.qos)
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
