"""`edgeinfer bench capture`: serving with capture on against capture off, side by side in one run.

Two runtimes on two simulated cores, up at once, measured in alternating rounds by `bench compare`'s
driver (closed-loop p50, saturated throughput): A with capture off, B with capture on as a user
would start it — a random share plus a confidence band — uploading to moto's S3 server (a process
of its own) with the simulated token exchange service's credentials, at the default pacing. What B
pays is the choice on the answering thread, the writer's record and fsync, and the uploads beside
serving; the target is B's saturated throughput at least `TARGET` of A's. The records that reached
the bucket are counted, so a run where capture did nothing does not pass for a cheap one.

    edgeinfer bench capture --rounds 4 --json bench/results/capture.json
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from edgeinfer.errors import EdgeinferError
from edgeinfer.files import write_output

__all__ = ["TARGET", "S3Server", "capture_config", "register_bench"]

TARGET = 0.97  # B's saturated throughput over A's (issue #26)
BUCKET = "edgeinfer-bench-capture"


def capture_config(endpoint: str, share: float, low: float, high: float) -> dict[str, Any]:
    """The runtime configuration of B: capture on, a random share and a confidence band."""
    return {
        "capture": {
            "enabled": True,
            "bucket": BUCKET,
            "endpoint": endpoint,
            "models": {
                "*": {
                    "samplers": [
                        {"kind": "random", "share": share},
                        {"kind": "confidence", "low": low, "high": high},
                    ]
                }
            },
        }
    }


class S3Server:
    """moto's S3 server in a process of its own: its work on each upload must not take the driver's
    interpreter (a real bucket is elsewhere too)."""

    def __init__(self) -> None:
        import importlib.util

        if importlib.util.find_spec("moto") is None:
            raise EdgeinferError("bench capture needs moto's S3 server: pip install 'moto[server]'")
        with socket.socket() as probe:  # a free port for it
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            self._create_bucket()
        except BaseException:
            self.stop()
            raise

    def _create_bucket(self) -> None:
        # moto takes an unsigned request: the bucket is the bench's own
        put = urllib.request.Request(f"{self.endpoint}/{BUCKET}", method="PUT")
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(put, timeout=30).close()
                return
            except OSError as exc:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise EdgeinferError(f"moto's S3 server did not start: {exc}") from None
                time.sleep(0.2)  # polling for the server's port, not pacing a measurement

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _records(endpoint: str) -> int:
    """The whole records in the bucket (their `.json` documents; `.jpg` images go first)."""
    count, token = 0, ""
    while True:
        query = "list-type=2" + (f"&continuation-token={urllib.parse.quote(token)}" if token else "")
        with urllib.request.urlopen(f"{endpoint}/{BUCKET}?{query}", timeout=30) as response:
            body = response.read().decode()
        count += len(re.findall(r"<Key>[^<]*\.json</Key>", body))
        found = re.search(r"<NextContinuationToken>([^<]+)</NextContinuationToken>", body)
        if found is None:
            return count
        token = found.group(1)


def run_capture(args: argparse.Namespace) -> dict[str, Any]:
    from edgeinfer_bench.compare import run_compare

    server = S3Server()
    endpoint = server.endpoint
    try:
        b = capture_config(endpoint, args.share, args.low, args.high)
        compare = argparse.Namespace(
            a="{}",
            b=json.dumps(b),
            rounds=args.rounds,
            requests=args.requests,
            saturate=args.saturate,
            rate=0.0,
            duration=6.0,
            max_batch_size=args.max_batch_size,
            model_dir=args.model_dir,
        )
        out = run_compare(compare)
        out["records_uploaded"] = _records(endpoint)
    finally:
        server.stop()
    saturated = out["figures"]["saturated_rps"]
    out["capture_over_off"] = saturated["b_over_a"]
    out["target"] = TARGET
    out["meets_target"] = saturated["b_over_a"] >= TARGET
    return out


def table_lines(out: dict[str, Any]) -> list[str]:
    from edgeinfer_bench.compare import table_lines as compare_lines

    lines = compare_lines(out)
    lines[0] = "bench capture — A capture off, B capture on " + json.dumps(
        out["b"]["capture"]["models"]["*"]["samplers"]
    )
    verdict = "meets" if out["meets_target"] else "misses"
    lines.append(
        f"  capture on / off: {out['capture_over_off']:.3f}× saturated throughput ({verdict} the "
        f"{out['target']:.2f}× target); {out['records_uploaded']} records uploaded"
    )
    return lines


def _run(args: argparse.Namespace) -> int:
    if args.rounds < 1:
        raise EdgeinferError("--rounds must be at least 1")
    if not 0 <= args.share <= 1 or not 0 <= args.low <= args.high <= 1:
        raise EdgeinferError("--share must be within [0, 1], and 0 ≤ --low ≤ --high ≤ 1")
    out = run_capture(args)
    print("\n".join(table_lines(out)))
    if args.json:
        write_output(Path(args.json), (json.dumps(out, indent=2) + "\n").encode())
    return 0


def register_bench(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "capture",
        help="serving throughput with capture on against capture off, side by side",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--share", type=float, default=0.1, help="the random sampler's share (default 0.1)")
    p.add_argument("--low", type=float, default=0.3, help="the confidence band's low end (default 0.3)")
    p.add_argument("--high", type=float, default=0.6, help="the confidence band's high end (default 0.6)")
    p.add_argument("--rounds", type=int, default=4, help="alternating rounds (default 4)")
    p.add_argument("--requests", type=int, default=60, help="closed-loop requests per round (default 60)")
    p.add_argument("--saturate", type=int, default=400, help="requests per saturation run (default 400)")
    p.add_argument("--max-batch-size", type=int, default=8, help="the runtime's maxBatchSize")
    p.add_argument("--model-dir", default="", help="model store folder (default: the built one)")
    p.add_argument("--json", metavar="FILE", help="write the pairs, medians and ratio as JSON")
    p.set_defaults(func=_run)
