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
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from edgeinfer.errors import EdgeinferError
from edgeinfer_bench.iot.accounting import (
    ANSWER_WINDOW_S,
    LOST_MEANS,
    LOST_MEANS_EXPIRY,
    OK_LATE_SHARE,
    RECOVERY_TARGET_S,
    Answers,
    final_accounting,
    targets,
)
from edgeinfer_bench.iot.broker_sys import BrokerSys
from edgeinfer_bench.iot.load import load_labels, loadavg, progress, run_load
from edgeinfer_bench.iot.processes import THING, Core, Sampler
from edgeinfer_bench.iot.report import print_table
from edgeinfer_bench.requests import timed_templates

__all__ = ["register_bench", "run"]

DEFAULT_RATES = "100,200,400"
FLOOD_RPS = 2000.0
DEADLINE_MS = 100.0
RSS_LIMIT_MB = 1024.0


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


def _rates(text: str) -> list[float]:
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise EdgeinferError(f"--rates: {text!r} is not a comma-separated list of req/s") from None
    if any(not r > 0 for r in rates):
        raise EdgeinferError("--rates: every rate must be a positive number")
    return rates


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
        loadavg_start = loadavg()
        progress(f"starting the simulated core with {manifest.name} {manifest.version} (work folder {root})")
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
                "loadavg_end": loadavg(),
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
            progress(f"work folder kept: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
