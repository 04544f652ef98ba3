"""A real mosquitto broker on a free loopback port for the MQTT transport tests.

Uses the simulated core's `mqtt_broker` fixture when the sim plugin provides one; otherwise starts
mosquitto itself (the binary comes from `make mosquitto`).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def _mosquitto() -> str:
    found = shutil.which("mosquitto") or (
        "/usr/sbin/mosquitto" if os.path.exists("/usr/sbin/mosquitto") else None
    )
    if found is None:
        pytest.skip("mosquitto is not installed (make mosquitto)")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Broker:
    """A mosquitto process on 127.0.0.1:`port`; `stop()` / `start()` simulate an outage."""

    def __init__(self, workdir: Path) -> None:
        self.host = "127.0.0.1"
        self.port = _free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> None:
        conf = self.workdir / "mosquitto.conf"
        conf.write_text(f"listener {self.port} {self.host}\nallow_anonymous true\npersistence false\n")
        log = open(self.workdir / "mosquitto.log", "ab")  # noqa: SIM115 - kept open for the process
        self.proc = subprocess.Popen([_mosquitto(), "-c", str(conf)], stdout=log, stderr=log)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mosquitto exited: {(self.workdir / 'mosquitto.log').read_text()}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("mosquitto did not start listening")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(tmp_path)
    b.start()
    try:
        yield b
    finally:
        b.stop()
