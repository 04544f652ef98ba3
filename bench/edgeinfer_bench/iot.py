"""`edgeinfer bench iot`: the path through IoT Core measured black-box, as issue #19's "Done means" asks.

Set-up, one run: a mosquitto broker (as IoT Core), `edgeinfer sim up` (the simulated nucleus, its
own process) deploying the runtime's real recipe, so the runtime is its own component process
(`python -m edgeinfer.runtime`) behind the nucleus's IoT Core bridge. A sender process (an MQTT 5
client of its own) publishes 640×480 JPEG requests in the JSON contract with `sent_at` and
`deadline_ms` at QoS 1 on `edgeinfer/THING/infer`, open loop, at each rate for `--seconds`, then a
flood; this process's MQTT 5 client receives `edgeinfer/THING/result`.

Per load: requests sent and the rate the sender reached; answers per request id (exactly once, none
lost within 30 s of the load's end, duplicates); `ok` in time and `ok` after the deadline
(client-side: answer received minus `sent_at`); error codes; p50/p99 of the ok answers; time from
the load's end to its last answer; recovery: after the load a fresh probe every 100 ms until one
is answered ok in time; resident memory (VmRSS, every 200 ms) and CPU of the nucleus, the runtime
and mosquitto.

`--expiry-s N`: every request and probe carries MQTT 5 message expiry N s, the sender's answer to
a backlog: the broker discards a message that expires while it holds it, and the runtime answers
DEADLINE_EXCEEDED to one whose expiry ran out on its way. mosquitto 2.0.11 checks expiry only on
messages still queued for a subscriber: one already written to the subscriber's connection (the
bridge's, which holds its inbox and so leaves the backlog in the broker's output) travels with the
expiry left at the time of writing, and one written in its last second goes without any. The
discards are not observable (mosquitto counts none in `$SYS`), so an unanswered request counts as
`expired_in_broker` ("unanswered, sent with expiry N s") unless a later request of its load was
answered within N s of its sending, which proves the broker handed it on in time; then it is
`lost`. Without expiry, unanswered is lost.

Targets (#19's Done means): every request answered exactly once within 30 s of the load's end,
none lost (with expiry: none of those still within their expiry); a fresh request answered ok in
its deadline within 5 s of the load's end; no request older than its deadline answered ok (here:
at most 1 % of a load ok after its deadline, the requests already computing when their time ran
out); every process's RSS peak under `--rss-limit-mb`. The JSON says which were met; the exit
code is 0 unless the harness itself failed.

Over 500 lines because the processes it starts (broker, nucleus, sender), the sampler that finds
and watches them, and the exactly-once accounting are one run's set-up and are torn down together.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import multiprocessing
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from edgeinfer import procfs
from edgeinfer.errors import EdgeinferError
from edgeinfer.stats import quantile
from edgeinfer_bench.requests import Template, timed_templates

THING = "bench-iot"
DEFAULT_RATES = "100,200,400"
FLOOD_RPS = 2000.0
DEADLINE_MS = 100.0
ANSWER_WINDOW_S = 30.0  # an answer later than this after the load's end counts as lost
RECOVERY_TARGET_S = 5.0
OK_LATE_SHARE = 0.01  # ok answers past their deadline allowed per load (those computing at expiry)
RSS_LIMIT_MB = 1024.0
PROBE_INTERVAL_S = 0.1
SAMPLE_INTERVAL_S = 0.2
START_TIMEOUT_S = 180.0
FINAL_WAIT_S = 30.0  # at the run's end, for whatever is still unanswered
ACK_TIMEOUT_S = 60.0  # the sender waits this long for its last PUBACKs
PROCESSES = ("nucleus", "runtime", "broker")
LOST_MEANS = "no answer within answer_window_s of the load's end"
LOST_MEANS_EXPIRY = (
    "no answer within answer_window_s of the load's end, less the unanswered requests the broker may "
    "have discarded at their message expiry (expired_in_broker: no later request of the load was "
    "answered within message_expiry_s of their sending)"
)
PROBE_FIELDS = ("sent", "answered", "duplicates", "ok_in_time", "codes", "expired_in_broker")


def register_bench(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "iot",
        help="the IoT Core path black-box: exactly-once answers, recovery and memory at 100-2000 req/s",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", type=Path, metavar="FILE", help="write the figures as JSON")
    p.add_argument(
        "--store",
        "--model-dir",
        dest="store",
        type=Path,
        metavar="DIR",
        help="model store the runtime serves (default: the built one, `edgeinfer model build`)",
    )
    p.add_argument("--rates", default=DEFAULT_RATES, help=f"req/s of the loads (default {DEFAULT_RATES})")
    p.add_argument(
        "--flood",
        type=float,
        default=FLOOD_RPS,
        help=f"the flood's target req/s, 0: none (default {FLOOD_RPS:g})",
    )
    p.add_argument("--seconds", type=float, default=10.0, help="seconds of sending per load (default 10)")
    p.add_argument(
        "--all-requests",
        action="store_true",
        help="send rate × seconds requests even where the sender falls behind (the load then lasts "
        "longer); default: stop at --seconds and report the rate reached",
    )
    p.add_argument("--deadline-ms", type=float, default=DEADLINE_MS, help="every request's deadline_ms")
    p.add_argument(
        "--recovery-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="probe this long after a load at most (default 60)",
    )
    p.add_argument(
        "--gap", type=float, default=2.0, metavar="S", help="quiet seconds between loads (default 2)"
    )
    p.add_argument(
        "--config",
        metavar="JSON",
        default="{}",
        help="runtime recipe keys merged over the defaults (e.g. '{\"maxQueueSize\": 32}')",
    )
    p.add_argument(
        "--expiry-s",
        type=int,
        default=None,
        metavar="N",
        help="MQTT 5 message expiry (whole seconds) on every request and probe: the broker discards "
        "what it held longer (default: none)",
    )
    p.add_argument("--nucleus", choices=("classic", "lite"), default="classic", help="the nucleus simulated")
    p.add_argument(
        "--rss-limit-mb",
        type=float,
        default=RSS_LIMIT_MB,
        help=f"RSS target per process (default {RSS_LIMIT_MB:g})",
    )
    p.add_argument("--keep", action="store_true", help="keep the work folder (logs) and print where it is")
    p.set_defaults(func=run)


def _progress(text: str) -> None:
    print(f"bench iot: {text}", file=sys.stderr, flush=True)


# -------------------------------------------------------------------------------- the sender process


@dataclass(frozen=True)
class LoadSpec:
    """What a sender process sends: `rate` req/s for `seconds` (or all rate × seconds requests)."""

    address: tuple[str, int]
    topic: str
    parts: list[Template]
    label: str
    rate: float
    seconds: float
    all_requests: bool
    expiry_s: int | None = None  # MQTT 5 message expiry on every request


def request_properties(expiry_s: int | None) -> Any:
    """The publish properties of a request: MQTT 5 message expiry when one is asked for."""
    from edgeinfer.transport.base import MqttProperties

    return MqttProperties(message_expiry_s=expiry_s) if expiry_s is not None else None


def sender_main(conn: Connection, spec: LoadSpec) -> None:
    """The load: its own process and MQTT 5 connection. Says `ready`, waits for `go`, sends open loop
    (request i due at start + i / rate), says `ended` at its last hand-off, then `done` with every
    request id and its `sent_at` once the broker acknowledged them all (or ACK_TIMEOUT_S passed)."""
    from edgeinfer.transport.mqtt import MqttPubSub

    client = MqttPubSub.connect_tcp(*spec.address, client_id=f"bench-iot-sender-{spec.label}-{os.getpid()}")
    try:
        _send_load(conn, client, spec)
    except KeyboardInterrupt:  # Ctrl-C reaches the whole group: the parent reports it
        pass
    finally:
        client.close()
        conn.close()


def _send_load(conn: Connection, client: Any, spec: LoadSpec) -> None:
    from concurrent.futures import Future

    from edgeinfer.transport import TransportError

    # The first publish and the first body cost this process ~0.1 s (lazy set-up): spent here,
    # not in request 0's latency.
    client.publish("bench-iot/warm-up", spec.parts[0].body("warm-up", time.time()), qos=1)
    conn.send(("ready", None))
    if not conn.poll(120) or conn.recv()[0] != "go":
        return
    acked: list[float] = []
    failed: list[float] = []
    lock = threading.Lock()

    def on_ack(fut: Future[None]) -> None:
        now = time.time()
        with lock:
            if fut.exception() is not None:
                failed.append(now)
            acked.append(now)

    sent: list[tuple[str, float]] = []
    not_sent = 0
    most_behind = 0.0
    rate, seconds, parts = spec.rate, spec.seconds, spec.parts
    props = request_properties(spec.expiry_s)
    target = round(rate * seconds)
    gc.disable()  # a collection's pause would send a burst behind it
    t0 = time.monotonic()
    start_wall = time.time()
    for i in range(target):
        due = t0 + i / rate
        now = time.monotonic()
        if not spec.all_requests and now >= t0 + seconds:
            break
        if due > now:
            time.sleep(due - now)
        else:
            most_behind = max(most_behind, now - due)
        rid = f"{spec.label}-{i}"
        sent_at = time.time()
        try:
            fut = client.publish_future(
                spec.topic, parts[i % len(parts)].body(rid, sent_at), qos=1, properties=props
            )
        except TransportError:
            not_sent += 1  # never handed to the client: not counted as sent
            continue
        sent.append((rid, sent_at))
        fut.add_done_callback(on_ack)
    end_wall = time.time()
    gc.enable()
    conn.send(("ended", end_wall))
    limit = time.monotonic() + ACK_TIMEOUT_S
    while time.monotonic() < limit:
        with lock:
            if len(acked) >= len(sent):
                break
        time.sleep(0.05)
    with lock:
        report = {
            "sent": sent,
            "start": start_wall,
            "end": end_wall,
            "target": target,
            "not_sent": not_sent,
            "puback_failed": len(failed),
            "puback_missing": len(sent) - len(acked),
            "last_puback": max(acked, default=end_wall),
            "most_behind_s": most_behind,
            # the load generator's own cost: it shares the machine with what it measures
            "cpu_s": time.process_time(),
            "rss_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
    conn.send(("done", report))


class Sender:
    """One load's sender process (spawned: no threads or sockets of this process go with it)."""

    def __init__(self, spec: LoadSpec) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=sender_main,
            args=(child, spec),
            name=f"bench-iot-sender-{spec.label}",
            daemon=True,
        )
        self.proc.start()
        child.close()
        self.limit = spec.seconds * (20 if spec.all_requests else 1) + ACK_TIMEOUT_S + 60

    def _expect(self, what: str, timeout: float) -> Any:
        if not self._conn.poll(timeout):
            raise EdgeinferError(f"the sender process did not say {what} within {timeout:g} s")
        try:
            kind, value = self._conn.recv()
        except EOFError:
            raise EdgeinferError(
                f"the sender process ended before {what} (exit {self.proc.exitcode})"
            ) from None
        if kind != what:
            raise EdgeinferError(f"the sender process said {kind}, not {what}")
        return value

    def ready(self) -> None:
        self._expect("ready", 60)

    def go(self) -> float:
        """Start sending; returns the wall time of the load's last hand-off."""
        self._conn.send(("go", None))
        return float(self._expect("ended", self.limit))

    def report(self, timeout: float = 0.0) -> dict[str, Any] | None:
        """The sender's figures once it has them (its PUBACKs are in), else None."""
        if not self._conn.poll(timeout):
            return None
        report: dict[str, Any] = self._expect("done", 0)
        return report

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._conn.close()
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


# ------------------------------------------------------------------------------------ the receiver


@dataclass
class Answers:
    """Every result received, per request id, with the wall time it arrived."""

    by_id: dict[str, list[tuple[float, Any]]] = field(default_factory=dict)
    unreadable: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handler(self, message: Any) -> None:
        from edgeinfer.messages import Result

        now = time.time()
        try:
            result = Result.parse(message.payload)
        except Exception:
            with self.lock:
                self.unreadable += 1
            return
        with self.lock:
            self.by_id.setdefault(result.id or "", []).append((now, result))

    def first(self, rid: str) -> tuple[float, Any] | None:
        with self.lock:
            got = self.by_id.get(rid)
            return got[0] if got else None

    def count(self, ids: list[str]) -> int:
        with self.lock:
            return sum(1 for rid in ids if rid in self.by_id)

    def snapshot(self) -> dict[str, list[tuple[float, Any]]]:
        with self.lock:
            return {k: list(v) for k, v in self.by_id.items()}


class BrokerSys:
    """mosquitto's own counters from its `$SYS` topics (every 10 s, its default `sys_interval`; the
    broker fixture's config sets none). mosquitto 2.0.11 counts no expired messages: it discards an
    expired queued message without counting it in `publish/messages/dropped`, which counts only the
    queue limits' drops. So `dropped` staying put says the queue limits dropped nothing."""

    TOPICS = ("$SYS/broker/publish/messages/+", "$SYS/broker/store/messages/count")

    def __init__(self) -> None:
        self.values: dict[str, int] = {}
        self.updated = 0.0
        self.lock = threading.Lock()

    def subscribe(self, client: Any) -> None:
        for topic in self.TOPICS:
            client.subscribe(topic, self.handler, qos=0)

    def handler(self, message: Any) -> None:
        try:
            value = int(message.payload.split()[0])
        except (ValueError, IndexError):
            return
        with self.lock:
            self.values[message.topic.removeprefix("$SYS/broker/").replace("/", "_")] = value
            self.updated = time.time()

    def snapshot(self, fresher_than: float | None = None, timeout: float = 12.0) -> dict[str, Any]:
        """The latest values, after waiting up to `timeout` for a report newer than `fresher_than`."""
        limit = time.monotonic() + (timeout if fresher_than is not None else 0.0)
        while fresher_than is not None and time.monotonic() < limit:
            with self.lock:
                if self.updated > fresher_than:
                    break
            time.sleep(0.2)
        with self.lock:
            return {**dict(sorted(self.values.items())), "as_of": round(self.updated, 3) or None}


def summarize(
    sent: list[tuple[str, float]],
    answers: dict[str, list[tuple[float, Any]]],
    load_end: float,
    deadline_ms: float,
    window_s: float = ANSWER_WINDOW_S,
    *,
    expiry_s: int | None = None,
) -> dict[str, Any]:
    """Exactly-once accounting of one load, client side: `answered` within `window_s` of the load's
    end, `lost` otherwise (`answered_after_window` of those came later), `duplicates` every answer
    beyond the first, ok in time / late by answer time minus `sent_at`. `sent` is in sending order,
    one publisher's requests.

    With `expiry_s` (the requests' MQTT 5 message expiry) an unanswered request counts as
    `expired_in_broker` unless a later request of `sent` was answered within `expiry_s` of this one's
    `sent_at`: the broker hands one publisher's messages to a subscriber in order, so that later
    answer proves this one was handed on before its expiry ran out (the broker received it no earlier
    than `sent_at`), and it counts as `lost`. The broker's discards themselves are not observable:
    `expired_in_broker` means "unanswered, and the broker may have discarded it as the sender
    instructed". Without expiry every unanswered request is lost."""
    answered = lost = after_window = duplicates = ok_in_time = ok_late = unanswered = 0
    expired = 0
    codes: dict[str, int] = {}
    ok_ms: list[float] = []
    last = None
    # per request, the earliest first answer of any request sent after it (sending order)
    later_answer = [math.inf] * len(sent)
    earliest = math.inf
    for i in range(len(sent) - 1, -1, -1):
        later_answer[i] = earliest
        got = answers.get(sent[i][0])
        if got:
            earliest = min(earliest, got[0][0])
    for (rid, sent_at), later in zip(sent, later_answer, strict=True):
        got = answers.get(rid)
        if not got:
            unanswered += 1
            if expiry_s is not None and later - sent_at > expiry_s:
                expired += 1
            else:
                lost += 1
            continue
        duplicates += len(got) - 1
        at, result = got[0]
        if at > load_end + window_s:
            lost += 1
            after_window += 1
            continue
        answered += 1
        last = at if last is None else max(last, at)
        latency_ms = (at - sent_at) * 1000
        if result.status == "ok":
            ok_ms.append(latency_ms)
            if latency_ms <= deadline_ms:
                ok_in_time += 1
            else:
                ok_late += 1
        else:
            code = result.error.code.value if result.error is not None else "UNKNOWN"
            codes[code] = codes.get(code, 0) + 1
    return {
        "sent": len(sent),
        "answered": answered,
        "lost": lost,
        "answered_after_window": after_window,
        "unanswered": unanswered,
        "expiry_s": expiry_s,
        "expired_in_broker": expired if expiry_s is not None else None,
        "duplicates": duplicates,
        "exactly_once": lost == 0 and duplicates == 0,
        "ok_in_time": ok_in_time,
        "ok_late": ok_late,
        "codes": dict(sorted(codes.items())),
        "ok_p50_ms": _round(quantile(ok_ms, 0.5)),
        "ok_p99_ms": _round(quantile(ok_ms, 0.99)),
        "last_answer_after_load_s": _round(last - load_end) if last is not None else None,
    }


def _round(value: float, digits: int = 3) -> float | None:
    return None if math.isnan(value) else round(value, digits)  # no samples: null in the JSON


# ------------------------------------------------------------------------------------- processes


def descendants(pid: int) -> Iterator[int]:
    """Every process below `pid` (children of each of its threads, recursively)."""
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(procfs.PROC / str(parent) / "task")
        except OSError:
            continue
        for tid in tasks:
            text = procfs.read(procfs.PROC / str(parent) / "task" / tid / "children") or ""
            for child in text.split():
                yield int(child)
                todo.append(int(child))


def find_runtime(nucleus_pid: int) -> int | None:
    """The runtime component's process among the nucleus's descendants (its run script `exec`s it)."""
    for pid in descendants(nucleus_pid):
        argv = procfs.cmdline(pid) or []
        if b"edgeinfer.runtime" in argv and b"-c" not in argv:
            return pid
    return None


class Sampler:
    """VmRSS and CPU seconds of the nucleus, the runtime and the broker every SAMPLE_INTERVAL_S. The
    runtime's pid is looked up again whenever it is gone (a restart); every pid it had is kept."""

    def __init__(self, nucleus: int, broker: int) -> None:
        self.pids: dict[str, int | None] = {
            "nucleus": nucleus,
            "runtime": find_runtime(nucleus),
            "broker": broker,
        }
        self.runtime_pids = {self.pids["runtime"]} - {None}
        self.samples: list[tuple[float, dict[str, int | None], dict[str, float]]] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="bench-iot-rss", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            self.sample()

    def sample(self) -> None:
        rss: dict[str, int | None] = {}
        cpu: dict[str, float] = {}
        for name in PROCESSES:
            pid = self.pids[name]
            value = procfs.process_rss_bytes(pid) if pid else None
            if value is None and name == "runtime":
                pid = self.pids["runtime"] = find_runtime(int(self.pids["nucleus"] or 0))
                if pid:
                    self.runtime_pids.add(pid)
                    value = procfs.process_rss_bytes(pid)
            rss[name] = value
            cpu[name] = procfs.process_cpu_s(pid) if pid else 0.0
        with self._lock:
            self.samples.append((time.time(), rss, cpu))

    def between(self, t0: float, t1: float) -> dict[str, Any]:
        """Peak and last RSS (MB) and the CPU share (cores) of each process in [t0, t1]."""
        with self._lock:
            inside = [s for s in self.samples if t0 <= s[0] <= t1]
        out: dict[str, Any] = {}
        for name in PROCESSES:
            values = [s[1][name] for s in inside if s[1][name] is not None]
            mb = [v / 2**20 for v in values if v is not None]
            share = None
            if len(inside) >= 2 and inside[-1][0] > inside[0][0]:
                spent = inside[-1][2][name] - inside[0][2][name]
                share = round(max(0.0, spent) / (inside[-1][0] - inside[0][0]), 3) if spent >= 0 else None
            out[name] = {
                "rss_peak_mb": round(max(mb), 1) if mb else None,
                "rss_last_mb": round(mb[-1], 1) if mb else None,
                "cpu_cores": share,
            }
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


class Core:
    """mosquitto and `edgeinfer sim up` (foreground, its own session) with the runtime deployed."""

    def __init__(self, root: Path, store: Path, runtime_config: dict[str, Any], nucleus: str) -> None:
        from edgeinfer.sim.broker import MosquittoBroker

        self.root = root
        self.store = store
        self.runtime_config = runtime_config
        self.nucleus = nucleus
        self.broker = MosquittoBroker(work_dir=root / "broker")
        self.proc: subprocess.Popen[bytes] | None = None
        self.broker_pid = 0

    def start(self) -> None:
        """Broker, then the nucleus, until the runtime reported RUNNING; `stop()` undoes any part."""
        from edgeinfer.sim.testing import RUNTIME, prepare_device

        root = self.root
        self.broker.start()
        conf = str(root / "broker" / "mosquitto.conf").encode()
        found = procfs.find_pids(lambda argv: conf in argv)
        if not found:
            raise EdgeinferError("the broker's process was not found in /proc")
        self.broker_pid = found[0]
        recipes, artifacts = prepare_device(root / "device", self.store)
        self.work = root / "core"
        argv = [sys.executable, "-m", "edgeinfer", "sim", "up", "--recipes", str(recipes)]
        argv += ["--artifacts", str(artifacts), "--work-dir", str(self.work), "--thing", THING]
        argv += ["--broker", f"{self.broker.host}:{self.broker.port}", "--nucleus", self.nucleus]
        argv += ["--config-merge", f"{RUNTIME}={json.dumps(self.runtime_config)}"]
        self.out = root / "sim.out"
        with self.out.open("wb") as out:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
            )
        self._wait_ready(RUNTIME)

    @property
    def address(self) -> tuple[str, int]:
        return self.broker.host, self.broker.port

    def _wait_ready(self, component: str) -> None:
        limit = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < limit:
            self.check()
            with contextlib.suppress(OSError, ValueError):
                status = json.loads((self.work / "status.json").read_text())
                info = status.get("components", {}).get(component, {})
                if info.get("reported") == "RUNNING":
                    return
                if info.get("state") == "BROKEN":
                    raise EdgeinferError(f"{component} is BROKEN: {self.log_tail(component)}")
            time.sleep(0.1)
        raise EdgeinferError(
            f"{component} did not report RUNNING in {START_TIMEOUT_S:g} s: {self.log_tail(component)}"
        )

    def log_tail(self, component: str, chars: int = 600) -> str:
        text = procfs.read(self.work / "logs" / f"{component}.log") or procfs.read(self.out) or ""
        return " | ".join(text[-chars:].strip().splitlines()[-5:])

    def check(self) -> None:
        """EdgeinferError once the nucleus or the broker is gone: the figures would mean nothing."""
        if self.proc is not None and self.proc.poll() is not None:
            raise EdgeinferError(
                f"`edgeinfer sim up` exited ({self.proc.returncode}): {self.log_tail('sim')}"
            )
        if self.broker_pid:
            state = procfs.stat(self.broker_pid)
            if state is None or state.state in ("Z", "X"):
                raise EdgeinferError("mosquitto exited during the run")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        """The nucleus stops its components; whatever is left of its session is killed."""
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(30)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        self.broker.stop()


# ------------------------------------------------------------------------------------------- a load


class Prober:
    """Fresh requests every PROBE_INTERVAL_S from this process's client, until one is answered ok
    within its deadline; each with the requests' message expiry (`properties`)."""

    def __init__(
        self,
        client: Any,
        topic: str,
        part: Template,
        answers: Answers,
        deadline_ms: float,
        *,
        properties: Any = None,
    ) -> None:
        self.client, self.topic, self.part, self.answers = client, topic, part, answers
        self.deadline_ms = deadline_ms
        self.properties = properties
        self.sent: list[tuple[str, float]] = []
        self.recovered_at: float | None = None

    def step(self, label: str) -> None:
        """Check the probes so far; send the next one unless one was answered ok in time."""
        from edgeinfer.transport import TransportError

        for rid, sent_at in self.sent:
            got = self.answers.first(rid)
            if got is not None and got[1].status == "ok" and (got[0] - sent_at) * 1000 <= self.deadline_ms:
                self.recovered_at = got[0] if self.recovered_at is None else min(self.recovered_at, got[0])
        if self.recovered_at is not None:
            return
        rid = f"probe-{label}-{len(self.sent)}"
        sent_at = time.time()
        with contextlib.suppress(TransportError):  # a refused hand-off: the next probe tries again
            self.client.publish(
                self.topic, self.part.body(rid, sent_at), qos=1, wait=False, properties=self.properties
            )
            self.sent.append((rid, sent_at))


def run_load(
    args: argparse.Namespace,
    *,
    core: Core,
    client: Any,
    answers: Answers,
    sampler: Sampler,
    broker_sys: BrokerSys,
    parts: list[Template],
    label: str,
    rate: float,
) -> dict[str, Any]:
    from edgeinfer.messages import infer_topic

    topic = infer_topic(THING)
    expiry_s = args.expiry_s
    spec = LoadSpec(core.address, topic, parts, label, rate, args.seconds, args.all_requests, expiry_s)
    sender = Sender(spec)
    try:
        sender.ready()
        load_avg_before = _loadavg()
        sys_start = broker_sys.snapshot()
        _progress(f"{label}: {rate:g} req/s for {args.seconds:g} s")
        start = time.time()
        load_end = sender.go()
        prober = Prober(
            client, topic, parts[0], answers, args.deadline_ms, properties=request_properties(expiry_s)
        )
        report: dict[str, Any] | None = None
        ids: list[str] = []
        # Until every request is answered (or its window is over) and a probe came back ok in time
        # (or the recovery timeout): probing from the load's end on, while the sender still waits
        # for its PUBACKs (it names the requests it sent once they are in).
        next_line = time.time() + 5
        while True:
            core.check()
            now = time.time()
            if report is None:
                report = sender.report()
                if report is None and now > load_end + ACK_TIMEOUT_S + 30:
                    raise EdgeinferError("the sender process did not report its requests")
                ids = [rid for rid, _ in report["sent"]] if report is not None else []
            if prober.recovered_at is None and now < load_end + args.recovery_timeout:
                prober.step(label)
            got = answers.count(ids)
            drained = report is not None and (got >= len(ids) or now >= load_end + ANSWER_WINDOW_S)
            if drained and (prober.recovered_at is not None or now >= load_end + args.recovery_timeout):
                break
            if now >= next_line:
                state = "recovered" if prober.recovered_at is not None else "not yet recovered"
                if report is None:
                    state += ", the sender still waits for PUBACKs"
                _progress(
                    f"{label}: {got} of {len(ids)} answered {now - load_end:.0f} s after the load, {state}"
                )
                next_line = now + 5
            time.sleep(PROBE_INTERVAL_S)
        time.sleep(1.0)  # a duplicate, if any, would come now
        settled = time.time()
    finally:
        sender.close()
    assert report is not None  # the loop ends only once the sender reported
    snapshot = answers.snapshot()
    summary = summarize(report["sent"], snapshot, load_end, args.deadline_ms, expiry_s=expiry_s)
    probes = summarize(prober.sent, snapshot, load_end, args.deadline_ms, math.inf, expiry_s=expiry_s)
    duration = max(1e-9, report["end"] - report["start"])
    out = {
        "label": label,
        "target_rps": rate,
        "reached_rps": round(len(report["sent"]) / duration, 1),
        "seconds": round(duration, 3),
        "requests_due": report["target"],
        "not_handed_off": report["not_sent"],
        "puback_failed": report["puback_failed"],
        "puback_missing": report["puback_missing"],
        "last_puback_after_load_s": round(report["last_puback"] - load_end, 3),
        "sender_most_behind_s": round(report["most_behind_s"], 3),
        "sender_cpu_s": round(report["cpu_s"], 2),
        "sender_rss_peak_mb": round(report["rss_peak_mb"], 1),
        **summary,
        "fresh_request_ok_after_s": _round(prober.recovered_at - load_end)
        if prober.recovered_at is not None
        else None,
        # answered: by the time the load was settled (the last probes may still be on their way)
        # the same from the broker's last PUBACK: what the sender's own client queue held is not
        # the device's backlog (the target above counts it, this does not)
        "fresh_request_ok_after_last_puback_s": _round(prober.recovered_at - report["last_puback"])
        if prober.recovered_at is not None
        else None,
        "probes": {k: probes[k] for k in PROBE_FIELDS},
        "processes": sampler.between(start, settled),
        "broker_sys_at_start": sys_start,
        "broker_sys_settled": broker_sys.snapshot(),
        "loadavg_before": load_avg_before,
        "loadavg_after": _loadavg(),
    }
    out["_sent"] = (report["sent"], prober.sent, load_end)
    _progress(
        f"{label}: {out['answered']}/{out['sent']} answered, {out['duplicates']} duplicates, "
        f"{out['ok_in_time']} ok in time, {out['ok_late']} ok late, fresh ok after "
        f"{_seconds(out['fresh_request_ok_after_s'])}"
    )
    return out


def final_accounting(
    loads: list[dict[str, Any]], answers: Answers, deadline_ms: float, expiry_s: int | None
) -> dict[str, int]:
    """Requests and probes with no answer at all, per load, after waiting up to FINAL_WAIT_S more for
    them: `lost` counts an answer later than the window too; this tells the two apart. Each load's
    accounting is then redone on every answer received (duplicates that came late included), so its
    `unanswered` and `expired_in_broker` are those after the final wait."""
    sent: dict[str, tuple[list[tuple[str, float]], list[tuple[str, float]], float]] = {
        r["label"]: r.pop("_sent") for r in loads
    }
    ids = {label: [rid for rid, _ in s[0] + s[1]] for label, s in sent.items()}

    def missing() -> dict[str, int]:
        return {label: len(v) - answers.count(v) for label, v in ids.items()}

    limit = time.monotonic() + FINAL_WAIT_S
    while time.monotonic() < limit and any(missing().values()):
        time.sleep(0.2)
    snapshot = answers.snapshot()
    for r in loads:
        requests, probes, load_end = sent[r["label"]]
        r.update(summarize(requests, snapshot, load_end, deadline_ms, expiry_s=expiry_s))
        again = summarize(probes, snapshot, load_end, deadline_ms, math.inf, expiry_s=expiry_s)
        r["probes"] = {k: again[k] for k in PROBE_FIELDS}
    return missing()


def _loadavg() -> list[float]:
    text = procfs.read(procfs.PROC / "loadavg") or ""
    try:
        return [float(x) for x in text.split()[:3]]
    except ValueError:
        return []


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


# ----------------------------------------------------------------------------------------- targets


def targets(loads: list[dict[str, Any]], rss_limit_mb: float) -> dict[str, bool]:
    out: dict[str, bool] = {}
    for r in loads:
        name = r["label"]
        # with expiry, what the broker may have discarded on the sender's instruction is not lost
        once = "exactly_once" if r.get("expiry_s") is None else "exactly_once_or_expired"
        out[f"{name}_{once}_within_{ANSWER_WINDOW_S:g}s"] = r["exactly_once"]
        fresh = r["fresh_request_ok_after_s"]
        out[f"{name}_fresh_request_ok_within_{RECOVERY_TARGET_S:g}s"] = (
            fresh is not None and fresh <= RECOVERY_TARGET_S
        )
        out[f"{name}_ok_late_at_most_{100 * OK_LATE_SHARE:g}pct"] = r["ok_late"] <= OK_LATE_SHARE * max(
            1, r["sent"]
        )
        for what, names in (("device", ("nucleus", "runtime")), ("broker", ("broker",))):
            peaks = [r["processes"][n]["rss_peak_mb"] for n in names]
            out[f"{name}_{what}_rss_peak_under_{rss_limit_mb:g}mb"] = (
                None not in peaks and max(peaks) <= rss_limit_mb
            )
    return out


def print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"bench iot: deadline {report['deadline_ms']:g} ms, QoS 1, "
        f"load average {report['machine']['loadavg_start']}"
    )
    columns = ("rate", "sent / answered", "dup", "ok in time (p50)", "ok late", "errors",
               "last answer after load", "fresh ok after", "RSS peak MB nucleus/runtime/broker")  # fmt: skip
    for col in columns:
        table.add_column(col, justify="right")
    for r in report["loads"]:
        rate = f"{r['target_rps']:g}"
        if r["reached_rps"] < 0.95 * r["target_rps"]:
            rate += f" (reached {r['reached_rps']:.0f})"
        p50 = f" ({r['ok_p50_ms']:.0f} ms)" if r["ok_p50_ms"] is not None else ""
        rss = " / ".join(
            "-" if r["processes"][n]["rss_peak_mb"] is None else f"{r['processes'][n]['rss_peak_mb']:.0f}"
            for n in PROCESSES
        )
        counts = f"{r['sent']:,} / {r['answered']:,}" + (f" ({r['lost']} lost)" if r["lost"] else "")
        if r.get("expired_in_broker"):
            counts += f" ({r['expired_in_broker']:,} unanswered, expiry {r['expiry_s']} s)"
        table.add_row(
            rate,
            counts,
            str(r["duplicates"]),
            f"{r['ok_in_time']:,}{p50}",
            f"{r['ok_late']:,}",
            ", ".join(f"{k} {v}" for k, v in r["codes"].items()) or "-",
            _seconds(r["last_answer_after_load_s"]),
            _seconds(r["fresh_request_ok_after_s"]),
            rss,
        )
    Console(width=200).print(table)
    for name, ok in report["targets"].items():
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")


# --------------------------------------------------------------------------------------------- run


def _rates(text: str) -> list[float]:
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise EdgeinferError(f"--rates: {text!r} is not a comma-separated list of req/s") from None
    if any(not r > 0 for r in rates):
        raise EdgeinferError("--rates: every rate must be a positive number")
    return rates


def load_labels(rates: list[float], flood: float) -> list[tuple[str, float]]:
    """(label, rate) per load; a label prefixes its request ids, so a rate given twice gets `-2`."""
    loads: list[tuple[str, float]] = []
    for name, rate in [(f"r{r:g}", r) for r in rates] + ([("flood", flood)] if flood > 0 else []):
        taken = sum(1 for label, _ in loads if label == name or label.startswith(f"{name}-"))
        loads.append((f"{name}-{taken + 1}" if taken else name, rate))
    return loads


def _config(text: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise EdgeinferError(f"--config: not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise EdgeinferError("--config: a JSON object of runtime recipe keys")
    return {"executionProviders": ["CPUExecutionProvider"], **doc}


def run(args: argparse.Namespace) -> int:
    from edgeinfer.files import write_output
    from edgeinfer.model.manifest import Manifest, ManifestError, default_store_dir

    loads = load_labels(_rates(args.rates), args.flood)
    if not loads:
        raise EdgeinferError("nothing to do: no --rates and no --flood")
    for flag, value in (("--seconds", args.seconds), ("--deadline-ms", args.deadline_ms)):
        if not value > 0:
            raise EdgeinferError(f"{flag} must be a positive number")
    if args.expiry_s is not None and not args.expiry_s > 0:
        raise EdgeinferError("--expiry-s must be a positive whole number of seconds")
    runtime_config = _config(args.config)
    store = Path(args.store) if args.store else default_store_dir()
    try:
        manifest = Manifest.load(store)
    except ManifestError as exc:
        raise EdgeinferError(f"{exc} (build it: edgeinfer model build, or give --store)") from None

    from edgeinfer_bench.runtime import bench_images

    parts = timed_templates(bench_images(), deadline_ms=args.deadline_ms, top_k=1)
    root = Path(tempfile.mkdtemp(prefix="edgeinfer-bench-iot-"))
    previous = (
        signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    )

    def terminate(_sig: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    if previous is not None:
        signal.signal(signal.SIGTERM, terminate)
    core: Core | None = None
    sampler: Sampler | None = None
    client: Any = None
    try:
        loadavg_start = _loadavg()
        _progress(f"starting the simulated core with {manifest.name} {manifest.version} (work folder {root})")
        core = Core(root, store, runtime_config, args.nucleus)
        core.start()
        sampler = Sampler(core.pid, core.broker_pid)
        from edgeinfer.messages import result_topic
        from edgeinfer.transport.mqtt import MqttPubSub

        answers = Answers()
        client = MqttPubSub.connect_tcp(*core.address, client_id=f"bench-iot-receiver-{os.getpid()}")
        client.subscribe(result_topic(THING), answers.handler, qos=1)
        broker_sys = BrokerSys()
        broker_sys.subscribe(client)
        time.sleep(0.5)
        idle_t0 = time.time()
        time.sleep(1.0)
        idle = sampler.between(idle_t0, time.time())
        results = []
        for label, rate in loads:
            results.append(
                run_load(
                    args,
                    core=core,
                    client=client,
                    answers=answers,
                    sampler=sampler,
                    broker_sys=broker_sys,
                    parts=parts,
                    label=label,
                    rate=rate,
                )
            )
            time.sleep(args.gap)
        never = final_accounting(results, answers, args.deadline_ms, args.expiry_s)
        sys_end = broker_sys.snapshot(fresher_than=time.time())
        end = sampler.between(time.time() - 1.0, time.time())
        report: dict[str, Any] = {
            "scenario": "iot",
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": {
                "cpus": os.cpu_count(),
                "platform": platform.platform(),
                "python": platform.python_version(),
                "loadavg_start": loadavg_start,
                "loadavg_end": _loadavg(),
            },
            "model": {"name": manifest.name, "version": manifest.version, "store": str(store)},
            "nucleus": args.nucleus,
            "runtime_config": runtime_config,
            "deadline_ms": args.deadline_ms,
            "qos": 1,
            "seconds": args.seconds,
            "all_requests": args.all_requests,
            "answer_window_s": ANSWER_WINDOW_S,
            "request_bytes": [len(p.body("x", 0.0)) for p in parts],
            "loads": results,
            "processes_idle": idle,
            "processes_end": end,
            "never_answered": never,
            # cumulative since the broker started, each as of its last $SYS report (`as_of`)
            "broker_sys_end": sys_end,
            "runtime_restarts": len(sampler.runtime_pids) - 1,
            "unreadable_answers": answers.unreadable,
            "message_expiry_s": args.expiry_s,
            "target_values": {
                "answer_window_s": ANSWER_WINDOW_S,
                "lost": 0,
                "lost_means": LOST_MEANS if args.expiry_s is None else LOST_MEANS_EXPIRY,
                "duplicates": 0,
                "fresh_request_ok_after_s": RECOVERY_TARGET_S,
                "ok_late_share": OK_LATE_SHARE,
                "rss_peak_mb": args.rss_limit_mb,
            },
            "targets": targets(results, args.rss_limit_mb),
        }
        print_table(report)
        if args.json:
            write_output(args.json, (json.dumps(report, indent=2) + "\n").encode())
        return 0
    finally:
        if client is not None:
            client.close()
        if sampler is not None:
            sampler.close()
        if core is not None:
            core.stop()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if args.keep:
            _progress(f"work folder kept: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
