#!/usr/bin/env python3
"""Where the runtime's time goes on a GPU: run by bench/gpu/device.sh (GPU_DIAG=1) after gpu_check.

1. The cost of a CUDA session's first run on a thread that has not run it before (ORT's CUDA
   provider makes its cuBLAS/cuDNN handles per thread), against a warm run on the warm-up's thread.
2. Engine.run under the runtime's patterns: batch sizes changing from run to run (with and without
   `cudaFixedBatch`), idle gaps, two threads (this found the ~200 ms a new input shape costs).
3. Unless --no-bench: `edgeinfer bench runtime` on the CUDA provider (short), and while it saturates
   the runtime, the runtime process's CPU per thread (from /proc) and a py-spy profile of it (when
   py-spy is there).

    python bench/gpu/diag.py --model-dir DIR --out DIR [--config JSON] [--no-bench]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from edgeinfer import procfs

CUDA = "CUDAExecutionProvider"


def first_run_per_thread(model_dir: str) -> dict[str, Any]:
    import numpy as np

    from edgeinfer.model.manifest import Manifest
    from edgeinfer.runtime.config import RuntimeConfig
    from edgeinfer.runtime.engine import Engine

    cfg = RuntimeConfig(execution_providers=[CUDA], max_batch_size=8)
    engine = Engine.create(Manifest.load(model_dir), cfg, "/tmp/edgeinfer-diag")
    engine.warm_up()
    x = np.zeros((1, engine.input_size, engine.input_size, 3), dtype=np.uint8)

    def timed() -> float:
        t = time.perf_counter()
        engine.run(x)
        return (time.perf_counter() - t) * 1000

    warm = statistics.median(timed() for _ in range(20))
    firsts: list[float] = []
    seconds: list[float] = []

    def on_new_thread() -> None:
        firsts.append(timed())
        seconds.append(timed())

    for _ in range(3):
        t = threading.Thread(target=on_new_thread)
        t.start()
        t.join()
    return {
        "provider": engine.provider,
        "warm_ms": warm,
        "new_thread_first_ms": firsts,
        "new_thread_second_ms": seconds,
    }


def patterns(model_dir: str, runs: int = 40) -> dict[str, Any]:
    """Engine.run under the patterns the runtime makes and a benchmark loop does not: batch sizes
    that change from run to run, idle gaps between runs, runs from two threads; wall and the calling
    thread's CPU (a CUDA sync that spins shows as CPU), medians in ms."""
    import numpy as np

    from edgeinfer.model.manifest import Manifest
    from edgeinfer.runtime.config import RuntimeConfig
    from edgeinfer.runtime.engine import Engine

    manifest = Manifest.load(model_dir)
    engines = {}
    for fixed in (True, False):
        cfg = RuntimeConfig(execution_providers=[CUDA], max_batch_size=8)
        cfg.cuda_fixed_batch = fixed
        engines[fixed] = Engine.create(manifest, cfg, "/tmp/edgeinfer-diag")
        engines[fixed].warm_up()
    size = engines[True].input_size
    rng = np.random.default_rng(0)
    batches = {n: rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8) for n in range(1, 9)}

    def measure(engine: Any, sizes: list[int], gap_s: float = 0.0) -> dict[str, float]:
        wall, cpu = [], []
        for n in sizes:
            if gap_s:
                time.sleep(gap_s)
            t, c = time.perf_counter(), time.thread_time()
            engine.run(batches[n])
            wall.append((time.perf_counter() - t) * 1000)
            cpu.append((time.thread_time() - c) * 1000)
        return {
            "wall_ms": round(statistics.median(wall), 3),
            "cpu_ms": round(statistics.median(cpu), 3),
            "wall_max_ms": round(max(wall), 3),
        }

    cycling = [1 + (i * 5) % 8 for i in range(runs)]
    out: dict[str, Any] = {
        "b8 back to back": measure(engines[False], [8] * runs),
        "b1 back to back": measure(engines[False], [1] * runs),
        "sizes changing, shapes as they come": measure(engines[False], cycling[: runs // 2]),
        "sizes changing, fixed batch (padded to 8)": measure(engines[True], cycling),
        "b1 after 50 ms idle, fixed batch": measure(engines[True], [1] * (runs // 2), 0.05),
        "b1 after 500 ms idle, fixed batch": measure(engines[True], [1] * 5, 0.5),
    }
    results: list[dict[str, float]] = []

    def other_thread() -> None:
        results.append(measure(engines[True], [8] * 5))

    for _ in range(3):
        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
        results.append(measure(engines[True], [8] * 5))
    out["b8 alternating threads"] = {
        k: round(statistics.median(r[k] for r in results), 3) for k in results[0]
    }
    return out


def runtime_pid() -> int | None:
    return next(
        iter(procfs.find_pids(lambda argv: b"edgeinfer.runtime" in argv and b"bench" not in argv)), None
    )


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread, as `name tid` (py-spy's profile names the Python threads by tid)."""
    out: dict[str, float] = {}
    for tid in procfs.pids(procfs.PROC / str(pid) / "task"):
        name = procfs.read(procfs.PROC / str(pid) / "task" / str(tid) / "comm")
        if name is not None:
            out[f"{name.strip()} {tid}"] = procfs.process_cpu_s(f"{pid}/task/{tid}")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--config", default='{"executionProviders": ["CUDAExecutionProvider"]}')
    p.add_argument("--no-bench", action="store_true", help="only the in-process measurements")
    args = p.parse_args()
    out = Path(args.out)
    report: dict[str, Any] = {"first_run": first_run_per_thread(args.model_dir)}
    print(json.dumps(report["first_run"]), flush=True)
    report["patterns"] = patterns(args.model_dir)
    for name, row in report["patterns"].items():
        print(f"{name:<40} {row}", flush=True)
    if args.no_bench:
        (out / "diag.json").write_text(json.dumps(report, indent=2) + "\n")
        return 0

    cmd = [sys.executable, "-m", "edgeinfer", "bench", "runtime", "--model-dir", args.model_dir]
    cmd += ["--config", args.config, "--requests", "100", "--duration", "6", "--starts", "0"]
    cmd += ["--json", str(out / "runtime-diag.json")]
    bench = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert bench.stderr is not None
    pyspy = shutil.which("py-spy")
    for line in bench.stderr:
        print(line, end="", flush=True)
        if line.startswith("saturation"):
            break
    time.sleep(1.0)
    pid = runtime_pid()
    if pid is not None:
        before, t0 = thread_cpu(pid), time.monotonic()
        if pyspy:
            subprocess.run(
                [
                    pyspy,
                    "record",
                    "--pid",
                    str(pid),
                    "--duration",
                    "4",
                    "--rate",
                    "200",
                    "--nonblocking",
                    "--threads",
                    "--format",
                    "raw",
                    "--output",
                    str(out / "runtime-profile.txt"),
                ],
                capture_output=True,
                timeout=30,
                check=False,
            )
            dump = subprocess.run(
                [pyspy, "dump", "--pid", str(pid), "--nonblocking"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            (out / "runtime-dump.txt").write_text(dump.stdout + dump.stderr)
        else:
            time.sleep(4)
        after, t1 = thread_cpu(pid), time.monotonic()
        span = t1 - t0
        report["thread_cpu_share"] = {
            k: round((after.get(k, 0.0) - before.get(k, 0.0)) / span, 3)
            for k in sorted(after)
            if after.get(k, 0.0) - before.get(k, 0.0) > 0.005 * span
        }
        print(json.dumps(report["thread_cpu_share"]), flush=True)
    rest, _ = bench.communicate(timeout=600)
    print(rest[-3000:] if rest else "", flush=True)
    (out / "diag.json").write_text(json.dumps(report, indent=2) + "\n")
    return bench.returncode or 0


if __name__ == "__main__":
    sys.exit(main())
