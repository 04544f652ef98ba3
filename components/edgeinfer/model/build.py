"""`edgeinfer model build`: source network → in-graph preprocessing → INT8 variants → gate → store.

The store is written into a temporary folder next to its destination and renamed into place only
when everything (including the accuracy gate) passed: nothing partial is ever left in artifacts/.
A build whose inputs (options, source files, tool versions) did not change is skipped.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer import __version__
from edgeinfer.errors import EdgeinferError
from edgeinfer.files import check_replaceable, new_parents
from edgeinfer.model import gate, graph, images
from edgeinfer.model.manifest import (
    CPU,
    CUDA,
    MANIFEST_FILE,
    TENSORRT,
    Manifest,
    ManifestError,
    Preprocessing,
    TensorSpec,
    Variant,
    default_store_dir,
    sha256_file,
)
from edgeinfer.progress import Progress

log = logging.getLogger(__name__)

_PACKAGE = Path(__file__).resolve().parent
_SOURCES = ("build.py", "export.py", "graph.py", "images.py", "quantize.py", "gate.py", "manifest.py")
LABELS_FILE = "labels.json"
FP32_FILE = "model_fp32.onnx"
INT8_CPU_FILE = "model_int8_cpu.onnx"
INT8_TRT_FILE = "model_int8_tensorrt.onnx"


@dataclass
class BuildOptions:
    arch: str = "lite0"  # lite0 | lite2 (ignored with onnx)
    onnx: Path | None = None  # a user's FP32 classifier [N, 3, H, W] -> [N, classes]
    name: str | None = None
    size: int | None = None  # network input size (default: the arch's, or the ONNX input's)
    crop_fraction: float = 0.875
    mean: list[float] | None = None  # default 127 (EfficientNet-Lite's (x - 127) / 128)
    std: list[float] | None = None
    channel_order: str = "RGB"
    labels: Path | None = None  # JSON list or text file, one label per line
    int8: bool = True
    tensorrt_variant: bool = True
    calibration: Path | None = None
    validation: Path | None = None
    calibration_per_photo: int = 12
    validation_per_photo: int = 24
    min_calibration: int = 16
    exclude_nodes: list[str] = field(default_factory=list)
    sensitivity: str = "auto"  # auto (when the gate fails) | always | off
    max_exclude: int = 3
    bias_correction: bool = True
    equalize: bool = False  # cross-layer range equalization before quantizing (exact for ReLU nets only)
    thresholds: gate.Thresholds = field(default_factory=gate.Thresholds)
    out: Path | None = None  # default: the store dir (lite0) or artifacts/models/<name>/<version>
    artifacts: Path | None = None
    version: str = __version__
    force: bool = False
    seed: int = 0
    opset: int = 17

    def model_name(self) -> str:
        from edgeinfer.model.export import ARCHS

        if self.name:
            return self.name
        if self.onnx is not None:
            return self.onnx.stem
        if self.arch not in ARCHS:
            raise EdgeinferError(f"unknown arch {self.arch!r} (choose from {', '.join(ARCHS)})")
        return ARCHS[self.arch].name

    def output_dir(self) -> Path:
        if self.out is not None:
            return self.out
        if self.onnx is None and self.arch == "lite0" and not self.name:
            return default_store_dir(self.artifacts, self.version)
        root = default_store_dir(self.artifacts, self.version).parent.parent
        return root / "models" / self.model_name() / self.version


# ------------------------------------------------------------------------------------------- helpers


def _versions() -> dict[str, str]:
    out = {"edgeinfer": __version__}
    for dist in ("onnx", "onnxruntime", "onnxruntime-gpu", "torch", "numpy", "opencv-python-headless"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return out


def _file_digest(path: Path) -> str:
    try:
        return sha256_file(path)
    except OSError:
        return "missing"


def build_hash(options: BuildOptions) -> str:
    """A digest of everything a build depends on: options, the pipeline's code, inputs, tool versions."""
    digest = hashlib.sha256()
    opts = asdict(options)
    for key in ("force", "out", "artifacts"):
        opts.pop(key, None)
    digest.update(json.dumps(opts, sort_keys=True, default=str).encode())
    for name in _SOURCES:
        digest.update(_file_digest(_PACKAGE / name).encode())
    digest.update(json.dumps(_versions(), sort_keys=True).encode())
    for path in (options.onnx, options.labels):
        if path is not None:
            digest.update(_file_digest(path).encode())
    for folder in (options.calibration, options.validation):
        if folder is not None and folder.is_dir():
            for p in sorted(folder.rglob("*")):
                if p.is_file():
                    st = p.stat()
                    digest.update(f"{p.relative_to(folder)}:{st.st_size}:{st.st_mtime_ns}".encode())
    return digest.hexdigest()[:32]


def cached(options: BuildOptions) -> Manifest | None:
    """The existing store when it was built from the same inputs and its files are intact."""
    out = options.output_dir()
    try:
        manifest = Manifest.load(out)
        if manifest.source.get("build_hash") != build_hash(options):
            return None
        manifest.verify()
    except ManifestError:
        return None
    return manifest


def _read_labels(path: Path, classes: int | None) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise EdgeinferError(f"cannot read labels file {path}: {exc}") from None
    labels: list[str]
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise EdgeinferError(f"labels file {path} is not valid JSON: {exc}") from None
        if isinstance(data, dict):  # {"0": "tench", ...}
            keys = sorted(data, key=lambda k: int(k) if k.isascii() and k.isdigit() else -1)
            if [str(k) for k in keys] != [str(i) for i in range(len(keys))]:
                raise EdgeinferError(
                    f"labels file {path}: an object's keys must be the class indices 0, 1, 2, … as strings"
                )
            data = [data[k] for k in keys]
        if not isinstance(data, list):
            raise EdgeinferError(f"labels file {path} must hold a JSON list of class names")
        labels = [str(x) for x in data]
    else:
        labels = [line.strip() for line in text.splitlines() if line.strip()]
    if classes is not None and len(labels) != classes:
        raise EdgeinferError(
            f"labels file {path} has {len(labels)} labels but the model has {classes} classes"
        )
    return labels


def _output_classes(model: Any) -> int | None:
    dims = model.graph.output[0].type.tensor_type.shape.dim
    if len(dims) == 2 and dims[1].HasField("dim_value"):
        return int(dims[1].dim_value)
    return None


def _logits(path: Path, data: images.ImageSet, tick: Callable[[int], None], batch: int = 8) -> np.ndarray:
    from edgeinfer.model.quantize import _session

    sess = _session(path.read_bytes())
    outs = []
    for chunk in data.batches(batch):
        outs.append(sess.run(None, {graph.INPUT_NAME: chunk})[0])
        tick(len(chunk))
    return np.concatenate(outs).astype(np.float32)


# --------------------------------------------------------------------------------------------- build


def build(options: BuildOptions, *, quiet: bool = False) -> Manifest:
    """Build the store (or return the cached one). Raises EdgeinferError / GateFailedError."""
    if options.sensitivity not in ("auto", "always", "off"):
        raise EdgeinferError(f"--sensitivity must be auto, always or off, not {options.sensitivity!r}")
    if not 0 < options.crop_fraction <= 1:
        raise EdgeinferError(f"--crop must be in (0, 1], not {options.crop_fraction}")
    if options.channel_order.upper() not in ("RGB", "BGR"):
        raise EdgeinferError(f"--channel-order must be RGB or BGR, not {options.channel_order!r}")
    for what, values in (("--mean", options.mean), ("--std", options.std)):
        if values is not None and len(values) not in (1, 3):
            raise EdgeinferError(f"{what} takes 1 or 3 numbers, got {len(values)}")
    if options.std is not None and min(options.std) <= 0:
        raise EdgeinferError("--std must be positive")
    if options.size is not None and not 16 <= options.size <= 4096:
        raise EdgeinferError(f"--size must be 16-4096 pixels, not {options.size}")
    if options.max_exclude < 0:
        raise EdgeinferError(f"--max-exclude must be 0 or more, not {options.max_exclude}")
    th = options.thresholds
    for flag, value in (
        ("--min-top1", th.min_top1),
        ("--min-top1-confident", th.min_top1_confident),
        ("--min-top5", th.min_top5),
    ):
        if not 0 <= value <= 1:  # fractions: 0.95 is 95 %; a gate of 5 could never pass
            raise EdgeinferError(f"{flag} is a fraction from 0 to 1 (0.95 for 95 %), not {value}")
    if th.max_mean_abs_logit_delta is not None and not th.max_mean_abs_logit_delta > 0:
        raise EdgeinferError(f"--max-logit-delta must be positive, not {th.max_mean_abs_logit_delta}")
    if options.labels is not None:
        _read_labels(options.labels, None)  # a bad file fails now, not after the export
    if not options.force:
        hit = cached(options)
        if hit is not None:
            log.info("model store %s is up to date", hit.root)
            return hit
    out = options.output_dir()
    check_replaceable(out, "a model store (no readable manifest.json)", _is_store)
    with new_parents(out), _lock(out.parent):
        if not options.force:  # another process may have built it while we waited
            hit = cached(options)
            if hit is not None:
                return hit
        return _build_locked(options, out, quiet)


def _is_store(path: Path) -> bool:
    """A store this tool wrote, of this version or an older one: its manifest.json is an object with
    the store's `variants` (a web app's manifest.json is not)."""
    try:
        doc = json.loads((path / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(doc, dict) and isinstance(doc.get("variants"), (list, dict)) and "name" in doc


@contextmanager
def _lock(folder: Path) -> Iterator[None]:
    """An exclusive lock between processes building a store in `folder` (parallel test sessions).
    It is taken on the folder itself: a lock file beside the store, or in /tmp, would be one more
    file left behind per store ever built."""
    import fcntl

    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _build_locked(options: BuildOptions, out: Path, quiet: bool) -> Manifest:
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.build-", dir=out.parent))
    work.chmod(0o755)  # mkdtemp's 0700 would hide the store from the component's user
    try:
        manifest = _build_into(work, options, quiet)
        if out.exists():
            old = out.with_name(f".{out.name}.old-{time.time_ns()}")
            out.rename(old)
            work.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            work.rename(out)
        manifest.root = out
        return manifest
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)


def _build_into(work: Path, options: BuildOptions, quiet: bool) -> Manifest:
    import onnx

    from edgeinfer.model import export, quantize

    started = time.perf_counter()
    scratch = work / "_scratch"
    scratch.mkdir()
    name = options.model_name()
    bh = build_hash(options)
    report: dict[str, Any] = {"thresholds": options.thresholds.to_dict(), "variants": {}}
    with Progress(quiet) as progress:
        # 1. source network -> clean float core [N, 3, S, S]
        raw = scratch / "core_raw.onnx"
        with progress.step("export", 2) as tick:
            if options.onnx is not None:
                user = export.load_user_model(options.onnx)
                onnx.save(user, str(raw))
                source: dict[str, Any] = {"onnx": str(options.onnx), "onnx_sha256": sha256_file(options.onnx)}
                arch_size = None
            else:
                arch = export.ARCHS.get(options.arch)
                if arch is None:
                    raise EdgeinferError(
                        f"unknown arch {options.arch!r} (choose from {', '.join(export.ARCHS)})"
                    )
                export.export_efficientnet(arch, raw, options.opset)
                source = {"arch": arch.name, "weights": arch.weights_module}
                arch_size = arch.size
            tick(1)
            core_path = scratch / "core.onnx"
            core = export.prepare_core(raw, core_path)
            tick(1)
        in_name, in_shape = graph.core_input(core)
        static = in_shape[2] if isinstance(in_shape[2], int) and in_shape[2] > 0 else None
        size = options.size or arch_size or static or 224
        if static is not None and isinstance(in_shape[3], int) and (static != size or in_shape[3] != size):
            raise EdgeinferError(f"model input is {static}x{in_shape[3]} but --size is {size}")
        mean = options.mean or [127.0]
        std = options.std or [128.0]
        pre = Preprocessing.for_size(
            size,
            options.crop_fraction,
            mean=mean * 3 if len(mean) == 1 else mean,
            std=std * 3 if len(std) == 1 else std,
            channel_order=options.channel_order.upper(),
        )
        classes = _output_classes(core)
        if options.labels is not None:
            labels = _read_labels(options.labels, classes)
        elif options.onnx is None:
            labels = json.loads((_PACKAGE / "imagenet_labels.json").read_text(encoding="utf-8"))
        else:
            labels = [f"class_{i}" for i in range(classes or 0)]
        (work / LABELS_FILE).write_text(json.dumps(labels), encoding="utf-8")

        # 2. FP32 with preprocessing in the graph
        fp32 = graph.compose(core, pre)
        onnx.checker.check_model(fp32)
        quantize.save(fp32, work / FP32_FILE)
        variants = [
            Variant(
                FP32_FILE,
                "fp32",
                [CUDA, TENSORRT, CPU],
                name="fp32",
                provider_options={TENSORRT: {"trt_fp16_enable": True}},
            )
        ]
        calibration_size = validation_size = 0
        quant_settings: dict[str, Any] = {}

        if options.int8:
            # 3. calibration + held-out validation images (disjoint by source photo)
            shape = pre.preferred_input
            if options.calibration is not None:
                calib = images.folder_set(
                    options.calibration,
                    shape,
                    limit=512,
                    per_image=max(1, options.calibration_per_photo // 4),
                    min_count=options.min_calibration,
                    seed=options.seed,
                )
            else:
                calib = images.builtin_set(
                    images.CALIBRATION_PHOTOS, options.calibration_per_photo, shape, options.seed
                )
            if options.validation is not None:
                valid = images.folder_set(
                    options.validation, shape, limit=1024, per_image=1, min_count=8, seed=options.seed + 1
                )
            else:
                valid = images.builtin_set(
                    images.VALIDATION_PHOTOS, options.validation_per_photo, shape, options.seed + 1
                )
            if len(calib) < options.min_calibration:
                raise images.CalibrationError(
                    f"too few calibration images: {len(calib)} < {options.min_calibration}"
                )
            if len(valid) == 0:
                raise EdgeinferError("no validation images (scikit-image's photos are missing?)")
            calibration_size, validation_size = len(calib), len(valid)
            if calib.skipped or valid.skipped:
                log.warning(
                    "skipped %d unreadable or non-image files (%d calibration, %d validation)",
                    calib.skipped + valid.skipped,
                    calib.skipped,
                    valid.skipped,
                )
            pre_sess = quantize._session(graph.preprocessing_model(pre, options.opset))
            calib_x = np.concatenate(
                [pre_sess.run(None, {graph.INPUT_NAME: b})[0] for b in calib.batches(16)]
            )

            # what gets quantized, and its float twin (the reference of bias correction)
            qsource, qref = core_path, core
            equalized_pairs = 0
            if options.equalize:
                qref, equalized_pairs = quantize.equalize_ranges(core, in_name, calib_x[:64])
                qsource = scratch / "core_equalized.onnx"
                onnx.save(qref, str(qsource))
            schemes = ["u8s8"] + (["s8s8"] if options.tensorrt_variant else [])
            # quantize once per scheme, plus a re-run when the sensitivity pass excludes layers
            with progress.step("calibration", len(calib_x) * len(schemes)) as tick_cal:
                quantized: dict[str, Path] = {}
                for scheme in schemes:
                    path = scratch / f"core_{scheme}.onnx"
                    quantize.quantize_core(
                        qsource,
                        path,
                        calib_x,
                        scheme=scheme,
                        input_name=in_name,
                        exclude=options.exclude_nodes,
                        tick=tick_cal,
                    )
                    quantized[scheme] = path

            variant_files = {"u8s8": INT8_CPU_FILE, "s8s8": INT8_TRT_FILE}
            variant_names = {"u8s8": "int8-cpu", "s8s8": "int8-tensorrt"}
            bias_data = calib_x[: min(len(calib_x), 64)]

            def publish(scheme: str, qcore: Any, dest: Path) -> None:
                uint8 = scheme == "u8s8" and graph.uint8_trick_applies(pre)
                model = graph.compose(qcore, pre, uint8_input=uint8)
                quantize.save(model, dest)

            evaluations = len(schemes) * (2 if options.bias_correction else 1) + 1
            with progress.step("validation", len(valid) * evaluations) as tick_val:
                ref = _logits(work / FP32_FILE, valid, tick_val)
                finals: dict[str, Any] = {}
                for scheme in schemes:
                    vname = variant_names[scheme]
                    qcore = onnx.load(str(quantized[scheme]))
                    entry: dict[str, Any] = {}
                    dest = work / variant_files[scheme]
                    publish(scheme, qcore, dest)
                    entry["plain"] = gate.agreement(ref, _logits(dest, valid, tick_val))
                    if options.bias_correction:
                        qcore, n_corrected = quantize.bias_correct(qref, qcore, in_name, bias_data)
                        publish(scheme, qcore, dest)
                        entry["bias_corrected"] = gate.agreement(ref, _logits(dest, valid, tick_val))
                        entry["bias_corrected_layers"] = n_corrected
                        if entry["bias_corrected"]["top1"] < entry["plain"]["top1"]:
                            # keep what agrees better; say so in the report
                            qcore = onnx.load(str(quantized[scheme]))
                            publish(scheme, qcore, dest)
                            entry["bias_correction_kept"] = False
                        else:
                            entry["bias_correction_kept"] = True
                    best = entry["bias_corrected"] if entry.get("bias_correction_kept") else entry["plain"]
                    entry["final"] = best
                    finals[scheme] = qcore
                    report["variants"][vname] = entry

            # 4. sensitivity pass: keep the layers that hurt most in float, when needed (or asked)
            u8 = report["variants"]["int8-cpu"]
            misses = gate.failures("int8-cpu", u8["final"], options.thresholds)
            if options.sensitivity == "always" or (options.sensitivity == "auto" and misses):
                with progress.step("sensitivity", 3) as tick_s:
                    ranking = quantize.sensitivity(qref, finals["u8s8"], in_name, calib_x[:32])
                    tick_s(1)
                    worst = [n for n, _ in ranking[: options.max_exclude]]
                    path = scratch / "core_u8s8_excl.onnx"
                    quantize.quantize_core(
                        qsource,
                        path,
                        calib_x,
                        scheme="u8s8",
                        input_name=in_name,
                        exclude=[*options.exclude_nodes, *worst],
                    )
                    tick_s(1)
                    qcore = onnx.load(str(path))
                    if options.bias_correction and u8.get("bias_correction_kept"):
                        qcore, _ = quantize.bias_correct(qref, qcore, in_name, bias_data)
                    candidate = scratch / "int8_excl.onnx"
                    publish("u8s8", qcore, candidate)
                    figures = gate.agreement(ref, _logits(candidate, valid, lambda _n: None))
                    tick_s(1)
                u8["sensitivity"] = {
                    "ranking": [{"node": n, "score": round(s, 6)} for n, s in ranking[:10]],
                    "excluded": worst,
                    "before": u8["final"],
                    "after": figures,
                }
                if figures["top1"] > u8["final"]["top1"]:
                    shutil.copyfile(candidate, work / INT8_CPU_FILE)
                    u8["final"] = figures
                    u8["excluded_nodes"] = [*options.exclude_nodes, *worst]
                    u8["sensitivity"]["kept"] = True
                else:
                    u8["sensitivity"]["kept"] = False
            u8.setdefault("excluded_nodes", list(options.exclude_nodes))

            for scheme in schemes:
                vname = variant_names[scheme]
                report["variants"][vname]["gated"] = scheme == "u8s8"
            # the gate: the CPU INT8 variant is what runs on this class of machine; the TensorRT
            # variant's figures (on the CPU provider) are reported.
            report["passed"] = not gate.failures("int8-cpu", u8["final"], options.thresholds)
            gate.check({"int8-cpu": u8["final"]}, options.thresholds, report)

            variants.insert(
                0,
                Variant(
                    INT8_CPU_FILE,
                    "int8",
                    [CPU],
                    name="int8-cpu",
                    quant_format=quantize.SCHEME_LABEL["u8s8"],
                ),
            )
            if options.tensorrt_variant:
                variants.insert(
                    1,
                    Variant(
                        INT8_TRT_FILE,
                        "int8",
                        [TENSORRT],
                        name="int8-tensorrt",
                        quant_format=quantize.SCHEME_LABEL["s8s8"],
                        provider_options={TENSORRT: {"trt_int8_enable": True, "trt_fp16_enable": True}},
                    ),
                )
            quant_settings = {
                "format": "QDQ",
                "per_channel": True,
                "calibrate_method": "MinMax",
                "schemes": {variant_names[s]: quantize.SCHEME_LABEL[s] for s in schemes},
                "uint8_input_dequantize": graph.uint8_trick_applies(pre),
                "bias_correction": options.bias_correction,
                "equalized_pairs": equalized_pairs,
                "exclude_nodes": u8["excluded_nodes"],
                "sensitivity": options.sensitivity,
                "calibration_source": str(options.calibration)
                if options.calibration
                else "scikit-image photos + augmented crops",
                "calibration_skipped": calib.skipped,
                "validation_source": str(options.validation)
                if options.validation
                else "scikit-image photos (disjoint) + augmented crops",
                "calibration_photos": sorted(set(calib.sources)) if options.calibration is None else [],
                "validation_photos": sorted(set(valid.sources)) if options.validation is None else [],
            }

        shutil.rmtree(scratch)
        for variant in variants:
            path = work / variant.file
            variant.sha256 = sha256_file(path)
            variant.bytes = path.stat().st_size
        manifest = Manifest(
            name=name,
            version=options.version,
            inputs=[TensorSpec(graph.INPUT_NAME, "uint8", ["N", "H", "W", 3])],
            outputs=[TensorSpec(graph.OUTPUT_NAME, "float32", ["N", classes or "classes"])],
            preprocessing=pre,
            labels_file=LABELS_FILE,
            variants=variants,
            source={**source, "build_hash": bh, "opset": options.opset},
            quantization=quant_settings,
            calibration_size=calibration_size,
            validation_size=validation_size,
            validation=report if options.int8 else {},
            tools=_versions(),
            created=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            build_seconds=round(time.perf_counter() - started, 1),
        )
        manifest.save(work)
    return manifest
