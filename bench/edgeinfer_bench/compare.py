"""`edgeinfer bench compare A B`: two runtime configurations side by side on the simulated core.

The vCPUs of a shared machine drift by up to 1.5× within minutes, so two runs made one after the
other compare the machine's moods as much as the configurations. Here both runtimes are up at once,
each as the component process of its own simulated core, and each round measures both, A then B in
odd rounds and B then A in even ones (in an A/A run the runtime measured second was ahead in 5 of
6 pairs): a closed-loop p50, a saturated throughput, and with `--rate` the p50, p99 and p99/p50 of
constant-rate arrivals (the other runtime waits). What is reported is every pair and the medians — a
change is real when B is ahead in (nearly) every pair of an even number of rounds, not when one
median is. Run an A/A (`'{}' '{}'`) first to see how far apart the same configuration lands.

    edgeinfer bench compare '{"cpu": {"lanes": 1}}' '{}' --rounds 6
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from edgeinfer.errors import EdgeinferError
from edgeinfer.files import write_output
from edgeinfer.stats import percentile
from edgeinfer_bench.requests import request_templates

__all__ = ["Pair", "register_bench", "summarize"]

Pair = tuple[float, float]


FIGURES = (  # key, label, unit, higher is better
    ("saturated_rps", "saturated throughput", "req/s", True),
    ("p50_ms", "closed-loop p50", "ms", False),
    ("open_p50_ms", "p50 at --rate", "ms", False),
    ("open_p99_ms", "p99 at --rate", "ms", False),
    ("open_p99_over_p50", "p99/p50 at --rate", "×", False),
)


def summarize(rounds: list[dict[str, Pair]]) -> dict[str, Any]:
    """Per figure: the pairs (A, B), both medians, B's ratio to A, and in how many pairs B is ahead
    (higher throughput, lower latency)."""
    out: dict[str, Any] = {}
    for key, _label, _unit, higher_is_better in FIGURES:
        if not rounds or key not in rounds[0]:
            continue
        pairs = [r[key] for r in rounds]
        a = statistics.median(p[0] for p in pairs)
        b = statistics.median(p[1] for p in pairs)
        ahead = sum(1 for x, y in pairs if (y > x if higher_is_better else y < x))
        out[key] = {
            "pairs": [list(p) for p in pairs],
            "median_a": a,
            "median_b": b,
            "b_over_a": b / a if a else float("nan"),
            "b_ahead": ahead,
            "rounds": len(pairs),
        }
    return out


def _config(text: str, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(text or "{}")
    except ValueError as exc:
        raise EdgeinferError(f"{what} is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise EdgeinferError(f"{what} must be a JSON object of the runtime's recipe keys")
    return doc


def run_compare(args: argparse.Namespace) -> dict[str, Any]:
    from edgeinfer.model.manifest import Manifest, ManifestError, default_store_dir
    from edgeinfer.sim import Simulator
    from edgeinfer.sim.testing import wait_ready
    from edgeinfer_bench.runtime import (
        COMPONENT,
        THING,
        bench_images,
        connect_client,
        prepare_device,
        runtime_config,
    )

    configs = {"a": _config(args.a, "A"), "b": _config(args.b, "B")}
    store_dir = Path(args.model_dir) if args.model_dir else default_store_dir()
    try:
        Manifest.load(store_dir)
    except ManifestError as exc:
        raise EdgeinferError(str(exc)) from None
    payloads = request_templates(bench_images())
    root = Path(tempfile.mkdtemp(prefix="edgeinfer-compare-"))
    started: list[tuple[Any, Any, Any]] = []  # (simulator, bus, driver), as far as each got
    rounds: list[dict[str, Pair]] = []
    try:
        for name, extra in configs.items():
            recipes, artifacts = prepare_device(root / name / "device", store_dir)
            sim = Simulator(
                recipes,
                artifacts,
                thing=THING,
                work_dir=root / name / "core",
                config_merge={COMPONENT: runtime_config(args.max_batch_size, extra)},
            )
            sim.start()
            started.append((sim, None, None))  # stopped even if what follows fails
            wait_ready(sim)
            bus, driver = connect_client(sim, payloads)
            started[-1] = (sim, bus, driver)
            driver.closed_loop(30)  # warm
        for i in range(args.rounds):
            figures: dict[str, list[float]] = {"p50_ms": [], "saturated_rps": []}
            if args.rate > 0:
                figures.update(open_p50_ms=[], open_p99_ms=[], open_p99_over_p50=[])
            for k in figures:
                figures[k] = [0.0, 0.0]
            # A then B, then B then A: in an A/A run whichever ran second in a round was mostly
            # ahead (a lower closed-loop p50), so the order alternates.
            for j in (0, 1) if i % 2 == 0 else (1, 0):
                driver = started[j][2]
                figures["p50_ms"][j] = statistics.median(driver.closed_loop(args.requests))
                rps, _sizes = driver.saturate(args.saturate, window=6 * args.max_batch_size)
                figures["saturated_rps"][j] = rps
                if args.rate > 0:
                    lat, _errors = driver.open_loop(args.rate, args.duration)
                    figures["open_p50_ms"][j] = statistics.median(lat)
                    figures["open_p99_ms"][j] = percentile(lat, 99)
                    figures["open_p99_over_p50"][j] = percentile(lat, 99) / statistics.median(lat)
            rounds.append({k: (v[0], v[1]) for k, v in figures.items()})
            print(
                f"round {i + 1}/{args.rounds}: "
                + ", ".join(f"{k} {v[0]:.2f} vs {v[1]:.2f}" for k, v in figures.items()),
                file=sys.stderr,
            )
    finally:
        for sim, bus, driver in started:
            if driver is not None:
                driver.close()
            if bus is not None:
                bus.close()
            sim.stop()
    return {"a": configs["a"], "b": configs["b"], "figures": summarize(rounds)}


def table_lines(out: dict[str, Any]) -> list[str]:
    lines = [f"bench compare — A {json.dumps(out['a'])} vs B {json.dumps(out['b'])}"]
    for key, label, unit, _higher in FIGURES:
        if key not in out["figures"]:
            continue
        f = out["figures"][key]
        pairs = ", ".join(f"{a:.1f}/{b:.1f}" for a, b in f["pairs"])
        lines.append(
            f"  {label:<22} A {f['median_a']:.1f} {unit}, B {f['median_b']:.1f} {unit} "
            f"(B/A {f['b_over_a']:.2f}); B ahead in {f['b_ahead']} of {f['rounds']} rounds [{pairs}]"
        )
    return lines


def _run(args: argparse.Namespace) -> int:
    if args.rounds < 1:
        raise EdgeinferError("--rounds must be at least 1")
    if args.rate < 0 or args.duration <= 0:
        raise EdgeinferError("--rate must be 0 (off) or positive, --duration positive")
    out = run_compare(args)
    print("\n".join(table_lines(out)))
    if args.json:
        write_output(Path(args.json), (json.dumps(out, indent=2) + "\n").encode())
    return 0


def register_bench(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "compare",
        help="two runtime configurations side by side, in alternating rounds",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("a", metavar="A", help="runtime recipe configuration (JSON) merged over the defaults")
    p.add_argument("b", metavar="B", help="the other configuration, e.g. '{}' for the defaults")
    p.add_argument("--rounds", type=int, default=4, help="alternating rounds (default 4)")
    p.add_argument("--requests", type=int, default=60, help="closed-loop requests per round (default 60)")
    p.add_argument("--saturate", type=int, default=400, help="requests per saturation run (default 400)")
    p.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="also send --duration s of constant-rate arrivals per round at this many req/s and "
        "compare p99/p50 (e.g. 70 %% of saturation; default: off)",
    )
    p.add_argument("--duration", type=float, default=6.0, help="seconds at --rate per round (default 6)")
    p.add_argument("--max-batch-size", type=int, default=8, help="the runtime's maxBatchSize")
    p.add_argument("--model-dir", default="", help="model store folder (default: the built one)")
    p.add_argument("--json", metavar="FILE", help="write the pairs and medians as JSON")
    p.set_defaults(func=_run)
