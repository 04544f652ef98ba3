#!/usr/bin/env python3
"""GPU path check for the inference runtime — run on a machine with an NVIDIA GPU and onnxruntime-gpu.

    python bench/gpu_check.py [--model-dir DIR] [--json FILE] [--expect tensorrt|cuda]

Checks, in a couple of minutes at most:
1. which execution providers this ONNX Runtime build has, and which one *really* loads for the
   configured order TensorRT → CUDA → CPU (the runtime's own `Engine.create`, fallback detection
   included), with the manifest variant chosen for it;
2. the TensorRT engine + timing cache: a first session builds the engine into the work folder keyed
   by model hash / ORT / TRT / GPU / profile shapes; a second session creation with the same
   configuration must reuse it (no new engine file, much faster creation);
3. warm latency at batch 1 and at the maximum batch for every provider that loads (TRT, CUDA, CPU),
   medians over repeated runs — ratios only, never judged against absolute times.
Exit status: 0 when the expected provider loaded and the cache was reused, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def engine_for(manifest: Any, providers: list[str], work: str, max_batch: int) -> tuple[Any, float]:
    from edgeinfer.runtime.config import RuntimeConfig
    from edgeinfer.runtime.engine import Engine

    cfg = RuntimeConfig(execution_providers=providers, max_batch_size=max_batch)
    t = time.perf_counter()
    engine = Engine.create(manifest, cfg, work)
    return engine, time.perf_counter() - t


def latency(engine: Any, batch: int, runs: int) -> float:
    import numpy as np

    x = np.random.default_rng(0).integers(
        0, 256, (batch, engine.input_size, engine.input_size, 3), dtype=np.uint8
    )
    for _ in range(3):
        engine.run(x)
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        engine.run(x)
        samples.append((time.perf_counter() - t) * 1000)
    return statistics.median(samples)


def cache_files(path: str | None) -> dict[str, float]:
    if not path or not os.path.isdir(path):
        return {}
    return {f.name: f.stat().st_mtime for f in Path(path).iterdir() if f.is_file()}


def main() -> int:
    import onnxruntime as ort

    from edgeinfer.model.manifest import Manifest, default_store_dir

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", default="")
    p.add_argument("--work-dir", default="", help="where the TensorRT caches go (default: a temp folder)")
    p.add_argument("--json", default="")
    p.add_argument("--expect", choices=["tensorrt", "cuda", "cpu"], default="tensorrt")
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--runs", type=int, default=50)
    args = p.parse_args()

    manifest = Manifest.load(args.model_dir or default_store_dir())
    work = args.work_dir or tempfile.mkdtemp(prefix="edgeinfer-gpu-check-")
    out: dict[str, Any] = {
        "onnxruntime": ort.__version__,
        "device": ort.get_device(),
        "available": ort.get_available_providers(),
        "model": f"{manifest.name} {manifest.version}",
    }
    order = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]

    # 1 + 2: default order, twice with the same work folder (engine cache reuse).
    first, t_first = engine_for(manifest, order, work, args.max_batch)
    first.warm_up(runs=1)
    files_after_first = cache_files(first.plan.cache_dir)
    del first
    second, t_second = engine_for(manifest, order, work, args.max_batch)
    second.warm_up(runs=1)
    files_after_second = cache_files(second.plan.cache_dir)
    engines = [n for n in files_after_first if n.endswith(".engine")]
    rebuilt = [n for n in engines if files_after_second.get(n) != files_after_first[n]]
    new_files = sorted(set(files_after_second) - set(files_after_first))
    out["default_order"] = {
        "provider": second.provider,
        "variant": second.model_ref.variant,
        "attempts": second.describe()["attempts"],
        "cache_dir": second.plan.cache_dir,
        "first_create_s": round(t_first, 3),
        "second_create_s": round(t_second, 3),
        "engine_files": engines,
        "engine_rebuilt": rebuilt,
        "new_files_on_second_start": new_files,
    }
    del second

    # 3: latency per provider that loads.
    out["latency_ms"] = {}
    for provider in order:
        if provider not in ort.get_available_providers():
            continue
        try:
            engine, _ = engine_for(manifest, [provider], work, args.max_batch)
        except Exception as exc:
            out["latency_ms"][provider] = {"error": str(exc)[:300]}
            continue
        engine.warm_up(runs=1)
        out["latency_ms"][provider] = {
            "loaded": engine.provider,
            "variant": engine.model_ref.variant,
            "b1": round(latency(engine, 1, args.runs), 3),
            f"b{args.max_batch}": round(latency(engine, args.max_batch, args.runs), 3),
        }
        del engine

    expected = {"tensorrt": "TensorrtExecutionProvider", "cuda": "CUDAExecutionProvider"}.get(
        args.expect, "CPUExecutionProvider"
    )
    checks = {
        "expected_provider_loaded": out["default_order"]["provider"] == expected,
        "trt_engine_cached": args.expect != "tensorrt" or bool(engines),
        "trt_engine_reused": args.expect != "tensorrt" or (bool(engines) and not rebuilt and not new_files),
    }
    out["checks"] = checks
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
