"""`edgeinfer bench sim`: the simulated core's IPC and start-up speed, side by side with raw baselines.

1. Local pub/sub through the IPC server, measured inside a real component process with the awsiotsdk
   client: publish→receive latency (sequential ping, p50/p99) and throughput (windowed async publishes).
   Baseline in the same process and run: the same ping and flood through mosquitto (awscrt MQTT 3.1.1).
2. `edgeinfer sim up` (a fresh CLI process, foreground) until a hello-world component is RUNNING,
   against the baseline of starting the same Python interpreter (`python -c pass`).
3. IoT Core → IPC (`--iot-*`): an MQTT client floods QoS 1 messages through mosquitto and the
   nucleus (`sim up`, its own process) to a sink component subscribed over IPC (real awsiotsdk
   client). Figures: received / distinct / duplicates (exactly once: all three equal what was sent),
   msgs/s through the nucleus (the sink's first to last receipt), the nucleus's CPU s per 1,000
   messages and its peak RSS. Baseline in the same run: the same flood through mosquitto alone to
   an MQTT subscriber.

Timings on a shared machine are noisy: compare the ratios, measured side by side.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from edgeinfer.errors import EdgeinferError
from edgeinfer.files import write_output
from edgeinfer.stats import quantile

WORKER = "edgeinfer.bench.PubSub"
HELLO = "com.example.HelloWorld"
TARGETS = {"local_p50_ms": 1.0, "local_msgs_per_s": 2000.0, "up_to_running_s": 2.0}


def register_bench(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "sim",
        help="simulated core: IPC local pub/sub latency and throughput, `sim up` to RUNNING",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", type=Path, metavar="FILE", help="write the figures as JSON")
    p.add_argument("--pings", type=int, default=2000, help="sequential publish→receive samples")
    p.add_argument("--messages", type=int, default=20000, help="messages in the throughput run")
    p.add_argument("--starts", type=int, default=5, help="`sim up` runs to time")
    iot = p.add_argument_group("IoT Core part (mosquitto → nucleus → IPC sink)")
    iot.add_argument(
        "--iot-messages",
        type=int,
        metavar="N",
        default=2000,
        help="QoS 1 messages in the IoT Core flood (0: skip the part)",
    )
    iot.add_argument(
        "--iot-size",
        metavar="BYTES",
        type=int,
        default=45_000,
        help="bytes per message (a 640×480 JPEG: ~45 KB)",
    )
    iot.add_argument(
        "--iot-delay-ms",
        metavar="MS",
        type=float,
        default=0.0,
        help="the sink's time per message (a slow component)",
    )
    iot.add_argument(
        "--iot-echo",
        action="store_true",
        help="the sink answers each message with a 200-byte QoS 1 PublishToIoTCore, as the runtime does",
    )
    iot.add_argument(
        "--iot-timeout-s", metavar="S", type=float, default=300.0, help="longest wait for the flood to arrive"
    )
    p.set_defaults(func=run)


PUBSUB_ACCESS = {"aws.greengrass.ipc.pubsub": {"bench": {"operations": ["*"], "resources": ["bench/*"]}}}


def component_recipe(name: str, run: str, access: dict[str, Any] | None = None) -> dict[str, Any]:
    config: dict[str, Any] = {"accessControl": access} if access else {}
    return {
        "RecipeFormatVersion": "2020-01-25",
        "ComponentName": name,
        "ComponentVersion": "1.0.0",
        "ComponentConfiguration": {"DefaultConfiguration": config},
        "Manifests": [{"Platform": {"os": "*"}, "Lifecycle": {"Run": run}}],
    }


def sim_up(recipes: Path, work: Path, *options: str) -> subprocess.Popen[bytes]:
    """`edgeinfer sim up` in the foreground, a fresh CLI process in its own session: its pid is the
    nucleus's. `sim_down` stops it."""
    argv = [
        sys.executable,
        "-m",
        "edgeinfer",
        "sim",
        "up",
        "--recipes",
        str(recipes),
        "--work-dir",
        str(work),
    ]
    return subprocess.Popen(
        [*argv, *options],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def sim_down(proc: subprocess.Popen[bytes]) -> None:
    """The nucleus stops its components; whatever is left of its session is killed."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(60)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


def _bench_ipc(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from edgeinfer.sim.simulator import Simulator

    recipes = tmp / "ipc-recipes"
    recipes.mkdir()
    run = (
        f"{sys.executable} -m edgeinfer_bench.sim --out {{work:path}}/result.json "
        f"--pings {args.pings} --messages {args.messages} --broker-port BROKER_PORT"
    )
    (recipes / "worker.json").write_text(json.dumps(component_recipe(WORKER, run, PUBSUB_ACCESS)))
    from edgeinfer.sim.broker import MosquittoBroker

    with MosquittoBroker() as broker:
        text = (recipes / "worker.json").read_text().replace("BROKER_PORT", str(broker.port))
        (recipes / "worker.json").write_text(text)
        with Simulator(recipes, None, thing="bench", work_dir=tmp / "ipc-root", broker=broker.address) as sim:
            state = sim.wait_for_state(WORKER, ("FINISHED", "BROKEN"), timeout=600)
            if state != "FINISHED":
                raise EdgeinferError(f"the benchmark component failed: {sim.logs(WORKER)[-2000:]}")
            result: dict[str, Any] = json.loads((sim.root / "work" / WORKER / "result.json").read_text())

    # publisher and subscriber as two component processes, as the runtime and telemetry are
    recipes2 = tmp / "ipc2-recipes"
    recipes2.mkdir()
    for role in ("sink", "source"):
        run2 = (
            f"{sys.executable} -m edgeinfer_bench.sim --role {role} --out {{work:path}}/{role}.json "
            f"--messages {args.messages}"
        )
        (recipes2 / f"{role}.json").write_text(
            json.dumps(component_recipe(f"{WORKER}.{role}", run2, PUBSUB_ACCESS))
        )
    with Simulator(recipes2, None, thing="bench2", work_dir=tmp / "ipc2-root") as sim:
        for role in ("sink", "source"):
            name = f"{WORKER}.{role}"
            if sim.wait_for_state(name, ("FINISHED", "BROKEN"), timeout=600) != "FINISHED":
                raise EdgeinferError(f"the benchmark component failed: {sim.logs(name)[-2000:]}")
        sink = json.loads((sim.root / "work" / f"{WORKER}.sink" / "sink.json").read_text())
        source = json.loads((sim.root / "work" / f"{WORKER}.source" / "source.json").read_text())
    result["ipc_two_components"] = {
        "messages": args.messages,
        "msgs_per_s": args.messages / ((sink["last"] - source["start"]) / 1e9),
    }
    return result


def _bench_startup(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    recipes = tmp / "hello-recipes"
    recipes.mkdir()
    hello = f"{sys.executable} -u -c \"import time; print('Hello, World!'); time.sleep(600)\""
    (recipes / "hello.json").write_text(json.dumps(component_recipe(HELLO, hello)))
    ups: list[float] = []
    pythons: list[float] = []
    for i in range(args.starts):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        pythons.append(time.perf_counter() - t0)
        work = tmp / f"up{i}"
        t0 = time.perf_counter()
        proc = sim_up(recipes, work)
        elapsed = None
        try:
            deadline = t0 + 60
            while time.perf_counter() < deadline and proc.poll() is None:
                try:
                    status = json.loads((work / "status.json").read_text())
                    if status["components"][HELLO]["state"] == "RUNNING":
                        elapsed = time.perf_counter() - t0
                        break
                except (OSError, ValueError, KeyError):
                    pass
                time.sleep(0.005)
        finally:
            sim_down(proc)
        if elapsed is None:
            raise EdgeinferError("`edgeinfer sim up` did not bring hello world to RUNNING in 60 s")
        ups.append(elapsed)
    return {
        "runs": args.starts,
        "up_to_running_s": {"median": statistics.median(ups), "max": max(ups), "all": ups},
        "baseline_python_start_s": {"median": statistics.median(pythons)},
        "ratio_vs_python_start": statistics.median(ups) / statistics.median(pythons),
    }


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from edgeinfer_bench import sim_iot

    if args.pings < 1 or args.messages < 1 or args.starts < 1:
        raise EdgeinferError("--pings, --messages and --starts must be at least 1")
    sim_iot.check_options(args.iot_messages, args.iot_size, args.iot_delay_ms)
    iot: dict[str, Any] | None = None
    load_at_start = list(os.getloadavg())
    console = Console(stderr=True)
    with tempfile.TemporaryDirectory(prefix="ggbench-") as tmp_name:
        tmp = Path(tmp_name)
        with console.status("local pub/sub through the IPC server (a real component process)…"):
            ipc = _bench_ipc(args, tmp)
        with console.status(f"`edgeinfer sim up` to hello world RUNNING, {args.starts} runs…"):
            startup = _bench_startup(args, tmp)
        if args.iot_messages:
            what = f"{args.iot_messages} × {args.iot_size:,} B through IoT Core → nucleus → IPC"
            with console.status(f"{what}, and through mosquitto alone…"):
                iot = sim_iot.flood(
                    tmp,
                    args.iot_messages,
                    args.iot_size,
                    delay_ms=args.iot_delay_ms,
                    echo=args.iot_echo,
                    timeout_s=args.iot_timeout_s,
                )
    local = ipc["ipc"]
    raw = ipc["mqtt_baseline"]
    figures = {
        "local_p50_ms": local["p50_ms"],
        "local_msgs_per_s": local["msgs_per_s"],
        "up_to_running_s": startup["up_to_running_s"]["median"],
    }
    ratio_p50 = local["p50_ms"] / raw["p50_ms"]
    ratio_rate = local["msgs_per_s"] / raw["msgs_per_s"]
    results: dict[str, Any] = {
        "scenario": "sim",
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            # a shared machine: how busy it was (1, 5 and 15 min load averages)
            "load_avg_at_start": load_at_start,
            "load_avg_at_end": list(os.getloadavg()),
        },
        "local_pubsub": {
            **ipc,
            "ratio_p50_vs_mqtt": ratio_p50,
            "ratio_msgs_per_s_vs_mqtt": ratio_rate,
        },
        "startup": startup,
        "iot_core": iot,
        "targets": TARGETS,
        "met": {
            "local_p50_ms": figures["local_p50_ms"] <= TARGETS["local_p50_ms"],
            "local_msgs_per_s": figures["local_msgs_per_s"] >= TARGETS["local_msgs_per_s"],
            "up_to_running_s": figures["up_to_running_s"] <= TARGETS["up_to_running_s"],
        },
    }
    table = Table(title="edgeinfer bench sim")
    for col in ("measure", "simulated core", "baseline", "ratio", "target"):
        table.add_column(col)
    table.add_row(
        "local pub/sub p50 (ms)",
        f"{local['p50_ms']:.3f} (p99 {local['p99_ms']:.3f})",
        f"mosquitto {raw['p50_ms']:.3f} (p99 {raw['p99_ms']:.3f})",
        f"{ratio_p50:.2f}x",
        "≤ 1 ms",
    )
    table.add_row(
        "local pub/sub msgs/s",
        f"{local['msgs_per_s']:,.0f}",
        f"mosquitto {raw['msgs_per_s']:,.0f}",
        f"{ratio_rate:.2f}x",
        "≥ 2,000",
    )
    table.add_row(
        "  publisher ≠ subscriber",
        f"{ipc['ipc_two_components']['msgs_per_s']:,.0f}",
        "",
        "",
        "≥ 2,000",
    )
    table.add_row(
        "sim up → RUNNING (s)",
        f"{startup['up_to_running_s']['median']:.3f}",
        f"python start {startup['baseline_python_start_s']['median']:.3f}",
        f"{startup['ratio_vs_python_start']:.1f}x",
        "≤ 2 s",
    )
    if iot is not None:
        _iot_rows(table, iot)
    Console().print(table)
    if args.json:
        write_output(args.json, (json.dumps(results, indent=2) + "\n").encode())
    return 0


def _iot_rows(table: Any, iot: dict[str, Any]) -> None:
    base = iot["mqtt_baseline"]
    ratio = iot["ratio_msgs_per_s_vs_mqtt"]
    table.add_row(
        f"IoT Core → IPC msgs/s ({iot['size']:,} B)",
        f"{iot['through_nucleus_per_s'] or 0:,.0f}",
        f"mosquitto {base['msgs_per_s'] or 0:,.0f}",
        f"{ratio:.2f}x" if ratio else "",
        "",
    )
    table.add_row(
        "  received / distinct / dups of sent",
        f"{iot['received']} / {iot['distinct']} / {iot['duplicates']} of {iot['messages']}",
        f"{base['received']} / {base['distinct']} / {base['duplicates']}",
        "",
        "exactly once",
    )
    table.add_row(
        "  nucleus CPU s per 1,000; peak RSS",
        f"{iot['nucleus_cpu_s_per_1000']:.2f}; {iot['nucleus_peak_rss_mb']:.0f} MB",
        "",
        "",
        "",
    )
    if "answered" in iot:
        table.add_row(
            "  answers back (echo), per s", f"{iot['answered']}, {iot['answers_per_s'] or 0:,.0f}", "", "", ""
        )


# ---------------------------------------------------------------- the worker (a component process)


class _Probe:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.got = threading.Event()
        self.flood_count = 0
        self.flood_target = 0
        self.flood_done = threading.Event()
        self.lock = threading.Lock()

    def on_message(self, data: bytes) -> None:
        now = time.perf_counter_ns()
        if data[:1] == b"L":
            self.latencies.append((now - int(data[1:21])) / 1e6)
            self.got.set()
        else:
            with self.lock:
                self.flood_count += 1
                if self.flood_count >= self.flood_target:
                    self.flood_done.set()

    def run(self, publish: Any, pings: int, messages: int, window: int = 256) -> dict[str, float]:
        pad = b"x" * 40
        for _ in range(200):  # warm-up
            self.got.clear()
            publish(b"L%020d" % time.perf_counter_ns() + pad)
            self.got.wait(5)
        self.latencies.clear()
        for _ in range(pings):
            self.got.clear()
            publish(b"L%020d" % time.perf_counter_ns() + pad)
            if not self.got.wait(5):
                raise RuntimeError("a ping was lost")
        self.flood_target = messages
        in_flight: list[Any] = []
        t0 = time.perf_counter()
        for i in range(messages):
            fut = publish(b"F%020d" % i + pad)
            if fut is not None:
                in_flight.append(fut)
                if len(in_flight) >= window:
                    in_flight.pop(0).result(30)
        if not self.flood_done.wait(120):
            raise RuntimeError(f"flood: got {self.flood_count} of {messages}")
        elapsed = time.perf_counter() - t0
        return {
            "pings": pings,
            "p50_ms": quantile(self.latencies, 0.5),
            "p90_ms": quantile(self.latencies, 0.9),
            "p99_ms": quantile(self.latencies, 0.99),
            "messages": messages,
            "msgs_per_s": messages / elapsed,
        }


def _sink_or_source(role: str, out: str, messages: int) -> int:
    """Two components: the sink counts what the source floods (throughput across processes)."""
    from awsiot.greengrasscoreipc.clientv2 import GreengrassCoreIPCClientV2
    from awsiot.greengrasscoreipc.model import BinaryMessage, PublishMessage

    ipc = GreengrassCoreIPCClientV2()
    done = threading.Event()

    def publish(topic: str, data: bytes) -> Any:
        msg = PublishMessage(binary_message=BinaryMessage(message=data))
        return ipc.publish_to_topic_async(topic=topic, publish_message=msg)

    if role == "sink":
        state = {"count": 0, "first": 0, "last": 0}

        def on_flood(_event: Any) -> None:
            now = time.perf_counter_ns()
            state["count"] += 1
            state["first"] = state["first"] or now
            if state["count"] >= messages:
                state["last"] = now
                done.set()

        ipc.subscribe_to_topic(topic="bench/flood", on_stream_event=on_flood)
        while not state["count"] and not done.is_set():
            publish("bench/ready", b"ready").result(10)
            time.sleep(0.1)
        if not done.wait(300):
            raise RuntimeError(f"sink: got {state['count']} of {messages}")
        Path(out).write_text(json.dumps(state))
    else:
        ready = threading.Event()
        ipc.subscribe_to_topic(topic="bench/ready", on_stream_event=lambda _e: ready.set())
        if not ready.wait(60):
            raise RuntimeError("source: the sink never said ready")
        pad = b"x" * 40
        start = time.perf_counter_ns()
        in_flight: list[Any] = []
        for i in range(messages):
            in_flight.append(publish("bench/flood", b"F%020d" % i + pad))
            if len(in_flight) >= 256:
                in_flight.pop(0).result(30)
        for fut in in_flight:
            fut.result(30)
        Path(out).write_text(json.dumps({"start": start}))
    ipc.close()
    return 0


def _worker(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--pings", type=int, default=2000)
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--broker-port", type=int, default=0)
    parser.add_argument("--role", choices=("probe", "sink", "source"), default="probe")
    args = parser.parse_args(argv)
    if args.role != "probe":
        return _sink_or_source(args.role, args.out, args.messages)

    from awscrt import mqtt
    from awsiot.greengrasscoreipc.clientv2 import GreengrassCoreIPCClientV2
    from awsiot.greengrasscoreipc.model import BinaryMessage, PublishMessage

    ipc = GreengrassCoreIPCClientV2()
    probe = _Probe()
    ipc.subscribe_to_topic(
        topic="bench/ipc", on_stream_event=lambda ev: probe.on_message(ev.binary_message.message)
    )

    def ipc_publish(data: bytes) -> Any:
        msg = PublishMessage(binary_message=BinaryMessage(message=data))
        return ipc.publish_to_topic_async(topic="bench/ipc", publish_message=msg)

    ipc_figures = probe.run(ipc_publish, args.pings, args.messages)

    raw_probe = _Probe()
    conn = mqtt.Connection(
        client=mqtt.Client(None, None), host_name="127.0.0.1", port=args.broker_port, client_id="bench-raw"
    )
    conn.connect().result(10)
    conn.subscribe(
        "bench/raw", mqtt.QoS.AT_MOST_ONCE, callback=lambda topic, payload, **_: raw_probe.on_message(payload)
    )[0].result(10)
    raw_figures = raw_probe.run(
        lambda data: conn.publish("bench/raw", data, mqtt.QoS.AT_MOST_ONCE)[0], args.pings, args.messages
    )
    conn.disconnect().result(10)
    Path(args.out).write_text(json.dumps({"ipc": ipc_figures, "mqtt_baseline": raw_figures}))
    ipc.close()
    return 0


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1:]))
