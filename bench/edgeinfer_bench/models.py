"""`edgeinfer bench models`: the pinned model's latency while another model loads, against its own
steady latency, measured side by side in one run (issue #25: p99 while loading ≤ 1.5× steady).

One runtime (`InferenceServer` with its `ModelRepository`, in this process, on an in-memory bus so
that only the runtime shares the CPU with the loads) serves three models with room for two: the
classifier, pinned and the default, and two others (the detector and a copy of the classifier under
another name). A sender asks the pinned classifier at `--rate` req/s (640×480 JPEGs, open loop) the
whole time. Each round has a load segment: one request for the model that is not loaded makes the
repository evict the other and load it (build and warm-up, on its load thread), and the segment
lasts until that model answered; then, after a second, a steady segment as long (at least
`--steady-s`), nothing loading, so that both sides see as much of a shared machine's moods. The two
others take turns, so every round loads one.

Reported: the pinned model's p50/p99 over all steady segments and over all load segments (a request
counts for the segment it was sent in), their ratio, each segment's figures and each load's time.
`--background` names how a load spends the CPU (see `edgeinfer.runtime.engine.BackgroundLoad`):
`default` (what the runtime does), `plain` (a load as the first model's at start), or a JSON object
of BackgroundLoad's fields. The machine is shared: compare ratios from one run, never milliseconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeinfer.errors import EdgeinferError
from edgeinfer.stats import percentile
from edgeinfer_bench.requests import request_templates, with_id

__all__ = ["register_bench", "run"]

THING = "bench-models"
TARGET_RATIO = 1.5


def register_bench(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "models",
        help="the pinned model's p99 while another model loads, against its steady p99",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", type=Path, metavar="FILE", help="write the figures as JSON")
    p.add_argument("--store", type=Path, metavar="DIR", help="the classifier (default: the built one)")
    p.add_argument("--detector", type=Path, metavar="DIR", help="the detector (default: the built one)")
    p.add_argument("--rounds", type=int, default=6, help="steady + load segments (default 6)")
    p.add_argument("--rate", type=float, default=20.0, help="the pinned model's req/s (default 20)")
    p.add_argument(
        "--steady-s", type=float, default=4.0, help="seconds of a steady segment at least (default 4)"
    )
    p.add_argument("--max-batch-size", type=int, default=8, help="every model's (default 8)")
    p.add_argument(
        "--background",
        default="default",
        help="how a load spends the CPU: default, plain, or BackgroundLoad's fields as JSON",
    )
    p.add_argument(
        "--against",
        metavar="BACKGROUND",
        help="a second --background measured in the same run: the two take turns, two rounds each "
        "(one load of each other model), and --rounds counts each one's",
    )
    p.set_defaults(func=run)


def background_settings(text: str) -> Any:
    from edgeinfer.runtime.engine import BackgroundLoad

    if text == "default":
        return BackgroundLoad()
    if text == "plain":
        return None
    try:
        fields = json.loads(text)
        return BackgroundLoad(**fields)
    except (ValueError, TypeError) as exc:
        raise EdgeinferError(
            f"--background: default, plain or BackgroundLoad's fields as JSON ({exc})"
        ) from None


class Pinned:
    """The sender of the pinned model's requests and what each took to its answer."""

    def __init__(self, bus: Any, templates: list[bytes], rate: float) -> None:
        from edgeinfer.messages import infer_topic

        self.bus, self.templates, self.rate = bus, templates, rate
        self.topic = infer_topic(THING)
        self.sent: dict[str, float] = {}
        self.took: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-models-sender", daemon=True)

    def on_result(self, rid: str | None, status: str, at: float) -> None:
        with self._lock:
            if rid in self.sent and status == "ok":
                self.took[rid] = at - self.sent[rid]

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        t0 = time.monotonic()
        i = 0
        while not self._stop.is_set():
            due = t0 + i / self.rate
            now = time.monotonic()
            if due > now:
                self._stop.wait(due - now)
            rid = f"a-{i}"
            with self._lock:
                self.sent[rid] = time.monotonic()
            self.bus.publish(self.topic, with_id(self.templates[i % len(self.templates)], rid))
            i += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def between(self, t0: float, t1: float) -> list[float]:
        """Latencies (ms) of the requests sent in [t0, t1) and answered ok."""
        with self._lock:
            return [1000 * self.took[r] for r, t in self.sent.items() if t0 <= t < t1 and r in self.took]


@dataclass(frozen=True)
class Round:
    """One load segment and the steady segment after it, under `--background` (0) or `--against`."""

    mode: int
    loading: tuple[float, float]
    steady: tuple[float, float]
    load_s: float


def _summary(pinned: Pinned, rounds: list[Round], setting: Any) -> dict[str, Any]:
    """One background setting's figures over its rounds."""
    steady_ms = [x for r in rounds for x in pinned.between(*r.steady)]
    loading_ms = [x for r in rounds for x in pinned.between(*r.loading)]
    return {
        "background": dataclasses.asdict(setting) if setting is not None else "plain",
        "load_s": [r.load_s for r in rounds],
        "segments": {
            "steady": [_figures(pinned.between(*r.steady)) for r in rounds],
            "loading": [_figures(pinned.between(*r.loading)) for r in rounds],
        },
        "result": {
            "steady": _figures(steady_ms),
            "loading": _figures(loading_ms),
            "p99_ratio": round(percentile(loading_ms, 99) / percentile(steady_ms, 99), 2),
            "p50_ratio": round(percentile(loading_ms, 50) / percentile(steady_ms, 50), 2),
        },
    }


def _figures(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50_ms": round(percentile(values, 50), 2),
        "p99_ms": round(percentile(values, 99), 2),
    }


def _renamed_copy(store: Path, folder: Path, name: str) -> Path:
    """`store` under another manifest name (its files linked)."""
    folder.mkdir(parents=True)
    for path in store.iterdir():
        if path.name != "manifest.json":
            (folder / path.name).symlink_to(path.resolve())
    manifest = json.loads((store / "manifest.json").read_text())
    manifest["name"] = name
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def _load_segment(
    bus: Any, other: Any, rid: str, image: bytes, *, answered: dict[str, float], lock: threading.Lock
) -> tuple[float, float]:
    """Ask `other` (not loaded) once; from then until its answer came, its load is under way."""
    from edgeinfer.messages import Request, infer_topic

    ask = Request(rid, image=image, model=other.name, deadline_ms=300_000)
    t0 = time.monotonic()
    bus.publish(infer_topic(THING), ask.to_json())
    while True:
        with lock:
            if rid in answered:
                return t0, answered[rid]
        if time.monotonic() - t0 > 300:
            raise EdgeinferError(f"model {other.name} did not load in 300 s")
        time.sleep(0.01)


def run(args: argparse.Namespace) -> int:
    from edgeinfer.files import write_output

    out = measure(args)
    for name, mode in (out["modes"] or {args.background: out}).items():
        r = mode["result"]
        print(
            f"pinned {out['pinned']}, background {name}: steady p50 {r['steady']['p50_ms']} ms "
            f"p99 {r['steady']['p99_ms']} ms; while loading p50 {r['loading']['p50_ms']} ms "
            f"p99 {r['loading']['p99_ms']} ms: p99 ratio {r['p99_ratio']} (target ≤ {TARGET_RATIO}); "
            f"loads {mode['load_s']} s"
        )
    if args.json:
        write_output(args.json, (json.dumps(out, indent=2) + "\n").encode())
    return 0


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from edgeinfer.model.build import BuildOptions
    from edgeinfer.model.manifest import Manifest, ManifestError, default_store_dir
    from edgeinfer.runtime.config import RuntimeConfig
    from edgeinfer.runtime.engine import Engine
    from edgeinfer.runtime.models import ModelRepository, ModelSlot, ModelSource
    from edgeinfer.runtime.server import InferenceServer
    from edgeinfer.transport.memory import MemoryBus
    from edgeinfer_bench.runtime import bench_images

    if args.rounds < 2 or not args.rate > 0 or not args.steady_s > 0:
        raise EdgeinferError("--rounds at least 2, --rate and --steady-s positive")
    modes = [args.background, *([args.against] if args.against else [])]
    settings = [background_settings(mode) for mode in modes]
    store = Path(args.store) if args.store else default_store_dir()
    detector = Path(args.detector) if args.detector else BuildOptions(task="detection").output_dir()
    try:
        manifests = [Manifest.load(store), Manifest.load(detector)]
    except ManifestError as exc:
        raise EdgeinferError(f"{exc} (build it: edgeinfer model build [--task detection])") from None
    root = Path(tempfile.mkdtemp(prefix="edgeinfer-bench-models-"))
    server: Any = None
    pinned: Pinned | None = None
    try:
        copy = _renamed_copy(store, root / "copy", f"{manifests[0].name}-copy")
        cfg = RuntimeConfig(
            execution_providers=["CPUExecutionProvider"],
            max_batch_size=args.max_batch_size,
            max_queue_size=max(64, 8 * args.max_batch_size),
            subscribe_iot=False,
        )
        work = str(root / "work")

        def build(slot: ModelSlot) -> Engine:  # as the runtime's component builds a model's engine
            engine = Engine.create(Manifest.load(slot.source.folder), cfg, work)
            engine.warm_up()
            return engine

        first = Engine.create(manifests[0], cfg, work)
        first.warm_up()
        slots = [
            ModelSlot(ModelSource(manifests[0].name, str(store), pinned=True), first),
            ModelSlot(ModelSource(manifests[1].name, str(detector))),
            ModelSlot(ModelSource(f"{manifests[0].name}-copy", str(copy))),
        ]
        repo = ModelRepository(
            slots, build=build, max_loaded=2, max_waiting=cfg.max_queue_size, background=settings[0]
        )
        bus = MemoryBus()
        server = InferenceServer(bus, first, cfg, THING, models=repo)
        images = bench_images()
        templates = request_templates(images, top_k=1, deadline_ms=60_000)
        pinned = Pinned(bus, templates, args.rate)
        answered: dict[str, float] = {}
        lock = threading.Lock()

        def on_result(msg: Any) -> None:
            from edgeinfer.messages import Result

            now = time.monotonic()
            result = Result.parse(msg.payload)
            assert pinned is not None
            pinned.on_result(result.id, result.status, now)
            with lock:
                answered[result.id or ""] = now

        from edgeinfer.messages import result_topic

        bus.subscribe(result_topic(THING), on_result)
        server.start()
        print(
            f"bench models: {manifests[0].name} pinned at {args.rate:g} req/s; loads of "
            f"{manifests[1].name} and a copy of {manifests[0].name} take turns; "
            f"background {' against '.join(modes)}",
            file=sys.stderr,
        )
        pinned.start()
        time.sleep(2.0)  # the sender's and the server's first requests are nobody's figures
        rounds: list[Round] = []
        for r in range(args.rounds * len(modes)):
            mode = (r // 2) % len(modes)
            repo.background = settings[mode]
            loaded = _load_segment(
                bus, slots[1 + r % 2], f"load-{r}", images[0], answered=answered, lock=lock
            )
            load_s = round(slots[1 + r % 2].load_s or 0.0, 2)
            time.sleep(1.0)  # the evicted model's engine threads end
            # As long as the load took (at least --steady-s): both sides see as much of the machine.
            t0 = time.monotonic()
            time.sleep(max(args.steady_s, loaded[1] - loaded[0]))
            rounds.append(Round(mode, loaded, (t0, time.monotonic()), load_s))
        pinned.stop()
        time.sleep(1.0)
        per_mode = {
            name: _summary(pinned, [r for r in rounds if r.mode == i], settings[i])
            for i, name in enumerate(modes)
        }
        measured = per_mode[modes[0]]
        return {
            "scenario": "models",
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": {"cpus": os.cpu_count(), "loadavg_end": os.getloadavg()},
            "pinned": manifests[0].name,
            "others": [manifests[1].name, f"{manifests[0].name}-copy"],
            "rate": args.rate,
            "max_batch_size": args.max_batch_size,
            **measured,
            "modes": per_mode if len(modes) > 1 else None,
            "target": {"p99_ratio": TARGET_RATIO, "met": measured["result"]["p99_ratio"] <= TARGET_RATIO},
        }
    finally:
        if pinned is not None:
            pinned.stop()
        if server is not None:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
