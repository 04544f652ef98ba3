""" "IoT Core" for the simulated core: a real mosquitto broker on a free loopback port, and MQTT clients.

`MosquittoBroker` starts `mosquitto` (MQTT 5 and 3.1.1, shared subscriptions, anonymous, sessions
kept across a restart) and stops it again. `CloudClient` is the cloud side for tests, a blocking
convenience over the project's one MQTT client (`edgeinfer.transport.mqtt.MqttPubSub`, which the
core's IoT bridge uses too); `Inbox` collects what a subscription got.
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

from edgeinfer.errors import EdgeinferError
from edgeinfer.transport.base import Message, MqttProperties, Target, TransportError
from edgeinfer.transport.mqtt import MqttPubSub, parse_broker

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


class CloudClient:
    """The cloud side of "IoT Core": an `MqttPubSub` on the broker with the blocking conveniences a
    test wants (`subscribe` returns an `Inbox`, `publish` waits for the PUBACK of QoS 1)."""

    def __init__(self, host: str, port: int, client_id: str | None = None, timeout: float = 10.0) -> None:
        self.client_id = client_id or f"sim-cloud-{secrets.token_hex(4)}"
        try:
            self.pubsub = MqttPubSub.connect_tcp(host, port, client_id=self.client_id, timeout_s=timeout)
        except TransportError as exc:
            raise BrokerError(f"cannot connect to the broker at {host}:{port}: {exc}") from exc

    def subscribe(self, topic_filter: str, qos: int = 1) -> Inbox:
        inbox = Inbox(topic_filter, "iot")
        inbox._closer = self.pubsub.subscribe(topic_filter, inbox.put, qos=min(qos, 1)).close
        return inbox

    def publish(
        self,
        topic: str,
        payload: bytes | str,
        qos: int = 1,
        retain: bool = False,
        properties: MqttProperties | None = None,
    ) -> None:
        data = payload.encode() if isinstance(payload, str) else bytes(payload)
        if retain:
            self.pubsub.publish_future(
                topic, data, qos=min(qos, 1), retain=True, properties=properties
            ).result(self.pubsub.operation_timeout_s)
        else:
            self.pubsub.publish(topic, data, qos=min(qos, 1), properties=properties)

    def close(self) -> None:
        self.pubsub.close()

    def __enter__(self) -> CloudClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
