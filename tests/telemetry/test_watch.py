"""`edgeinfer watch` against a real broker: windows and results in, one frame out (no terminal); and
`watch --fleet` in a real (pseudo-)terminal."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import random
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
from collections.abc import Callable
from typing import Any

import pytest

from edgeinfer.cli import main
from edgeinfer.messages import Latency, Result, TimingBatch, result_topic, telemetry_topic
from edgeinfer.telemetry.window import WindowAggregator
from tests.helpers.clock import FakeClock
from tests.helpers.telemetry import make_record
from tests.helpers.wait import eventually


def test_watch_once_shows_what_the_broker_carried(
    sim_broker: Any, tmp_path: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from edgeinfer.transport.mqtt import MqttPubSub

    clock = FakeClock()
    agg = WindowAggregator("cam-7", window_s=10, clock=clock)
    agg.add(TimingBatch("cam-7", [make_record(random.Random(1)) for _ in range(30)]))
    clock.advance(10)
    (window,) = agg.poll()
    record = tmp_path / "windows.jsonl"
    host, port = sim_broker.address
    # publish once watch's last subscription is acknowledged by the broker (not after a guessed sleep)
    subscribed = threading.Event()
    real_subscribe = MqttPubSub.subscribe

    def subscribe(self: MqttPubSub, topic: str, *args: Any, **kwargs: Any) -> Any:
        sub = real_subscribe(self, topic, *args, **kwargs)
        if topic == result_topic("+") + "/#":
            subscribed.set()
        return sub

    monkeypatch.setattr(MqttPubSub, "subscribe", subscribe)
    codes: list[int] = []
    runner = threading.Thread(
        target=lambda: codes.append(
            main(
                ["watch", "--broker", f"{host}:{port}", "--once", "--duration", "4", "--record", str(record)]
            )
        )
    )
    runner.start()
    with MqttPubSub.connect_tcp(host, port) as pub:
        assert subscribed.wait(30)
        pub.publish(telemetry_topic("cam-7"), window.to_json(), qos=1)
        ok = Result(id="1", status="ok", timestamp="", latency_ms=Latency(total=12.0))
        pub.publish(result_topic("cam-7"), ok.to_json(), qos=1)
        pub.publish(result_topic("cam-7") + "/my-app", ok.to_json(), qos=1)  # a request's reply_to
        pub.publish(telemetry_topic("cam-7"), b"garbage", qos=1)
    runner.join(30)
    assert codes == [0]
    out = capsys.readouterr().out
    assert "cam-7" in out
    assert f"window #{window.seq} (10 s)" in out
    assert "throughput 3.0/s" in out
    assert "results (last 10 s) 0.2/s" in out
    lines = record.read_text().splitlines()
    assert len(lines) == 1  # the garbage was not recorded


@pytest.mark.devtool  # the installed edgeinfer command line
def test_watch_rejects_a_bad_thing_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["watch", "--thing", "a/b", "--broker", "127.0.0.1:1"]) == 2
    assert "not a thing name" in capsys.readouterr().err


@pytest.mark.devtool  # the installed edgeinfer command line
def test_watch_endpoint_needs_cert_and_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["watch", "--endpoint", "example-ats.iot.us-east-1.amazonaws.com"]) == 2
    assert "--cert and --key" in capsys.readouterr().err


def fleet_windows(things: int) -> list[dict[str, Any]]:
    """One window per thing; thing i failed i of its requests, so the worst-first order is known. Every
    other window names its model, as windows will once they carry model identity."""
    from edgeinfer.messages import ErrorCode

    rng = random.Random(27)
    clock = FakeClock()
    docs = []
    for i in range(things):
        thing = f"cam-{i:02d}"
        agg = WindowAggregator(thing, window_s=10, clock=clock)
        records = [make_record(rng) for _ in range(40)]
        records += [make_record(rng, status="error", code=ErrorCode.INTERNAL) for _ in range(i)]
        agg.add(TimingBatch(thing, records))
        clock.advance(10)
        (window,) = agg.poll()
        doc = window.to_dict()
        if i % 2 == 0:
            doc["models"] = [{"name": "effnet-lite0", "version": "1.2.0", "variant": "int8"}]
        docs.append(doc)
    return docs


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _exit_code(proc: subprocess.Popen[bytes], text: Callable[[], str], timeout_s: float = 60) -> int:
    """The process's exit code; one that does not exit is made to print every thread's stack
    (PYTHONFAULTHANDLER, SIGABRT) and the test fails with what it printed."""
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        proc.wait(30)
        raise AssertionError(f"still running {timeout_s:g} s after Ctrl-C:\n{text()[-6000:]}") from None


def test_watch_fleet_in_a_terminal_shows_one_row_per_thing_worst_first(sim_broker: Any) -> None:
    """`watch --fleet` as a user runs it: in a pseudo-terminal (so `rich` draws its live view), against
    the real broker, with 20 things' windows published to it; the last frame it drew is read back."""
    from edgeinfer.transport.mqtt import MqttPubSub

    host, port = sim_broker.address
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 60, 160, 0, 0))  # rows, columns
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR", "TERM")}
    command = [sys.executable, "-m", "edgeinfer", "watch", "--fleet", "--broker", f"{host}:{port}"]
    proc = subprocess.Popen(
        command,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env={**env, "TERM": "xterm-256color", "PYTHONFAULTHANDLER": "1"},
    )
    os.close(slave)
    screen = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the terminal's last writer has gone
                return
            if not chunk:
                return
            screen.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def text() -> str:
        return _ANSI.sub("", bytes(screen).decode("utf-8", "replace"))

    try:
        # the first frame is drawn once the subscription is acknowledged: nothing published is lost
        eventually(lambda: "waiting for telemetry" in text(), what="watch --fleet's first frame", detail=text)
        with MqttPubSub.connect_tcp(host, port) as pub:
            for doc in fleet_windows(20):
                pub.publish(telemetry_topic(doc["thing"]), json.dumps(doc).encode(), qos=1)
        eventually(lambda: "20 thing(s)" in text(), what="20 things on screen", detail=text)
        proc.send_signal(signal.SIGINT)  # Ctrl-C: the live view draws its last frame and stops
        assert _exit_code(proc, text) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(10)
        os.close(master)
    last = text().rsplit("edgeinfer watch --fleet", 1)[1]
    rows = [line.strip() for line in last.splitlines() if line.strip().startswith("cam-")]
    assert [row.split()[0] for row in rows] == [f"cam-{i:02d}" for i in reversed(range(20))]  # worst first
    by_thing = {row.split()[0]: row for row in rows}
    assert "effnet-lite0 1.2.0" in by_thing["cam-18"]
    assert "effnet" not in by_thing["cam-19"]  # no model identity in that window
    assert "19 (32.2%)" in by_thing["cam-19"]
    assert "0 (0.0%)" in by_thing["cam-00"]


@pytest.mark.devtool  # the installed edgeinfer command line
def test_watch_fleet_takes_no_thing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["watch", "--fleet", "--thing", "cam-1", "--broker", "127.0.0.1:1"]) == 2
    assert "leave out --thing" in capsys.readouterr().err
    assert main(["watch", "--fleet", "--stale", "0", "--broker", "127.0.0.1:1"]) == 2
    assert "--stale must be a positive" in capsys.readouterr().err


def test_ctrl_c_ends_a_views_wait_without_taking_a_lock() -> None:
    from edgeinfer.telemetry.cli import _Interrupt

    quiet = _Interrupt()
    assert quiet.wait(0.01) is False
    stop = _Interrupt()
    stop.came = True  # what the SIGINT handler does: a plain attribute, nothing it could wait on
    assert stop.wait(3600) is True  # returns at once
