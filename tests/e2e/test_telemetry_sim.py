"""The telemetry component on the simulated core: real IPC, real recipe, real mosquitto as IoT Core.

The runtime's timings are published on local pub/sub from the test (as the runtime does); the windows
are read from the broker as a cloud application would. A stand-in installer recipe links this
project's venv where the real installer puts it, so the component runs exactly as its recipe says.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import shutil
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from edgeinfer import __version__
from edgeinfer.messages import TIMINGS_TOPIC, Latency, TelemetryWindow, TimingBatch, TimingRecord
from edgeinfer.sim.pubsub import message_frame_size
from edgeinfer.telemetry.histogram import RELATIVE_PRECISION
from tests.helpers import PROJECT
from tests.helpers.wait import eventually

pytestmark = pytest.mark.e2e

ROOT = PROJECT
COMPONENT = "com.edgeinfer.Telemetry"
THING = "tele-e2e"


def device(tmp_path: Path) -> Path:
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    shutil.copy(ROOT / "recipes" / f"{COMPONENT}.yaml", recipes)
    installer = {
        "RecipeFormatVersion": "2020-01-25",
        "ComponentName": "com.edgeinfer.RuntimeInstaller",
        "ComponentVersion": __version__,  # what the telemetry recipe's dependency range asks for
        "Manifests": [
            {
                "Platform": {"os": "linux", "runtime": "*"},
                # as the real installer: the venv, then platform.json, which telemetry waits for
                "Lifecycle": {
                    "install": f"ln -sfn {sys.prefix} {{work:path}}/venv && : > '{{work:path}}/platform.json'"
                },
            }
        ],
    }
    (recipes / "com.edgeinfer.RuntimeInstaller.yaml").write_text(yaml.safe_dump(installer))
    return recipes


def records(rng: random.Random, n: int) -> list[TimingRecord]:
    out = []
    for i in range(n):
        queue, inference = rng.expovariate(1 / 4.0), rng.lognormvariate(1.2, 0.5)
        out.append(
            TimingRecord(
                id=str(i),
                status="ok",
                latency_ms=Latency(queue=queue, decode=1.0, inference=inference, total=queue + inference + 1),
                batch_size=4,
                provider="CPUExecutionProvider",
                queue_depth=rng.randint(0, 9),
            )
        )
    return out


def timing_messages(sim: Any, recs: list[TimingRecord], executions: list[int] | None = None) -> list[bytes]:
    """One TimingBatch; on a nucleus with an IPC message limit (lite), as many as keep each under it,
    as a runtime there must send them (the executions ride on the first)."""
    whole = TimingBatch(THING, recs, list(executions or [])).to_json()
    limit = sim.nucleus.ipc_max_message_bytes
    if limit is None:
        return [whole]
    out: list[bytes] = []
    chunk: list[TimingRecord] = []
    for record in recs:
        trial = TimingBatch(THING, [*chunk, record], [] if out else list(executions or [])).to_json()
        if chunk and message_frame_size(TIMINGS_TOPIC, "binary", trial) > limit:
            out.append(TimingBatch(THING, chunk, [] if out else list(executions or [])).to_json())
            chunk = []
        chunk.append(record)
    out.append(TimingBatch(THING, chunk, [] if out else list(executions or [])).to_json())
    return out


def publish_timings(sim: Any, recs: list[TimingRecord], executions: list[int] | None = None) -> None:
    local = sim.local_client()
    for message in timing_messages(sim, recs, executions):
        local.publish(TIMINGS_TOPIC, message)


def windows_of(inbox: Any) -> list[TelemetryWindow]:
    return [TelemetryWindow.from_dict(json.loads(m.payload)) for m in inbox.messages]


def wait_until(predicate: Any, timeout: float, what: str, sim: Any = None) -> None:
    def tail() -> str:
        return "component log tail:\n" + "\n".join(sim.logs(COMPONENT).splitlines()[-30:]) if sim else ""

    eventually(predicate, timeout, what, tail)


def test_windows_reach_iot_core_and_match_the_raw_timings(simulator: Any, tmp_path: Path) -> None:
    sim = simulator(device(tmp_path), thing=THING, config_merge={COMPONENT: {"windowSeconds": 1}})
    sim.wait_for_state(COMPONENT, "RUNNING", timeout=60)
    inbox = sim.cloud_client().subscribe(f"edgeinfer/{THING}/telemetry")
    # a first (empty) window proves the component is subscribed and publishing
    wait_until(lambda: len(inbox.messages) > 0, 30, "a first window", sim)
    raw = TimingBatch.parse(TimingBatch(THING, records(random.Random(5), 600), [4] * 150).to_json()).records
    messages = timing_messages(sim, raw, [4] * 150)
    if len(messages) > 1:  # lite: in pieces, sent just after a window closed so one window holds them
        seen = len(inbox.messages)
        wait_until(lambda: len(inbox.messages) > seen, 30, "the next window", sim)
    for message in messages:
        sim.local_client().publish(TIMINGS_TOPIC, message)
    wait_until(lambda: sum(w.count for w in windows_of(inbox)) >= 600, 30, "600 requests in windows", sim)
    (window,) = [w for w in windows_of(inbox) if w.count]
    assert window.count == 600
    assert window.thing == THING
    assert window.batch["mean_size"] == 4
    assert window.provider == "CPUExecutionProvider"
    assert "cpu_percent" in window.system
    assert window.system["rss_mb"] > 0
    for stage in ("queue", "inference", "total"):
        values = sorted(getattr(r.latency_ms, stage) for r in raw)
        for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
            want = values[math.ceil(q * len(values)) - 1]
            got = getattr(window.latency_ms[stage], name)
            assert abs(got - want) <= RELATIVE_PRECISION * want + 0.001, (stage, name, got, want)
        assert window.latency_ms[stage].max == values[-1]
    seqs = [w.seq for w in windows_of(inbox)]
    assert seqs == sorted(seqs)
    assert sim.state(COMPONENT) == "RUNNING"


class LinkCutter:
    """A TCP relay between the device and the broker; `cut()` drops the link, `restore()` brings it back.

    IoT Core stays up for the cloud side (the test's subscriber talks to the broker directly, and
    misses nothing), while the device sees the broker vanish and return on the same address.
    """

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = 0
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    @property
    def address(self) -> tuple[str, int]:
        return "127.0.0.1", self.port

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        if self._listener is not None:
            # close() alone leaves the socket listening while `_accept` is blocked in accept() on it
            # (the call holds the file open): the device would reconnect at once and see no outage.
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            conns, self._conns = self._conns, []
        for sock in conns:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


@pytest.mark.parametrize("kind", ["link-down", "broker-restart"])
def test_a_ten_second_broker_outage_loses_no_window(simulator: Any, tmp_path: Path, kind: str) -> None:
    """IoT Core unreachable from the device for 10 s, then back on the same address: every window
    arrives, in a continuous `seq`, with the timings of the outage in them.

    `link-down`: the device's connection drops and returns. `broker-restart`: the broker also
    restarts without sessions, so what was in flight on the old connection is gone from the broker.
    Who keeps the windows meanwhile depends on the nucleus: the classic nucleus accepts a QoS 1
    publish once its spooler holds it and resends it after reconnecting, so the nucleus holds the
    outage's windows (the component's spool is not needed); a nucleus without a spooler (lite)
    fails the publish to the component, whose own spool carries the windows across.
    """
    from edgeinfer.sim import MosquittoBroker
    from edgeinfer.transport.mqtt import MqttPubSub

    broker = MosquittoBroker(work_dir=tmp_path / "broker").start()
    link = LinkCutter(broker.address)
    link.restore()
    try:
        sim = simulator(
            device(tmp_path),
            thing=THING,
            broker=link.address,
            config_merge={COMPONENT: {"windowSeconds": 1}},
        )
        received: dict[int, TelemetryWindow] = {}
        duplicates = 0

        def on_window(message: Any) -> None:
            nonlocal duplicates
            window = TelemetryWindow.from_dict(json.loads(message.payload))
            duplicates += window.seq in received
            received[window.seq] = window

        cloud = MqttPubSub.connect_tcp(*broker.address)
        try:
            cloud.subscribe(f"edgeinfer/{THING}/telemetry", on_window, qos=1)
            wait_until(lambda: len(received) >= 3, 30, "windows before the outage", sim)
            rng = random.Random(2)
            publish_timings(sim, records(rng, 50))
            link.cut()
            outage_start = max(received)
            held = 0  # most windows the nucleus's spooler held at once
            spools = sim.nucleus.spooler_bytes is not None
            second = 0
            # Timings keep flowing on the device during the outage, which lasts ten seconds and, where
            # the nucleus spools, until its spooler has held five windows: a count, not a time.
            while second < 10 or (spools and held < 5 and second < 60):
                second += 1
                time.sleep(1)
                publish_timings(sim, records(rng, 50))
                held = max(held, sim.pending_iot_publishes()[0])
                if kind == "broker-restart" and second == 3:
                    broker.stop()
                    broker.start()  # same port, no sessions: what the device had in flight is gone
            if kind == "broker-restart":  # the cloud side is back, subscribed, before the device is
                # A client's own reconnect re-subscribes without saying when the broker has it; a new
                # client's subscribe returns once the broker acknowledged it.
                cloud.close()
                cloud = MqttPubSub.connect_tcp(*broker.address)
                cloud.subscribe(f"edgeinfer/{THING}/telemetry", on_window, qos=1)
            link.restore()  # same address: the device's bridge reconnects by itself
            wait_until(
                lambda: len(received) > outage_start + 14 and set(received) >= set(range(max(received) + 1)),
                90,
                "every window up to the newest after the outage",
                sim,
            )
        finally:
            cloud.close()
        seqs = sorted(received)
        assert seqs == list(range(seqs[-1] + 1))  # continuous: no window lost
        assert sum(w.count for w in received.values()) >= 550  # the timings of the outage are in them
        spooled = max(w.system["spool"]["pending"] for w in received.values())
        print(
            f"{kind} on {sim.nucleus.name}: windows {len(seqs)}, the nucleus held at most {held}, "
            f"the component spooled at most {spooled}, duplicates {duplicates}"
        )
        if sim.nucleus.spooler_bytes is not None:
            assert held >= 5, "the nucleus's spooler should have held the outage's windows"
            assert spooled == 0, "the nucleus accepted every window, the component had none to spool"
        else:
            assert held == 0
            assert spooled >= 1, "the component's spool should have carried windows across"
        assert all(w.system["spool"]["dropped"] == 0 for w in received.values())
        assert sim.state(COMPONENT) == "RUNNING"
    finally:
        link.cut()
        broker.stop()


def test_bad_configuration_is_refused_and_reported(simulator: Any, tmp_path: Path) -> None:
    sim = simulator(device(tmp_path), thing=THING, config_merge={COMPONENT: {"windowSeconds": 1}})
    inbox = sim.cloud_client().subscribe(f"edgeinfer/{THING}/telemetry")
    inbox.wait_for(1, timeout=30)
    if sim.nucleus.name == "classic":  # the deployment is refused with the component's reason
        with pytest.raises(Exception, match="windowSeconds: must be between"):
            sim.update_configuration(COMPONENT, merge={"windowSeconds": 0})
    else:  # nucleus lite validates nothing: the component ignores the change and says why
        sim.update_configuration(COMPONENT, merge={"windowSeconds": 0})
        wait_until(lambda: "windowSeconds: must be between" in sim.logs(COMPONENT), 30, "the refusal", sim)
    sim.update_configuration(COMPONENT, merge={"windowSeconds": 0.5})  # applied live, no restart
    assert sim.state(COMPONENT) == "RUNNING"
    wait_until(
        lambda: any(w.window_s == 0.5 for w in windows_of(inbox)), 30, "a window of the new length", sim
    )
