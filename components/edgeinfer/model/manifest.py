"""The model store's `manifest.json`: what a built `com.edgeinfer.ModelStore` holds and how to feed it.

The store is a folder `artifacts/com.edgeinfer.ModelStore/<version>/` with the FP32 model, one INT8
variant per execution-provider family, the labels and this manifest. The runtime reads it through
`Manifest.load(folder)` and picks a model with `manifest.variant_for(provider)`, where `provider` is
the ONNX Runtime execution provider that really loaded (`session.get_providers()[0]`).

Every published graph takes uint8 RGB images NHWC `[N, H, W, 3]` with dynamic N, H and W; centre
crop, linear resize and normalisation are inside the graph (`Preprocessing` only describes them, plus
`preferred_input`: the size a runtime should resize decoded images to so that they batch and the
in-graph crop/resize is cheap).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from edgeinfer import __version__
from edgeinfer.errors import EdgeinferError
from edgeinfer.files import atomic_write, sha256_file

__all__ = [
    "COMPONENT",
    "CPU",
    "CUDA",
    "MANIFEST_FILE",
    "TENSORRT",
    "DetectionSpec",
    "Manifest",
    "ManifestError",
    "Preprocessing",
    "TensorSpec",
    "Variant",
    "default_store_dir",
    "sha256_file",
]

COMPONENT = "com.edgeinfer.ModelStore"
MANIFEST_FILE = "manifest.json"
SCHEMA_VERSION = 1

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"


class ManifestError(EdgeinferError):
    """The store is missing, unreadable, or its files do not match the manifest."""


def default_store_dir(artifacts: Path | str | None = None, version: str = __version__) -> Path:
    """`<artifacts>/com.edgeinfer.ModelStore/<version>/`; artifacts defaults to `$EDGEINFER_ARTIFACTS`
    or `./artifacts`."""
    root = Path(artifacts if artifacts is not None else os.environ.get("EDGEINFER_ARTIFACTS", "artifacts"))
    return root / COMPONENT / version


def _task(value: Any) -> str:
    if value not in TASKS:
        raise ManifestError(f"unknown task {value!r} (this runtime serves: {', '.join(TASKS)})")
    return str(value)


def _from_dict(cls: type[Any], data: dict[str, Any]) -> Any:
    """Build a flat dataclass from a dict, ignoring unknown keys (newer manifests stay readable)."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class TensorSpec:
    name: str
    dtype: str  # numpy-style name: "uint8", "float32"
    shape: list[int | str]  # symbolic dims as strings: ["N", "H", "W", 3]


@dataclass
class Preprocessing:
    """What the graph does to its uint8 input (it is all inside the graph; this is documentation and
    the runtime's resize hint)."""

    layout: str = "NHWC"
    dtype: str = "uint8"
    channel_order: str = "RGB"
    size: int = 224  # the network's own square input size, after crop and resize
    crop_fraction: float = 0.875  # centre crop of the shorter side before the resize (224/256)
    mean: list[float] = field(default_factory=lambda: [127.0, 127.0, 127.0])
    std: list[float] = field(default_factory=lambda: [128.0, 128.0, 128.0])
    interpolation: str = "linear"
    # "crop" (classifiers: centre crop of crop_fraction, then resize) or "letterbox" (detectors: the
    # whole image scaled to fit `size`, the rest filled with `pad_value`; boxes come back in the
    # source image's pixels).
    resize: str = "crop"
    pad_value: int = 127
    # [H, W] a runtime should resize decoded images to: they batch, and crop + resize in the graph is
    # then a cheap crop (size / crop_fraction, e.g. 256 for 224 at 0.875).
    preferred_input: list[int] = field(default_factory=lambda: [256, 256])

    @classmethod
    def for_size(
        cls,
        size: int,
        crop_fraction: float = 0.875,
        mean: list[float] | None = None,
        std: list[float] | None = None,
        channel_order: str = "RGB",
    ) -> Preprocessing:
        side = round(size / crop_fraction)
        return cls(
            size=size,
            crop_fraction=crop_fraction,
            mean=list(mean) if mean is not None else [127.0] * 3,
            std=list(std) if std is not None else [128.0] * 3,
            channel_order=channel_order,
            preferred_input=[side, side],
        )


TASKS = ("classification", "detection")
LAYOUTS = ("objectness", "anchor_free")


@dataclass
class DetectionSpec:
    """How a detector's graph output is read, and the post step's defaults.

    Every detector graph ends in `boxes [N, A, 4]` (x_min, y_min, x_max, y_max in the input image's
    pixels) and `scores [N, A, C]`; `layout` says what the source network wrote: `objectness`
    `[N, A, 5 + C]` (cx, cy, w, h, objectness, classes) or `anchor_free` `[N, 4 + C, A]`."""

    layout: str = "objectness"
    score_threshold: float = 0.25
    iou_threshold: float = 0.45
    max_detections: int = 100


@dataclass
class Variant:
    """One published graph. `providers`: the ORT execution providers it is meant for, in order."""

    file: str
    precision: str  # "fp32" | "int8"
    providers: list[str]
    sha256: str = ""
    bytes: int = 0
    name: str = ""  # "fp32", "int8-cpu", "int8-tensorrt"
    quant_format: str = ""  # "" for float; "QDQ U8S8 per-channel", "QDQ S8S8 symmetric per-channel"
    # Hints for the session options of each provider, keyed by provider (ORT's option names).
    provider_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Host classes (edgeinfer.procfs.SATURATING_INT8) whose integer kernels lose this variant's
    # accuracy: the runtime takes the next variant for the provider there. Older manifests: none.
    saturates_on: list[str] = field(default_factory=list)


@dataclass
class Manifest:
    name: str
    version: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    preprocessing: Preprocessing
    labels_file: str  # file name inside the store (JSON list of class names); "labels" in the JSON
    variants: list[Variant]
    source: dict[str, Any] = field(default_factory=dict)  # arch / onnx path / weights package
    quantization: dict[str, Any] = field(default_factory=dict)
    calibration_size: int = 0
    validation_size: int = 0
    validation: dict[str, Any] = field(default_factory=dict)  # the accuracy-gate report
    tools: dict[str, str] = field(default_factory=dict)  # onnx / onnxruntime / torch versions
    created: str = ""
    build_seconds: float = 0.0
    schema_version: int = SCHEMA_VERSION
    task: str = "classification"  # one of TASKS; a manifest without the key is a classifier
    detection: DetectionSpec | None = None  # set for task "detection"
    root: Path | None = field(default=None, compare=False, repr=False)  # folder it was loaded from

    # ----------------------------------------------------------------------------------- (de)serialise

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("root", None)
        # "labels" in the JSON (the name); the attribute is labels_file next to labels().
        return {("labels" if k == "labels_file" else k): v for k, v in data.items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any], root: Path | None = None) -> Manifest:
        try:
            return cls(
                name=data["name"],
                version=data["version"],
                inputs=[_from_dict(TensorSpec, t) for t in data.get("inputs", [])],
                outputs=[_from_dict(TensorSpec, t) for t in data.get("outputs", [])],
                preprocessing=_from_dict(Preprocessing, data.get("preprocessing", {})),
                labels_file=str(data.get("labels", "labels.json")),
                variants=[_from_dict(Variant, v) for v in data["variants"]],
                source=dict(data.get("source", {})),
                quantization=dict(data.get("quantization", {})),
                calibration_size=int(data.get("calibration_size", 0)),
                validation_size=int(data.get("validation_size", 0)),
                validation=dict(data.get("validation", {})),
                tools=dict(data.get("tools", {})),
                created=str(data.get("created", "")),
                build_seconds=float(data.get("build_seconds", 0.0)),
                schema_version=int(data.get("schema_version", SCHEMA_VERSION)),
                task=_task(data.get("task", "classification")),
                detection=_from_dict(DetectionSpec, data["detection"])
                if isinstance(data.get("detection"), dict)
                else None,
                root=root,
            )
        except KeyError as exc:
            raise ManifestError(f"malformed manifest: missing key {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            raise ManifestError(f"malformed manifest: {exc}") from None

    @property
    def is_detector(self) -> bool:
        return self.task == "detection"

    @classmethod
    def load(cls, folder: Path | str) -> Manifest:
        """Read `<folder>/manifest.json` (also accepts the manifest file itself)."""
        path = Path(folder)
        if path.is_dir() or path.suffix != ".json":  # a folder, or the name of one that is missing
            path = path / MANIFEST_FILE
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (FileNotFoundError, NotADirectoryError):
            raise ManifestError(
                f"no model store at {path.parent} (missing {MANIFEST_FILE}; run 'edgeinfer model build')"
            ) from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ManifestError(f"cannot read {path}: {exc}") from None
        if not isinstance(data, dict):
            raise ManifestError(f"malformed manifest {path}: not a JSON object")
        try:
            return cls.from_dict(data, root=path.parent)
        except ManifestError as exc:
            raise ManifestError(f"{path}: {exc}") from None

    def save(self, folder: Path | str | None = None) -> Path:
        """Write `manifest.json` atomically (temp file in the same folder, then rename)."""
        target_dir = Path(folder) if folder is not None else self.root
        if target_dir is None:
            raise ValueError("Manifest.save needs a folder")
        target = target_dir / MANIFEST_FILE
        atomic_write(target, (json.dumps(self.to_dict(), indent=2) + "\n").encode("utf-8"))
        self.root = target_dir
        return target

    # ------------------------------------------------------------------------------------------- access

    def _root(self) -> Path:
        if self.root is None:
            raise ValueError("manifest has no root folder (load it with Manifest.load or save it first)")
        return self.root

    def variant_for(self, provider: str, host: str | None = None) -> Variant:
        """The first variant that lists `provider` (an ORT execution provider name) and does not
        saturate on `host` (a host class such as edgeinfer.procfs.SATURATING_INT8)."""
        for variant in self.variants:
            if provider in variant.providers and (host is None or host not in variant.saturates_on):
                return variant
        raise ManifestError(
            f"model store {self.name} {self.version} has no variant for {provider} "
            f"(has: {', '.join(v.name or v.file for v in self.variants)})"
        )

    def variant(self, name: str) -> Variant:
        """The variant called `name` ("fp32", "int8-cpu", "int8-tensorrt") or whose file is `name`."""
        for variant in self.variants:
            if name in (variant.name, variant.file):
                return variant
        raise ManifestError(f"model store {self.name} {self.version} has no variant {name!r}")

    @property
    def fp32(self) -> Variant:
        for variant in self.variants:
            if variant.precision == "fp32":
                return variant
        raise ManifestError(f"model store {self.name} {self.version} has no FP32 variant")

    def path(self, variant: Variant | str) -> Path:
        """Absolute path of a variant's file (or of any file name inside the store)."""
        name = variant.file if isinstance(variant, Variant) else variant
        return self._root() / name

    def labels_path(self) -> Path:
        return self._root() / self.labels_file

    def labels(self) -> list[str]:
        """Class names, index = class id. JSON list, or plain text with one label per line."""
        path = self.labels_path()
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ManifestError(f"cannot read labels {path}: {exc}") from None
        if path.suffix == ".json":
            data = json.loads(text)
            if not isinstance(data, list):
                raise ManifestError(f"labels {path} is not a JSON list")
            return [str(x) for x in data]
        return [line.strip() for line in text.splitlines() if line.strip()]

    def verify(self) -> None:
        """Check every variant's size and sha256 (and that the labels exist); raise ManifestError."""
        root = self._root()
        if not (root / self.labels_file).is_file():
            raise ManifestError(f"model store {root}: labels file {self.labels_file} is missing")
        for variant in self.variants:
            path = root / variant.file
            if not path.is_file():
                raise ManifestError(f"model store {root}: {variant.file} is missing")
            size = path.stat().st_size
            if size != variant.bytes:
                raise ManifestError(
                    f"model store {root}: {variant.file} has {size} bytes, manifest says {variant.bytes}"
                )
            if sha256_file(path) != variant.sha256:
                raise ManifestError(f"model store {root}: {variant.file} does not match its sha256")
