"""A flood through the simulated nucleus's IoT Core path, measured from outside the nucleus.

`python -m tests.sim.iot_flood [--messages N] [--size BYTES] [--delay-ms MS]` starts mosquitto, runs
`edgeinfer sim up` (its own process) with one sink component that subscribes to IoT Core over IPC
(the real awsiotsdk client, handler on the IPC client's own thread, so a slow sink holds the
nucleus up), publishes N QoS 1 messages of BYTES each from an MQTT 5 client as fast as the broker
takes them, and reports as JSON: messages the sink received, distinct, duplicates, messages/s
through the nucleus (first to last receipt), the nucleus's CPU seconds per 1,000 messages, and its
peak resident memory (sampled every 50 ms during the flood). `--delay-ms` makes the sink slow
(that long per message); with `--echo` it answers each message with a 200-byte QoS 1
PublishToIoTCore, as the runtime answers a request, and the answers are counted too.

Timings on a shared machine are noisy: compare runs made side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from edgeinfer import procfs
from edgeinfer.sim import MosquittoBroker
from edgeinfer.transport.base import Message
from edgeinfer.transport.mqtt import MqttPubSub

THING = "flood"
TOPIC = f"edgeinfer/{THING}/infer"
RESULT = f"edgeinfer/{THING}/result"
SINK = "com.example.FloodSink"

SINK_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, threading, time
    from awsiot.greengrasscoreipc.clientv2 import GreengrassCoreIPCClientV2
    from awsiot.greengrasscoreipc.model import QOS

    out, topic, delay = sys.argv[1], sys.argv[2], float(sys.argv[3]) / 1000
    echo = sys.argv[4] if len(sys.argv) > 4 else ""
    seen = set()
    state = {"count": 0, "dups": 0, "first": None, "last": None}
    lock = threading.Lock()

    def on_event(event):
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
        if echo:  # a small answer per message, as the runtime sends its results
            client.publish_to_iot_core_async(
                topic_name=echo, qos=QOS.AT_LEAST_ONCE, payload=event.message.payload[:8] + b"r" * 192
            )

    client = GreengrassCoreIPCClientV2(executor=None)  # on the IPC client's thread: backpressure
    client.subscribe_to_iot_core(topic_name=topic, qos=QOS.AT_LEAST_ONCE, on_stream_event=on_event)
    while True:
        with lock:
            snap = dict(state, distinct=len(seen))
        with open(out + ".tmp", "w") as f:
            json.dump(snap, f)
        os.replace(out + ".tmp", out)
        time.sleep(0.2)
    """
)


def _recipe(python: str, script: Path, out: Path, delay_ms: float, echo: bool) -> dict[str, Any]:
    access = {"aws.greengrass.ipc.mqttproxy": {"s": {"operations": ["*"], "resources": ["*"]}}}
    return {
        "RecipeFormatVersion": "2020-01-25",
        "ComponentName": SINK,
        "ComponentVersion": "1.0.0",
        "ComponentConfiguration": {"DefaultConfiguration": {"accessControl": access}},
        "Manifests": [
            {
                "Platform": {"os": "*"},
                "Lifecycle": {
                    "Run": f"{python} -u {script} {out} {TOPIC} {delay_ms} {RESULT if echo else ''}"
                },
            }
        ],
    }


def _read(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


class _PeakRss:
    """The most resident memory a process had, sampled every 50 ms (`procfs`) until `stop()`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            rss = procfs.parse_status_rss(procfs.read(procfs.PROC / str(self.pid) / "status") or "")
            self.peak = max(self.peak, rss or 0)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak / 2**20


def flood(messages: int, size: int, delay_ms: float, timeout_s: float, echo: bool = False) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="iot-flood-") as tmp, MosquittoBroker() as broker:
        root = Path(tmp)
        (root / "recipes").mkdir()
        script, out = root / "sink.py", root / "sink.json"
        script.write_text(SINK_SCRIPT)
        recipe = _recipe(sys.executable, script, out, delay_ms, echo)
        (root / "recipes" / "sink.yaml").write_text(yaml.safe_dump(recipe))
        work = root / "core"
        up = [sys.executable, "-m", "edgeinfer", "sim", "up", "--detach", "--recipes", str(root / "recipes")]
        up += ["--thing", THING, "--broker", f"{broker.host}:{broker.port}", "--work-dir", str(work)]
        up += ["--component-user", os.environ.get("USER") or "root"]
        subprocess.run(up, check=True, stdout=subprocess.DEVNULL)
        pid = int(json.loads((work / "status.json").read_text())["pid"])
        try:
            deadline = time.monotonic() + 60
            while not out.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            if not out.exists():
                raise SystemExit("the sink did not subscribe within 60 s")
            cpu0 = procfs.process_cpu_s(pid)
            rss = _PeakRss(pid)
            sender = MqttPubSub.connect_tcp(broker.host, broker.port, client_id="flood-sender")
            answers: set[int] = set()
            answered_at: list[float] = []

            def answered(message: Message) -> None:
                answers.add(int.from_bytes(message.payload[:8], "big"))
                answered_at.append(time.time())

            sender.subscribe(RESULT, answered, qos=1)
            body = os.urandom(size - 8)
            window = threading.BoundedSemaphore(256)
            t0 = time.monotonic()
            for seq in range(messages):
                window.acquire()
                done = sender.publish_future(TOPIC, seq.to_bytes(8, "big") + body, qos=1)
                done.add_done_callback(lambda _f: window.release())
            send_s = time.monotonic() - t0
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and (
                _read(out).get("distinct", 0) < messages or (echo and len(answers) < messages)
            ):
                time.sleep(0.2)
            time.sleep(1.0)  # room for a late duplicate
            got = _read(out)
            cpu_s = procfs.process_cpu_s(pid) - cpu0
            peak_mb = rss.stop()
            sender.close()
            span = (got.get("last") or 0) - (got.get("first") or 0)
            echoed = {}
            if echo:
                echo_span = answered_at[-1] - answered_at[0] if len(answered_at) > 1 else 0
                echoed = {
                    "answered": len(answers),
                    "answers_per_s": round(len(answered_at) / echo_span, 1) if echo_span > 0 else None,
                }
            return {
                "messages": messages,
                "size": size,
                "sink_delay_ms": delay_ms,
                "sent_per_s": round(messages / send_s, 1),
                "received": got.get("count", 0),
                "distinct": got.get("distinct", 0),
                "duplicates": got.get("dups", 0),
                "through_nucleus_per_s": round(got.get("count", 0) / span, 1) if span > 0 else None,
                "nucleus_cpu_s_per_1000": round(cpu_s / max(1, got.get("count", 0)) * 1000, 2),
                "nucleus_peak_rss_mb": round(peak_mb, 1),
                "load_avg_1m": os.getloadavg()[0],
                **echoed,
            }
        finally:
            subprocess.run(
                [sys.executable, "-m", "edgeinfer", "sim", "down", "--work-dir", str(work)],
                stdout=subprocess.DEVNULL,
                check=False,
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=5000)
    p.add_argument("--size", type=int, default=45_000, help="payload bytes (a 640×480 JPEG: ~45 KB)")
    p.add_argument("--delay-ms", type=float, default=0.0, help="the sink's time per message")
    p.add_argument("--timeout-s", type=float, default=300.0)
    p.add_argument("--echo", action="store_true", help="the sink answers each message on IoT Core")
    args = p.parse_args()
    print(json.dumps(flood(args.messages, args.size, args.delay_ms, args.timeout_s, args.echo)))


if __name__ == "__main__":
    main()
