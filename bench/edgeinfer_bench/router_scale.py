"""Router throughput against its connections: where the per-connection limits bind, where the backend does.

One router process, N paced connections (1, 2, 4, ...) in the shared subscription of a local mosquitto,
and a backend of a fixed capacity (`--batch-ms` + `--item-ms` per image, up to `--max-batch-size` a
call: a stand-in for an engine whose capacity is known, so the knee is where it should be). Each step
sends `--offloads` offloads at once from several devices and times their answers: while the
connections bind, throughput grows with them (each carries its paced share); once the backend binds
it stays flat, and more connections only queue.

The pacing is IoT Core's scaled by `--pacing-scale` and the offload is a JPEG of `--image-kb`, so the
run is short and light; docs/router.md scales the figures back to IoT Core's limits.

    python -m edgeinfer_bench.router_scale --json bench/results/router-scale.json
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["main", "register_bench"]


class FixedCapacityBackend:
    """A backend that takes `batch_ms + item_ms × batch` per call and answers every job."""

    provider = "bench"

    def __init__(self, batch_ms: float, item_ms: float, max_batch_size: int) -> None:
        from edgeinfer.messages import ModelRef

        self.model_ref = ModelRef("bench", "1", "fixed")
        self.batch_ms = batch_ms
        self.item_ms = item_ms
        self.max_batch_size = max_batch_size

    def serves(self, model: str | None) -> bool:
        return True

    def infer(self, jobs: Sequence[Any]) -> list[Any]:
        from edgeinfer.messages import Prediction
        from edgeinfer_cloud.router.backends import Outcome

        ms = self.batch_ms + self.item_ms * len(jobs)
        time.sleep(ms / 1000)
        return [Outcome(predictions=[Prediction(0, "x", 1.0)], inference_ms=ms) for _ in jobs]

    def close(self) -> None:
        pass

    @property
    def capacity_per_s(self) -> float:
        n = self.max_batch_size
        return 1000 * n / (self.batch_ms + self.item_ms * n)


def _image(kb: float) -> bytes:
    import cv2
    import numpy as np

    side = 16
    while True:  # noise compresses badly: grow the picture until its JPEG is big enough
        rng = np.random.default_rng(side)
        ok, buf = cv2.imencode(".jpg", rng.integers(0, 256, (side, side, 3), dtype=np.uint8))
        if not ok:
            raise RuntimeError("cannot encode a JPEG")
        if len(buf) >= kb * 1024 or side > 2048:
            return bytes(buf)
        side += 8


def _step(args: argparse.Namespace, broker: Any, connections: int, image: bytes) -> dict[str, Any]:
    """One router with `connections` connections; `args.offloads` offloads at once; their answers timed."""
    from edgeinfer.messages import OffloadOrigin, OffloadRequest, Request, Result, iso_utc
    from edgeinfer.transport import Message
    from edgeinfer.transport.mqtt import MqttPubSub
    from edgeinfer_cloud.router.pacer import PacingConfig
    from edgeinfer_cloud.router.router import Router, RouterConfig

    pacing = PacingConfig().scaled(args.pacing_scale, args.receive_maximum)
    group = f"bench-{connections}"
    clients = [
        MqttPubSub.connect_tcp(
            broker.host, broker.port, client_id=f"{group}-{i}", receive_maximum=pacing.receive_maximum
        )
        for i in range(connections)
    ]
    backend = FixedCapacityBackend(args.batch_ms, args.item_ms, args.max_batch_size)
    config = RouterConfig(group=group, max_batch_size=args.max_batch_size, pacing=pacing, fleet_view=False)
    router = Router(clients, backend, config).start()
    devices = [MqttPubSub.connect_tcp(broker.host, broker.port) for _ in range(args.devices)]
    done: list[float] = []
    ok = [0]
    lock = threading.Lock()

    def on_answer(message: Message) -> None:
        result = Result.parse(message.payload)
        with lock:
            done.append(time.monotonic())
            ok[0] += result.status == "ok"

    try:
        for k, d in enumerate(devices):
            d.subscribe(f"edgeinfer/bench-dev-{k}/offload/result", on_answer, qos=1)
        t0 = time.monotonic()
        for i in range(args.offloads):
            k = i % len(devices)
            origin = OffloadOrigin(f"bench-dev-{k}", None, iso_utc(time.time()))
            payload = OffloadRequest(Request(id=f"b{i}", image=image, top_k=1), origin).to_json()
            devices[k].publish(f"edgeinfer/bench-dev-{k}/offload", payload, qos=1, wait=False)
        deadline = time.monotonic() + args.timeout_s
        while time.monotonic() < deadline and len(done) < args.offloads:
            time.sleep(0.05)
        load = router.load()
    finally:
        for d in devices:
            d.close()
        router.stop()
        for c in clients:
            c.close()
    with lock:
        stamps = sorted(done)
    # the rate over the answers after the first fifth: the start-up burst (buckets full) left out
    skip = len(stamps) // 5
    steady = (len(stamps) - 1 - skip) / (stamps[-1] - stamps[skip]) if len(stamps) > skip + 1 else 0.0
    return {
        "connections": connections,
        "offloads": args.offloads,
        "answered": len(stamps),
        "ok": ok[0],
        "elapsed_s": round((stamps[-1] if stamps else time.monotonic()) - t0, 3),
        "answers_per_s": round(steady, 2),
        "busy_share": round(load["busy_share"], 3),
        "mean_batch": round(router.stats()["mean_batch"], 2),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    from edgeinfer.sim.broker import MosquittoBroker
    from edgeinfer_cloud.router.pacer import PacingConfig

    image = _image(args.image_kb)
    pacing = PacingConfig().scaled(args.pacing_scale, args.receive_maximum)
    message = len(image) * 4 / 3 + 200  # base64 in JSON, and the request's fields
    inbound = pacing.inbound
    per_connection = min(inbound.publishes_per_s, inbound.bytes_per_s / message)
    capacity = FixedCapacityBackend(args.batch_ms, args.item_ms, args.max_batch_size).capacity_per_s
    rows = []
    with MosquittoBroker() as broker:
        for n in args.connections:
            row = _step(args, broker, n, image)
            row["paced_limit_per_s"] = round(n * per_connection, 2)
            rows.append(row)
            print(
                f"{n:>3} connection(s): {row['answers_per_s']:7.1f} answers/s "
                f"(paced limit {row['paced_limit_per_s']:.1f}/s, backend {capacity:.1f}/s), "
                f"busy {row['busy_share']:.0%}, mean batch {row['mean_batch']}, "
                f"{row['ok']}/{row['offloads']} ok",
                file=sys.stderr,
            )
    return {
        "scenario": "router-scale",
        "pacing_scale": args.pacing_scale,
        "receive_maximum": pacing.receive_maximum,
        "image_bytes": len(image),
        "per_connection_inbound_per_s": round(per_connection, 2),
        "backend_capacity_per_s": round(capacity, 2),
        "backend": {
            "batch_ms": args.batch_ms,
            "item_ms": args.item_ms,
            "max_batch_size": args.max_batch_size,
        },
        "rows": rows,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    p.add_argument(
        "--connections",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 2, 4, 8],
        help="connection counts to step through (default 1,2,4,8)",
    )
    p.add_argument("--offloads", type=int, default=60, help="offloads per step (default 60)")
    p.add_argument("--devices", type=int, default=4, help="devices sending them (default 4)")
    p.add_argument("--image-kb", type=float, default=5.0, help="JPEG size (default 5 KB)")
    p.add_argument("--pacing-scale", type=float, default=0.1, help="IoT Core's limits times this")
    p.add_argument("--receive-maximum", type=int, default=1, help="per connection (default 1)")
    p.add_argument("--batch-ms", type=float, default=10.0, help="backend: per call (default 10)")
    p.add_argument("--item-ms", type=float, default=30.0, help="backend: per image (default 30)")
    p.add_argument("--max-batch-size", type=int, default=4, help="backend: largest batch (default 4)")
    p.add_argument("--timeout-s", type=float, default=60.0, help="longest a step may take")


def register_bench(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "router",
        help="router throughput against its connections, until the backend saturates",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_arguments(p)
    p.set_defaults(func=_main_args)


def _main_args(args: argparse.Namespace) -> int:
    report = run(args)
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {path}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edgeinfer_bench.router_scale", description=__doc__)
    _add_arguments(parser)
    return _main_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
