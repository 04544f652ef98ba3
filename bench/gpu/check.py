#!/usr/bin/env python3
"""GPU path check for the inference runtime — run on a machine with an NVIDIA GPU and onnxruntime-gpu.

    python bench/gpu/check.py [--model-dir DIR] [--json FILE] [--expect tensorrt|cuda|cpu]

Checks, in a couple of minutes at most:
1. the CUDA and cuDNN libraries: what `preload_gpu_libraries` found (the runtime's own call);
2. which execution providers this ONNX Runtime build has, and which one *really* loads for the
   configured order TensorRT → CUDA → CPU (the runtime's own `Engine.create`, fallback detection
   included), with the manifest variant chosen for it;
3. the TensorRT engine + timing cache: a first session builds the engine into the work folder keyed
   by model hash / ORT / TRT / GPU / profile shapes; a second session creation with the same
   configuration must reuse it (no new engine file, much faster creation). A session counts as
   TensorRT-backed only when `get_providers()` lists TensorRT first AND an engine is in its cache
   (`edgeinfer.runtime.providers.tensorrt_backed`: ORT lists TensorRT even when it took no node);
   this holds for the default order and for a TensorRT FP16 engine (the FP32 model) and a TensorRT
   INT8 engine (the S8S8 QDQ variant), each built on a first start and reused on a second;
4. the same answers on every provider: the sample photos through each engine that loads, against
   the FP32 model on the CPU (top-1 and the largest probability difference);
5. warm latency per batch size (b1/b8/b32, each at its own shape, `cudaFixedBatch` off) for every
   provider that loads — TensorRT FP16 and INT8 against CUDA FP32 in the same run — and on CUDA
   the options the runtime chose against the alternatives (IO binding off, EXHAUSTIVE conv search):
   medians over repeated runs of one size, ratios only, never judged against absolute times.
   bench/gpu/diag.py measures what changing sizes cost.
Exit status: 0 when the expected provider loaded (TensorRT: backed by an engine, built then reused,
FP16 and INT8 alike) and the answers agree.
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

ORDER = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]


def engine_for(
    manifest: Any, providers: list[str], work: str, max_batch: int, **cuda: Any
) -> tuple[Any, float]:
    from edgeinfer.runtime.config import RuntimeConfig
    from edgeinfer.runtime.engine import Engine

    cfg = RuntimeConfig(execution_providers=providers, max_batch_size=max_batch)
    for key, value in cuda.items():  # CUDA provider options, or the runtime's own cuda_* knobs
        if hasattr(cfg.cuda, key):
            setattr(cfg.cuda, key, value)
        else:
            setattr(cfg, f"cuda_{key}", value)
    t = time.perf_counter()
    engine = Engine.create(manifest, cfg, work)
    return engine, time.perf_counter() - t


def latency(engine: Any, batch: int, runs: int) -> float:
    import numpy as np

    x = np.random.default_rng(batch).integers(
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


def trt_engine(manifest: Any, work: str, max_batch: int, *, fp16: bool, int8: bool) -> tuple[Any, float, Any]:
    """An engine on TensorRT alone at one precision: INT8 runs the S8S8 variant the runtime picks for
    TensorRT, FP16 the FP32 model (offered to TensorRT for this check only)."""
    import dataclasses

    from edgeinfer.runtime.config import RuntimeConfig
    from edgeinfer.runtime.engine import Engine

    if not int8:
        fp32 = dataclasses.replace(manifest.fp32, providers=[ORDER[0]])
        manifest = dataclasses.replace(manifest, variants=[fp32])
    cfg = RuntimeConfig(execution_providers=[ORDER[0]], max_batch_size=max_batch)
    cfg.tensorrt.trt_fp16_enable = fp16
    cfg.tensorrt.trt_int8_enable = int8
    cfg.cuda_fixed_batch = False
    t = time.perf_counter()
    engine = Engine.create(manifest, cfg, work)
    return engine, time.perf_counter() - t, manifest


def trt_starts(manifest: Any, work: str, max_batch: int, *, fp16: bool, int8: bool) -> dict[str, Any]:
    """Two starts of one TensorRT engine: the first must build an engine, the second reuse it."""
    from edgeinfer.runtime.providers import engine_files, tensorrt_backed

    row: dict[str, Any] = {}
    before: dict[str, float] = {}
    for start in ("first", "second"):
        try:
            engine, created, used = trt_engine(manifest, work, max_batch, fp16=fp16, int8=int8)
        except Exception as exc:  # no provider loaded at all
            row[start] = {"backed": False, "why": str(exc)[:300]}
            return row
        if start == "first":
            before = engine_files(engine.plan.cache_dir)
        t = time.perf_counter()
        engine.warm_up(runs=1)
        after = engine_files(engine.plan.cache_dir)
        backed, why = tensorrt_backed(engine.session.get_providers(), before, after)
        row[start] = {
            "provider": engine.provider,
            "variant": engine.model_ref.variant,
            "backed": backed,
            "why": why,
            "create_s": round(created, 3),
            "warm_up_s": round(time.perf_counter() - t, 3),
            "engine_files": sorted(after),
        }
        row["engine"], row["manifest"] = engine, used
        before = after
    first, second = row["first"], row["second"]
    row["built_then_reused"] = (
        first["backed"] and second["backed"] and second["why"].startswith("engine reused")
    )
    return row


def cache_files(path: str | None) -> dict[str, float]:
    if not path or not os.path.isdir(path):
        return {}
    return {f.name: f.stat().st_mtime for f in Path(path).iterdir() if f.is_file()}


def sample_batch(size: int) -> tuple[list[str], Any]:
    import numpy as np

    from edgeinfer.model.samples import sample_images
    from edgeinfer.runtime.decode import decode_image

    photos = sample_images()
    images = [decode_image(p.read_bytes(), size) for p in photos]
    return [p.stem for p in photos], np.ascontiguousarray(np.stack(images))


def reference(manifest: Any, batch: Any) -> Any:
    """The FP32 model on the CPU, plain ORT: what every provider's answers are held against."""
    import numpy as np
    import onnxruntime as ort

    session = ort.InferenceSession(str(manifest.path(manifest.fp32)), providers=["CPUExecutionProvider"])
    out = np.asarray(session.run(None, {session.get_inputs()[0].name: batch})[0], dtype=np.float64)
    z = np.exp(out - out.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def agreement(engine: Any, names: list[str], batch: Any, ref: Any) -> dict[str, Any]:
    import numpy as np

    probs = engine.run(batch)
    top = probs.argmax(axis=-1)
    want = ref.argmax(axis=-1)
    top5 = np.argsort(-ref, axis=-1)[:, :5]
    return {
        "top1_same": int((top == want).sum()),
        "top1_in_ref_top5": int(sum(int(t) in row for t, row in zip(top, top5, strict=True))),
        "of": len(names),
        "max_prob_diff": round(float(np.abs(probs - ref).max()), 5),
        "top1": {n: engine.labels[int(i)] for n, i in zip(names, top, strict=True)},
    }


def main() -> int:
    import onnxruntime as ort

    from edgeinfer.model.manifest import Manifest, default_store_dir

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", default="")
    p.add_argument("--work-dir", default="", help="where the TensorRT caches go (default: a temp folder)")
    p.add_argument("--json", default="")
    p.add_argument("--expect", choices=["tensorrt", "cuda", "cpu"], default="tensorrt")
    p.add_argument("--max-batch", type=int, default=8, help="the runtime's maxBatchSize (profile shapes)")
    p.add_argument("--batches", default="1,8,32", help="batch sizes to time on the GPU (default: 1,8,32)")
    p.add_argument("--runs", type=int, default=50)
    args = p.parse_args()
    batches = sorted({int(b) for b in args.batches.split(",") if b.strip()})

    manifest = Manifest.load(args.model_dir or default_store_dir())
    work = args.work_dir or tempfile.mkdtemp(prefix="edgeinfer-gpu-check-")
    out: dict[str, Any] = {
        "onnxruntime": ort.__version__,
        "device": ort.get_device(),
        "available": ort.get_available_providers(),
        "model": f"{manifest.name} {manifest.version}",
    }

    # 1-3: the default order, twice with the same work folder (engine cache reuse).
    first, t_first = engine_for(manifest, ORDER, work, args.max_batch)
    out["gpu_libraries"] = first.gpu_libraries
    t = time.perf_counter()
    first.warm_up(runs=1)
    warm_first = time.perf_counter() - t
    files_after_first = cache_files(first.plan.cache_dir)
    del first
    second, t_second = engine_for(manifest, ORDER, work, args.max_batch)
    t = time.perf_counter()
    second.warm_up(runs=1)
    warm_second = time.perf_counter() - t
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
        "first_warm_up_s": round(warm_first, 3),
        "second_create_s": round(t_second, 3),
        "second_warm_up_s": round(warm_second, 3),
        "engine_files": engines,
        "engine_rebuilt": rebuilt,
        "new_files_on_second_start": new_files,
    }
    from edgeinfer.runtime.providers import engine_files, tensorrt_backed

    backed, why = tensorrt_backed(
        second.session.get_providers(), files_after_first, engine_files(second.plan.cache_dir)
    )
    out["default_order"]["tensorrt_backed"], out["default_order"]["tensorrt_why"] = backed, why
    del second

    # 4 + 5: answers and latency per provider that loads, and the CUDA options against the others.
    names, photos = sample_batch(int(manifest.preprocessing.preferred_input[0]))
    ref = reference(manifest, photos)
    top = max([*batches, args.max_batch])
    out["tensorrt"] = {}
    if ORDER[0] in ort.get_available_providers():
        for label, fp16, int8 in (("TensorRT FP16", True, False), ("TensorRT INT8", True, True)):
            starts = trt_starts(
                manifest, os.path.join(work, label.split()[1].lower()), top, fp16=fp16, int8=int8
            )
            engine = starts.pop("engine", None)
            starts.pop("manifest", None)
            out["tensorrt"][label] = starts
            if engine is None or not starts.get("built_then_reused"):
                out.setdefault("providers", {})[label] = {
                    "error": str(starts.get("second", starts.get("first")))
                }
                continue
            trt_row: dict[str, Any] = {
                "variant": engine.model_ref.variant,
                "answers": agreement(engine, names, photos, ref),
            }
            for b in batches:
                trt_row[f"b{b}_ms"] = round(latency(engine, b, args.runs), 3)
                trt_row[f"b{b}_img_per_s"] = round(b * 1000 / trt_row[f"b{b}_ms"], 1)
            out.setdefault("providers", {})[label] = trt_row
            del engine
    runs: list[tuple[str, list[str], dict[str, Any]]] = [(p, [p], {}) for p in ORDER]
    runs += [
        ("CUDA, IO binding off", ["CUDAExecutionProvider"], {"io_binding": False}),
        ("CUDA, EXHAUSTIVE conv search", ["CUDAExecutionProvider"], {"cudnn_conv_algo_search": "EXHAUSTIVE"}),
    ]
    out.setdefault("providers", {})
    for label, providers, cuda in runs:
        if providers[0] not in ort.get_available_providers():
            continue
        try:
            # Each batch size at its own shape (not padded to the largest): what a size costs.
            engine, created = engine_for(manifest, providers, work, top, **{"fixed_batch": False, **cuda})
        except Exception as exc:
            out["providers"][label] = {"error": str(exc)[:300]}
            continue
        if engine.provider != providers[0]:
            attempts = engine.describe()["attempts"]
            out["providers"][label] = {"error": f"fell back to {engine.provider}", "attempts": attempts}
            continue
        t = time.perf_counter()
        engine.warm_up(runs=1)
        row: dict[str, Any] = {
            "variant": engine.model_ref.variant,
            "create_s": round(created, 3),
            "warm_up_s": round(time.perf_counter() - t, 3),
            "answers": agreement(engine, names, photos, ref),
        }
        on_cpu = engine.provider == "CPUExecutionProvider"
        sizes = [b for b in batches if b <= args.max_batch] if on_cpu else batches
        for b in sizes:
            row[f"b{b}_ms"] = round(latency(engine, b, args.runs), 3)
            row[f"b{b}_img_per_s"] = round(b * 1000 / row[f"b{b}_ms"], 1)
        out["providers"][label] = row
        del engine

    expected = {"tensorrt": "TensorrtExecutionProvider", "cuda": "CUDAExecutionProvider"}.get(
        args.expect, "CPUExecutionProvider"
    )
    # FP32 on any provider gives the reference's top-1; INT8 moves close calls (two cat breeds) but
    # keeps its top-1 among the reference's top 5.
    rows = [r for r in out["providers"].values() if "answers" in r]
    checks = {
        "expected_provider_loaded": out["default_order"]["provider"] == expected,
        "answers_agree": bool(rows)
        and all(
            r["answers"]["top1_in_ref_top5"] == r["answers"]["of"]
            and (r["variant"] != "fp32" or r["answers"]["top1_same"] == r["answers"]["of"])
            for r in rows
        ),
    }
    if args.expect == "tensorrt":  # judged only where TensorRT is expected (never passed by default)
        checks["trt_backed"] = bool(out["default_order"]["tensorrt_backed"])
        checks["trt_engine_cached"] = bool(engines)
        checks["trt_engine_reused"] = bool(engines) and not rebuilt and not new_files
        for label in ("TensorRT FP16", "TensorRT INT8"):
            key = "trt_" + label.split()[1].lower() + "_built_then_reused"
            checks[key] = bool(out["tensorrt"].get(label, {}).get("built_then_reused"))
    out["checks"] = checks
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    heads = " ".join(f"{'b' + str(b) + ' ms':>8}" for b in batches)
    print(f"\n{'provider':<34} {'variant':<14} {'top1':>5} {'maxdiff':>8} {heads}")
    for label, row in out["providers"].items():
        if "answers" not in row:
            print(f"{label:<34} {row['error'][:80]}")
            continue
        a = row["answers"]
        cells = " ".join(f"{row.get(f'b{b}_ms', float('nan')):>8.3f}" for b in batches)
        top1 = f"{a['top1_same']:>2}/{a['of']:<2}"
        print(f"{label:<34} {row['variant']:<14} {top1} {a['max_prob_diff']:>8.4f} {cells}")
    print(f"default order → {out['default_order']['provider']}; checks: {checks}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
