"""`edgeinfer bench model`: FP32 against every INT8 variant, side by side in one run, CPU provider.

The published graphs are timed as the runtime runs them (uint8 NHWC in, preprocessing inside the
graph). A detector store (`--detector`, or a `--store` whose manifest says `detection`) is timed on
letterboxed photos, its agreement read as precision/recall of FP32's own boxes, and its post step
(thresholds + NMS, vectorised numpy) timed beside ONNX's NonMaxSuppression on the same outputs.
Runs are interleaved across variants in rounds, so a noisy neighbour slows all of them alike;
every figure that matters is a ratio against FP32 measured in the same run.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeinfer.errors import EdgeinferError
from edgeinfer.files import write_output
from edgeinfer.stats import percentile

if TYPE_CHECKING:  # numpy loads on first use, so `edgeinfer --help` stays instant
    import numpy as np

NAIVE = "int8-cpu-naive"


def register_bench(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "model",
        help="FP32 vs INT8 variants of the model store: latency, throughput, agreement",
        description="FP32 against every INT8 variant that runs here, side by side, CPU provider.",
    )
    p.add_argument(
        "--store", type=Path, help="store folder (default artifacts/com.edgeinfer.ModelStore/<version>)"
    )
    p.add_argument(
        "--detector",
        action="store_true",
        help="bench the detector store (default artifacts/models/yolov3-tiny/<version>)",
    )
    p.add_argument("--json", type=Path, metavar="FILE", help="write the figures as JSON")
    p.add_argument(
        "--size", type=int, default=224, help="input images are SIZE x SIZE uint8 RGB (default 224)"
    )
    p.add_argument("--threads", type=int, default=0, help="ORT intra-op threads (default: all cores)")
    p.add_argument("--rounds", type=int, default=10, help="interleaved rounds per batch size")
    p.add_argument(
        "--runs", type=int, default=20, help="batch-1 runs per variant per round (batch 8: a quarter)"
    )
    p.add_argument(
        "--no-naive",
        dest="naive",
        action="store_false",
        help="skip the reference row: int8-cpu behind float preprocessing (what the uint8 input saves)",
    )
    p.set_defaults(func=_run)


def _inputs(size: int, *, detector: bool = False) -> np.ndarray:
    """8 real photos (the bundled samples, cycled, with flips) resized to size x size; for a detector
    Darknet's test photos first when they are installed, letterboxed."""
    import numpy as np

    from edgeinfer.model import images, samples

    paths = list(samples.sample_images())
    if detector:
        paths = sorted(images.DARKNET_DATA.glob("*.jpg")) + paths
    photos = [images.read_image(p) for p in paths]
    usable = [p for p in photos if p is not None]
    if not usable:
        raise EdgeinferError("no sample images to benchmark with")
    batch = []
    for i in range(8):
        photo = usable[i % len(usable)]
        if i >= len(usable):
            photo = np.ascontiguousarray(photo[:, ::-1])
        batch.append(images.letterbox(photo, (size, size)) if detector else images.fit(photo, (size, size)))
    return np.stack(batch)


def _time(fn: Callable[[], object], runs: int, clock: Callable[[], float] = time.perf_counter) -> list[float]:
    out = []
    for _ in range(runs):
        start = clock()
        fn()
        out.append((clock() - start) * 1e3)
    return out


@dataclass
class _Sessions:
    """The variants that run here, their inputs, and each one's figures as they accrue."""

    threads: int
    batch1: np.ndarray
    batch8: np.ndarray
    sessions: dict[str, tuple[Any, str]] = field(default_factory=dict)  # variant -> (session, input)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)

    def first_runs(self, vname: str, sess: Any) -> float:
        """The first batch-1 run (ms), then an untimed batch-8 run to warm that shape too."""
        name = sess.get_inputs()[0].name
        start = time.perf_counter()
        sess.run(None, {name: self.batch1})
        first = (time.perf_counter() - start) * 1e3
        sess.run(None, {name: self.batch8})
        self.sessions[vname] = (sess, name)
        return first


def _load_manifest(store: Path | None, detector: bool) -> Any:
    from edgeinfer.model.manifest import Manifest, default_store_dir

    if store is None and detector:
        from edgeinfer.model.build import BuildOptions

        store = BuildOptions(task="detection").output_dir()
    return Manifest.load(store if store is not None else default_store_dir())


def _open_variant(bench: _Sessions, manifest: Any, variant: Any) -> None:
    """A published variant's session, created three times for its median create time; skipped (with
    the reason) when this build of ORT cannot run it on the CPU."""
    import numpy as np
    import onnxruntime as ort

    from edgeinfer.model import infer
    from edgeinfer.model.manifest import CPU

    path = manifest.path(variant)
    creates = []
    sess = None
    for _ in range(3):
        start = time.perf_counter()
        try:
            sess = ort.InferenceSession(str(path), infer.session_options(bench.threads), providers=[CPU])
        except Exception as exc:  # a variant this build of ORT cannot run on the CPU
            bench.results[variant.name] = {"skipped": str(exc).splitlines()[0][:200]}
            return
        creates.append((time.perf_counter() - start) * 1e3)
    first = bench.first_runs(variant.name, sess)
    bench.results[variant.name] = {
        "file": variant.file,
        "precision": variant.precision,
        "quant_format": variant.quant_format,
        "session_create_ms": round(float(np.median(creates)), 2),
        "first_run_ms": round(first, 2),
        "_b1": [],
        "_b8": [],
    }


def _open_naive(bench: _Sessions, manifest: Any) -> None:
    """The reference row: the CPU INT8 graph with float preprocessing in front of it (not published)."""
    import onnx
    import onnxruntime as ort

    from edgeinfer.model import infer
    from edgeinfer.model.graph import naive_preprocessing
    from edgeinfer.model.manifest import CPU

    slow = naive_preprocessing(onnx.load(str(manifest.path(manifest.variant("int8-cpu")))))
    if slow is None:
        return
    start = time.perf_counter()
    sess = ort.InferenceSession(
        slow.SerializeToString(), infer.session_options(bench.threads), providers=[CPU]
    )
    create = (time.perf_counter() - start) * 1e3
    first = bench.first_runs(NAIVE, sess)
    bench.results[NAIVE] = {
        "file": "(int8-cpu with Cast/Sub/Mul/QuantizeLinear preprocessing; reference, not published)",
        "precision": "int8",
        "quant_format": "",
        "session_create_ms": round(create, 2),
        "first_run_ms": round(first, 2),
        "_b1": [],
        "_b8": [],
    }


def _interleave(bench: _Sessions, rounds: int, runs: int) -> None:
    """Interleaved rounds, so every variant sees the same noise; the order rotates each round and a few
    untimed runs after each switch let the previous session's spinning threads settle."""

    def runner(sess: Any, name: str, batch: np.ndarray) -> Callable[[], object]:
        return lambda: sess.run(None, {name: batch})

    order = list(bench.sessions)
    for round_ in range(rounds):
        turn = order[round_ % len(order) :] + order[: round_ % len(order)]
        for batch, key, count in ((bench.batch1, "_b1", runs), (bench.batch8, "_b8", max(1, runs // 4))):
            for vname in turn:
                sess, name = bench.sessions[vname]
                _time(runner(sess, name, batch), 2)
                bench.results[vname][key] += _time(runner(sess, name, batch), count)


def _latency_figures(r: dict[str, Any]) -> None:
    """A variant's timed runs → its medians, p99s and throughputs."""
    import numpy as np

    b1, b8 = r.pop("_b1"), r.pop("_b8")
    r["b1_median_ms"] = round(float(np.median(b1)), 3)
    r["b1_p99_ms"] = round(percentile(b1, 99), 3)
    r["b8_median_ms"] = round(float(np.median(b8)), 3)
    r["b8_p99_ms"] = round(percentile(b8, 99), 3)
    r["images_per_s_b1"] = round(1e3 / r["b1_median_ms"], 1)
    r["images_per_s_b8"] = round(8e3 / r["b8_median_ms"], 1)
    r["runs"] = {"b1": len(b1), "b8": len(b8)}


def _agreement(
    r: dict[str, Any], manifest: Any, outs: list[Any], reference: Any, held_out: dict[str, Any] | None
) -> None:
    """A variant's agreement with FP32 on the bench's inputs (`reference`: FP32's detections, or its
    logits), and the build's on its held-out set."""
    from edgeinfer.model import gate

    if manifest.is_detector:
        bench_agreement = gate.detection_agreement(reference, _found(manifest, outs))
        r["agreement_bench_inputs"] = {
            k: round(bench_agreement[k], 4) for k in ("precision", "recall", "mean_iou")
        }
        keys: tuple[str, ...] = (
            "precision",
            "recall",
            "mean_iou",
            "matched",
            "reference_detections",
            "images",
        )
    else:
        r["agreement_bench_inputs"] = round(gate.agreement(reference, outs[0])["top1"], 4)
        keys = ("top1", "top1_confident", "top5", "mean_abs_logit_delta", "count")
    if held_out:
        r["agreement_held_out"] = {k: held_out[k] for k in keys}


def run_bench(
    store: Path | None,
    *,
    size: int = 224,
    threads: int = 0,
    rounds: int = 10,
    runs: int = 20,
    naive: bool = True,
    detector: bool = False,
) -> dict[str, Any]:
    import onnxruntime as ort

    from edgeinfer.model.manifest import CPU

    manifest = _load_manifest(store, detector)
    detector = manifest.is_detector
    if detector:
        size = int(manifest.preprocessing.preferred_input[0])
    threads = threads or (os.cpu_count() or 1)
    batch8 = _inputs(size, detector=detector)
    bench = _Sessions(threads, batch8[:1], batch8)
    for variant in manifest.variants:
        _open_variant(bench, manifest, variant)
    if naive and "int8-cpu" in bench.sessions:
        _open_naive(bench, manifest)
    if "fp32" not in bench.sessions:
        raise EdgeinferError("the store's FP32 variant does not run here; nothing to compare against")
    _interleave(bench, rounds, runs)
    ref_sess, ref_name = bench.sessions["fp32"]
    ref_out = ref_sess.run(None, {ref_name: batch8})
    reference = _found(manifest, ref_out) if detector else ref_out[0]
    results = bench.results
    for vname in bench.sessions:
        _latency_figures(results[vname])
    base = results["fp32"]
    for vname, (sess, name) in bench.sessions.items():
        r = results[vname]
        r["speedup_b1"] = round(base["b1_median_ms"] / r["b1_median_ms"], 3)
        r["speedup_b8"] = round(base["b8_median_ms"] / r["b8_median_ms"], 3)
        held_out = (
            manifest.validation.get("variants", {})
            .get(vname if vname != NAIVE else "int8-cpu", {})
            .get("final")
        )
        _agreement(r, manifest, sess.run(None, {name: batch8}), reference, held_out)
    report: dict[str, Any] = {}
    if detector:
        report["post_step"] = _post_step(manifest, ref_out, threads, rounds)
    return {
        "scenario": "model",
        "task": manifest.task,
        "store": str(manifest.root),
        "model": {"name": manifest.name, "version": manifest.version},
        "inputs": f"{size}x{size} uint8 RGB NHWC"
        + (" letterboxed photos" if detector else "")
        + ", preprocessing in the graph",
        "provider": CPU,
        "threads": threads,
        "machine": {
            "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
            "onnxruntime": ort.__version__,
        },
        "variants": results,
        **report,
        "timestamp": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def _found(manifest: Any, outs: list[Any]) -> list[list[tuple[int, float, list[float]]]]:
    """Each image's detections with the store's defaults, as the gate compares them."""
    from edgeinfer import postprocess

    spec = manifest.detection
    found = []
    for boxes, scores in zip(outs[0], outs[1], strict=True):
        dets = postprocess.detections(
            boxes,
            scores,
            score_threshold=spec.score_threshold,
            iou_threshold=spec.iou_threshold,
            max_detections=spec.max_detections,
        )
        found.append([(d.index, d.score, [d.box.x_min, d.box.y_min, d.box.x_max, d.box.y_max]) for d in dets])
    return found


def _post_step(manifest: Any, outs: list[Any], threads: int, rounds: int) -> dict[str, Any]:
    """The detector's post step two ways on the same FP32 outputs of 8 photos, per image: the
    runtime's vectorised numpy (threshold, then one IoU matrix over the candidates) against ONNX's
    NonMaxSuppression op (what "NMS in the graph" runs), both to the same kept boxes."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from edgeinfer import postprocess
    from edgeinfer.model import infer
    from edgeinfer.model.manifest import CPU

    spec = manifest.detection
    boxes, scores = outs[0], outs[1]
    classes = scores.shape[2]
    graph = helper.make_graph(
        [
            helper.make_node("Transpose", ["scores"], ["by_class"], perm=[0, 2, 1]),
            helper.make_node(
                "NonMaxSuppression", ["boxes", "by_class", "limit", "iou", "score"], ["selected"]
            ),
        ],
        "nms",
        [
            helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, "A", 4]),
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, "A", classes]),
        ],
        [helper.make_tensor_value_info("selected", TensorProto.INT64, ["K", 3])],
        [
            helper.make_tensor("limit", TensorProto.INT64, [1], [spec.max_detections]),
            helper.make_tensor("iou", TensorProto.FLOAT, [1], [spec.iou_threshold]),
            helper.make_tensor("score", TensorProto.FLOAT, [1], [spec.score_threshold]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    sess = ort.InferenceSession(model.SerializeToString(), infer.session_options(threads), providers=[CPU])

    def numpy_step() -> list[Any]:
        return [
            postprocess.detections(
                b,
                s,
                score_threshold=spec.score_threshold,
                iou_threshold=spec.iou_threshold,
                max_detections=spec.max_detections,
            )
            for b, s in zip(boxes, scores, strict=True)
        ]

    def onnx_step() -> list[Any]:
        return [
            sess.run(None, {"boxes": b[None], "scores": s[None]})[0]
            for b, s in zip(boxes, scores, strict=True)
        ]

    kept_numpy = sum(len(x) for x in numpy_step())
    kept_onnx = sum(len(x) for x in onnx_step())
    numpy_ms, onnx_ms = [], []
    for _ in range(rounds):
        numpy_ms += _time(numpy_step, 3)
        onnx_ms += _time(onnx_step, 3)
    per_image = len(boxes)
    numpy_med = float(np.median(numpy_ms)) / per_image
    onnx_med = float(np.median(onnx_ms)) / per_image
    return {
        "numpy_ms_per_image": round(numpy_med, 3),
        "onnx_nms_ms_per_image": round(onnx_med, 3),
        "numpy_speedup": round(onnx_med / numpy_med, 2),
        "kept": {"numpy": kept_numpy, "onnx_nms": kept_onnx},
        "note": "ONNX's per-class NMS (no cross-class cap: kept counts differ when max_detections binds)",
    }


def table(report: dict[str, Any]) -> str:
    head = (
        f"{'variant':<14} {'create':>7} {'first':>7} {'b1 med':>7} {'b1 p99':>7} {'b8 med':>7} {'b8 p99':>7}"
        f" {'img/s b8':>8} {'x b1':>5} {'x b8':>5} {'top-1':>6} {'conf':>6}"
    )
    lines = [
        f"bench model: {report['model']['name']} {report['model']['version']}, {report['inputs']},"
        f" {report['provider']}, {report['threads']} threads (ms; x = speed-up over fp32, same run)",
        head,
    ]
    for name, r in report["variants"].items():
        if "skipped" in r:
            lines.append(f"{name:<14} skipped: {r['skipped']}")
            continue
        held = r.get("agreement_held_out")
        if report.get("task") == "detection":
            prec = f"{100 * held['precision']:.1f}%" if held else "-"
            rec = f"{100 * held['recall']:.1f}%" if held else "-"
            lines.append(
                f"{name:<14} {r['session_create_ms']:7.1f} {r['first_run_ms']:7.1f} {r['b1_median_ms']:7.2f}"
                f" {r['b1_p99_ms']:7.2f} {r['b8_median_ms']:7.2f} {r['b8_p99_ms']:7.2f}"
                f" {r['images_per_s_b8']:8.0f}"
                f" {r['speedup_b1']:5.2f} {r['speedup_b8']:5.2f} {prec:>6} {rec:>6}"
            )
            continue
        top1 = f"{100 * held['top1']:.1f}%" if held else "-"
        conf = f"{100 * held['top1_confident']:.1f}%" if held else "-"
        lines.append(
            f"{name:<14} {r['session_create_ms']:7.1f} {r['first_run_ms']:7.1f} {r['b1_median_ms']:7.2f}"
            f" {r['b1_p99_ms']:7.2f} {r['b8_median_ms']:7.2f} {r['b8_p99_ms']:7.2f}"
            f" {r['images_per_s_b8']:8.0f}"
            f" {r['speedup_b1']:5.2f} {r['speedup_b8']:5.2f} {top1:>6} {conf:>6}"
        )
    if report.get("task") == "detection":
        lines[1] = lines[1].replace("  top-1   conf", "   prec    rec")
        lines.append(
            "prec / rec: precision / recall of fp32's own boxes on the held-out set (IoU >= 0.5, same class)"
        )
        post = report.get("post_step")
        if post:
            lines.append(
                f"post step per image: vectorised numpy {post['numpy_ms_per_image']:.2f} ms,"
                f" ONNX NonMaxSuppression {post['onnx_nms_ms_per_image']:.2f} ms"
                f" ({post['numpy_speedup']:.1f}x)"
            )
        return "\n".join(lines)
    lines.append(
        "top-1 / conf: agreement with fp32 on the held-out set (all / where fp32 p > 0.5), from the build"
    )
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    if args.rounds < 1 or args.runs < 1:
        raise EdgeinferError("--rounds and --runs must be at least 1")
    report = run_bench(
        args.store,
        size=args.size,
        threads=args.threads,
        rounds=args.rounds,
        runs=args.runs,
        naive=args.naive,
        detector=args.detector,
    )
    print(table(report))
    if args.json is not None:
        write_output(args.json, (json.dumps(report, indent=2) + "\n").encode())
    return 0
