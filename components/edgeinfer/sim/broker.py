""" "IoT Core" for the simulated core: a real mosquitto broker on a free loopback port, and MQTT clients.

`MosquittoBroker` starts `mosquitto` (MQTT 5 and 3.1.1, shared subscriptions, anonymous, sessions
kept across a restart) and stops it again. `MqttClient` is a small blocking wrapper over awscrt's
MQTT 3.1.1 client, used by the simulator's IoT Core bridge and by tests as "the cloud"; `Inbox`
collects what a subscription got.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgeinfer.errors import EdgeinferError
from edgeinfer.transport.base import Message, Target, topic_matches
from edgeinfer.transport.mqtt import parse_broker, set_tcp_nodelay, subscription_topic_filter

log = logging.getLogger(__name__)


class BrokerError(EdgeinferError):
    """The broker could not be started or reached."""


def find_mosquitto() -> str:
    found = shutil.which("mosquitto") or (
        "/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None
    )
    if not found:
        raise BrokerError("mosquitto not found: install it (`make mosquitto` or `apt-get install mosquitto`)")
    return found


def _user() -> str:
    """mosquitto started as root drops to `mosquitto`, which cannot write our folder: stay who we are."""
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_for_port(host: str, port: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return True
        time.sleep(0.02)
    return False


def parse_hostport(text: str) -> tuple[str, int]:
    """`HOST:PORT` for `--broker` (see `transport.mqtt.parse_broker`); EdgeinferError when it is not."""
    try:
        return parse_broker(text)
    except ValueError as exc:
        raise EdgeinferError(f"--broker: {exc}") from None


class MosquittoBroker:
    """A mosquitto process on `host:port` (a free port unless given). Use as a context manager."""

    def __init__(
        self, host: str = "127.0.0.1", port: int | None = None, work_dir: Path | None = None
    ) -> None:
        self.host = host
        self.port = port or 0
        self._work_dir = work_dir
        self._proc: subprocess.Popen[bytes] | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def start(self) -> MosquittoBroker:
        binary = find_mosquitto()
        if self._work_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="ggsim-mqtt-")
            base = Path(self._tmp.name)
        else:
            base = Path(self._work_dir)
            base.mkdir(parents=True, exist_ok=True)
        for _attempt in range(5):
            port = self.port or free_port(self.host)
            conf = base / "mosquitto.conf"
            conf.write_text(
                f"listener {port} {self.host}\nallow_anonymous true\nuser {_user()}\n"
                # sessions and queued QoS 1 messages survive a stop()/start() on the same port, as
                # IoT Core keeps persistent sessions; clean-session clients are not affected
                f"persistence true\npersistence_location {base}/\nautosave_interval 0\n"
                "max_queued_messages 100000\nmax_inflight_messages 0\n"
                # Nagle + delayed ACKs cost ~40 ms per QoS 1 exchange and per multi-segment payload.
                "set_tcp_nodelay true\n"
                f"log_dest file {base / 'mosquitto.log'}\nlog_type error\nlog_type warning\n"
            )
            self._proc = subprocess.Popen(
                [binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and self._proc.poll() is None:
                if wait_for_port(self.host, port, timeout=0.05):
                    self.port = port
                    log.info("mosquitto on %s:%d (pid %d)", self.host, port, self._proc.pid)
                    return self
            self._kill()
            if self.port:
                break
        raise BrokerError(f"mosquitto did not start on {self.host}:{self.port or 'a free port'}")

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def stop(self) -> None:
        self._kill()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> MosquittoBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Inbox:
    """Messages a subscription received, in arrival order; `wait_for` blocks until enough arrived."""

    def __init__(self, topic_filter: str = "#", target: Target = "iot") -> None:
        self.topic_filter = topic_filter
        self.target: Target = target
        self._messages: list[Message] = []
        self._cond = threading.Condition()
        self._closer: Callable[[], None] | None = None

    def put(self, message: Message) -> None:
        with self._cond:
            self._messages.append(message)
            self._cond.notify_all()

    @property
    def messages(self) -> list[Message]:
        with self._cond:
            return list(self._messages)

    def __len__(self) -> int:
        with self._cond:
            return len(self._messages)

    def wait_for(self, n: int = 1, timeout: float = 10.0) -> list[Message]:
        """The first `n` messages (all received so far when more came); TimeoutError when fewer arrive."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._messages) >= n, timeout):
                got = [m.topic for m in self._messages]
                raise TimeoutError(
                    f"{self.topic_filter}: got {len(got)} of {n} messages in {timeout}s: {got[:10]}"
                )
            return list(self._messages)

    def clear(self) -> None:
        with self._cond:
            self._messages.clear()

    def close(self) -> None:
        if self._closer is not None:
            closer, self._closer = self._closer, None
            closer()


class MqttClient:
    """A blocking MQTT 3.1.1 client (awscrt) on the broker, as a cloud application would hold one."""

    def __init__(self, host: str, port: int, client_id: str | None = None, timeout: float = 10.0) -> None:
        from awscrt import mqtt

        self._mqtt = mqtt
        self.timeout = timeout
        self.client_id = client_id or f"sim-cloud-{secrets.token_hex(4)}"
        self._subs: list[tuple[str, Callable[[Message], None]]] = []
        self._lock = threading.Lock()
        self._offline = False
        self._conn = mqtt.Connection(
            client=mqtt.Client(None, None),
            host_name=host,
            port=port,
            client_id=self.client_id,
            clean_session=True,
            keep_alive_secs=60,
            reconnect_min_timeout_secs=1,
            reconnect_max_timeout_secs=5,
            on_connection_resumed=self._on_resumed,
        )
        self._conn.on_message(self._on_message)
        self._port = port
        try:
            self._conn.connect().result(timeout)
        except Exception as exc:
            raise BrokerError(f"cannot connect to the broker at {host}:{port}: {exc}") from exc
        set_tcp_nodelay(frozenset(), port)

    def _on_resumed(self, return_code: Any, session_present: bool, **_: Any) -> None:
        set_tcp_nodelay(frozenset(), self._port)
        if not session_present:
            log.info("reconnected to the broker: subscribing again")
            self._conn.resubscribe_existing_topics()

    def _on_message(self, topic: str, payload: bytes, **_: Any) -> None:
        message = Message(topic, bytes(payload), "iot")
        with self._lock:
            handlers = [h for f, h in self._subs if topic_matches(subscription_topic_filter(f), topic)]
        for handler in handlers:
            try:
                handler(message)
            except Exception:
                log.exception("MQTT handler for %s failed", topic)

    def add_handler(
        self, topic_filter: str, handler: Callable[[Message], None], qos: int = 1
    ) -> Callable[[], None]:
        entry = (topic_filter, handler)
        with self._lock:
            self._subs.append(entry)
            first = sum(1 for f, _ in self._subs if f == topic_filter) == 1
        if first and not self._offline:
            future, _ = self._conn.subscribe(topic_filter, self._mqtt.QoS(min(qos, 1)))
            future.result(self.timeout)

        def remove() -> None:
            with self._lock:
                if entry not in self._subs:
                    return
                self._subs.remove(entry)
                last = not any(f == topic_filter for f, _ in self._subs)
            if last and not self._offline:
                with contextlib.suppress(Exception):
                    self._conn.unsubscribe(topic_filter)[0].result(self.timeout)

        return remove

    def subscribe(self, topic_filter: str, qos: int = 1) -> Inbox:
        inbox = Inbox(topic_filter, "iot")
        inbox._closer = self.add_handler(topic_filter, inbox.put, qos)
        return inbox

    def publish(self, topic: str, payload: bytes | str, qos: int = 1, retain: bool = False) -> None:
        data = payload.encode() if isinstance(payload, str) else bytes(payload)
        future, _ = self._conn.publish(topic, data, self._mqtt.QoS(min(qos, 1)), retain)
        if qos:
            future.result(self.timeout)

    @property
    def online(self) -> bool:
        return not self._offline

    def go_offline(self) -> None:
        """Drop the connection (no automatic reconnect) until `go_online()`."""
        self._offline = True
        with contextlib.suppress(Exception):
            self._conn.disconnect().result(self.timeout)

    def go_online(self) -> None:
        """Connect again and subscribe again to every filter that has handlers."""
        self._conn.connect().result(self.timeout)
        set_tcp_nodelay(frozenset(), self._port)
        self._offline = False
        with self._lock:
            filters = {f for f, _ in self._subs}
        for topic_filter in filters:
            self._conn.subscribe(topic_filter, self._mqtt.QoS.AT_LEAST_ONCE)[0].result(self.timeout)

    def publish_async(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> Any:
        return self._conn.publish(topic, bytes(payload), self._mqtt.QoS(min(qos, 1)), retain)[0]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._conn.disconnect().result(self.timeout)

    def __enter__(self) -> MqttClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
