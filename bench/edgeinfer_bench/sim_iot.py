"""`edgeinfer bench sim`'s IoT Core part: a flood through the simulated nucleus's IoT Core → IPC path.

Measured from outside the nucleus: mosquitto (as IoT Core), `edgeinfer sim up` in its own process,
one sink component that subscribes to IoT Core over IPC with the real awsiotsdk client (its handler
on the IPC client's own thread, so a slow sink holds the nucleus up), and this process publishing
N QoS 1 messages of SIZE bytes from an MQTT 5 client as fast as the broker takes them (256 in
flight). Figures: messages the sink received, distinct and duplicated (exactly once: received ==
distinct == sent); messages/s through the nucleus (the sink's first to last receipt); the nucleus's
CPU seconds per 1,000 messages; its peak resident memory (sampled every 50 ms). With `echo` the
sink answers each message with a 200-byte QoS 1 PublishToIoTCore, as the runtime answers a
request, and the answers are counted too.

Baseline, same run, same broker and sender: the same flood straight through mosquitto to an MQTT
subscriber in this process, no nucleus in between.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from edgeinfer import procfs
from edgeinfer.errors import EdgeinferError
from edgeinfer_bench.sim import component_recipe, sim_down, sim_up

THING = "bench-flood"
TOPIC = f"edgeinfer/{THING}/infer"
RESULT = f"edgeinfer/{THING}/result"
BASELINE_TOPIC = f"edgeinfer/{THING}/baseline"
SINK = "edgeinfer.bench.IotSink"
WINDOW = 256  # QoS 1 publishes in flight from the sender
MAX_SIZE = 131072  # IoT Core's message limit
ANSWER_SIZE = 200
SETTLE_S = 1.0  # after the last message: room for a late duplicate


def check_options(messages: int, size: int, delay_ms: float) -> None:
    if messages < 0:
        raise EdgeinferError("--iot-messages must be 0 (skip the IoT Core part) or more")
    if not 8 <= size <= MAX_SIZE:
        raise EdgeinferError(f"--iot-size must be 8 to {MAX_SIZE} bytes (IoT Core's message limit)")
    if delay_ms < 0:
        raise EdgeinferError("--iot-delay-ms must be 0 or more")


class PeakRss:
    """The most resident memory a process had, sampled every 50 ms until `stop()`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="bench-sim-rss", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, procfs.process_rss_bytes(self.pid) or 0)

    def stop(self) -> float:
        """The peak in MiB."""
        self._stop.set()
        self._thread.join()
        return self.peak / 2**20


def _read(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def _send(sender: Any, topic: str, messages: int, size: int) -> float:
    """Publish `messages` numbered QoS 1 messages, WINDOW in flight; seconds until the last was handed on."""
    body = os.urandom(size - 8)
    window = threading.BoundedSemaphore(WINDOW)
    t0 = time.monotonic()
    for seq in range(messages):
        window.acquire()
        done: Future[None] = sender.publish_future(topic, seq.to_bytes(8, "big") + body, qos=1)
        done.add_done_callback(lambda _f: window.release())
    return time.monotonic() - t0


def _per_s(count: int, first: float | None, last: float | None) -> float | None:
    span = (last or 0.0) - (first or 0.0)
    return round(count / span, 1) if count > 1 and span > 0 else None


def _baseline(host: str, port: int, messages: int, size: int, timeout_s: float) -> dict[str, Any]:
    from edgeinfer.transport.base import Message
    from edgeinfer.transport.mqtt import MqttPubSub

    seen: set[int] = set()
    state: dict[str, Any] = {"count": 0, "first": None, "last": None}
    lock = threading.Lock()

    def received(message: Message) -> None:
        now = time.time()
        with lock:
            seen.add(int.from_bytes(message.payload[:8], "big"))
            state["count"] += 1
            state["first"] = state["first"] or now
            state["last"] = now

    with (
        MqttPubSub.connect_tcp(host, port, client_id="bench-flood-baseline-sub") as sub,
        MqttPubSub.connect_tcp(host, port, client_id="bench-flood-baseline-pub") as sender,
    ):
        sub.subscribe(BASELINE_TOPIC, received, qos=1)
        send_s = _send(sender, BASELINE_TOPIC, messages, size)
        deadline = time.monotonic() + timeout_s
        while len(seen) < messages and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(SETTLE_S)
    return {
        "sent_per_s": round(messages / send_s, 1),
        "received": state["count"],
        "distinct": len(seen),
        "duplicates": state["count"] - len(seen),
        "msgs_per_s": _per_s(state["count"], state["first"], state["last"]),
    }


def flood(
    tmp: Path,
    messages: int,
    size: int,
    *,
    delay_ms: float = 0.0,
    echo: bool = False,
    timeout_s: float = 300.0,
) -> dict[str, Any]:
    """The IoT Core flood through the nucleus and its baseline through mosquitto alone (see the module)."""
    from edgeinfer import procfs
    from edgeinfer.sim.broker import MosquittoBroker
    from edgeinfer.transport.base import Message
    from edgeinfer.transport.mqtt import MqttPubSub

    check_options(messages, size, delay_ms)
    recipes = tmp / "iot-recipes"
    recipes.mkdir()
    out = tmp / "iot-sink.json"
    sink_run = (
        f"{sys.executable} -u -m edgeinfer_bench.sim_iot --out {out} --topic {TOPIC} --delay-ms {delay_ms}"
    )
    if echo:
        sink_run += f" --echo {RESULT}"
    access = {"aws.greengrass.ipc.mqttproxy": {"bench": {"operations": ["*"], "resources": ["*"]}}}
    (recipes / "sink.json").write_text(json.dumps(component_recipe(SINK, sink_run, access)))
    work = tmp / "iot-core"
    with MosquittoBroker(work_dir=tmp / "iot-broker") as broker:
        baseline = _baseline(broker.host, broker.port, messages, size, timeout_s)
        proc = sim_up(
            recipes,
            work,
            "--thing",
            THING,
            "--broker",
            f"{broker.host}:{broker.port}",
            "--component-user",
            getpass.getuser(),
        )
        try:
            deadline = time.monotonic() + 120
            while not out.exists() and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.1)
            if not out.exists():
                raise EdgeinferError(f"the IoT sink did not subscribe: {sim_log(work)}")
            answers: set[int] = set()
            answered_at: list[float] = []

            def answered(message: Message) -> None:
                answers.add(int.from_bytes(message.payload[:8], "big"))
                answered_at.append(time.time())

            cpu0 = procfs.process_cpu_s(proc.pid)
            rss = PeakRss(proc.pid)
            with MqttPubSub.connect_tcp(broker.host, broker.port, client_id="bench-flood-sender") as sender:
                sender.subscribe(RESULT, answered, qos=1)
                send_s = _send(sender, TOPIC, messages, size)
                deadline = time.monotonic() + timeout_s
                while time.monotonic() < deadline and (
                    _read(out).get("distinct", 0) < messages or (echo and len(answers) < messages)
                ):
                    if proc.poll() is not None:
                        raise EdgeinferError(f"`edgeinfer sim up` exited during the flood: {sim_log(work)}")
                    time.sleep(0.2)
                time.sleep(SETTLE_S + 0.2)  # and one more write of the sink's counts
                got = _read(out)
                cpu_s = procfs.process_cpu_s(proc.pid) - cpu0
                peak_mb = rss.stop()
        finally:
            sim_down(proc)
    received = int(got.get("count", 0))
    through = _per_s(received, got.get("first"), got.get("last"))
    result: dict[str, Any] = {
        "messages": messages,
        "size": size,
        "sink_delay_ms": delay_ms,
        "sent_per_s": round(messages / send_s, 1),
        "received": received,
        "distinct": int(got.get("distinct", 0)),
        "duplicates": int(got.get("dups", 0)),
        "through_nucleus_per_s": through,
        "nucleus_cpu_s_per_1000": round(cpu_s / max(1, received) * 1000, 2),
        "nucleus_peak_rss_mb": round(peak_mb, 1),
        "mqtt_baseline": baseline,
        "ratio_msgs_per_s_vs_mqtt": round(through / baseline["msgs_per_s"], 3)
        if through and baseline["msgs_per_s"]
        else None,
    }
    if echo:
        result["answered"] = len(answers)
        result["answers_per_s"] = _per_s(
            len(answered_at), min(answered_at, default=None), max(answered_at, default=None)
        )
    return result


def sim_log(work: Path, chars: int = 600) -> str:
    from edgeinfer import procfs

    text = procfs.read(work / "logs" / f"{SINK}.log") or ""
    return " | ".join(text[-chars:].strip().splitlines()[-5:]) or "(no log)"


# ------------------------------------------------------------------- the sink (a component process)


def _sink(out: str, topic: str, delay_ms: float, echo: str) -> int:
    from awsiot.greengrasscoreipc.clientv2 import GreengrassCoreIPCClientV2
    from awsiot.greengrasscoreipc.model import QOS

    seen: set[int] = set()
    state: dict[str, Any] = {"count": 0, "dups": 0, "first": None, "last": None}
    lock = threading.Lock()
    delay = delay_ms / 1000
    pad = b"r" * (ANSWER_SIZE - 8)

    def on_event(event: Any) -> None:
        seq = int.from_bytes(event.message.payload[:8], "big")
        now = time.time()
        with lock:
            if seq in seen:
                state["dups"] += 1
            seen.add(seq)
            state["count"] += 1
            state["first"] = state["first"] or now
            state["last"] = now
        if delay:
            time.sleep(delay)
        if echo:
            client.publish_to_iot_core_async(
                topic_name=echo, qos=QOS.AT_LEAST_ONCE, payload=event.message.payload[:8] + pad
            )

    client = GreengrassCoreIPCClientV2(executor=None)  # handler on the IPC client's thread: backpressure
    client.subscribe_to_iot_core(topic_name=topic, qos=QOS.AT_LEAST_ONCE, on_stream_event=on_event)
    while True:
        with lock:
            snap = dict(state, distinct=len(seen))
        Path(out + ".tmp").write_text(json.dumps(snap))
        os.replace(out + ".tmp", out)
        time.sleep(0.2)


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--echo", default="")
    args = parser.parse_args(argv)
    return _sink(args.out, args.topic, args.delay_ms, args.echo)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
