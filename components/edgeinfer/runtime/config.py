"""The runtime's configuration: plain dataclasses, read from the recipe's camelCase keys.

Dataclass fields are named after the upstream setting they map to (ONNX Runtime provider options keep
ORT's names: `trt_fp16_enable`, `cudnn_conv_algo_search`, …); the recipe key of every field is its
camelCase form (`trt_fp16_enable` → `trtFp16Enable`, `max_queue_delay_us` → `maxQueueDelayUs`).
`from_recipe` never raises on user input: `validate` returns the reasons a configuration is refused,
which the component hands back to the nucleus through SubscribeToValidateConfigurationUpdates.

Which keys apply live and which need a new engine is decided by `engine_keys_changed`.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CPU_LIVE_KEYS",
    "ENGINE_KEYS",
    "PROVIDER_ALIASES",
    "CpuOptions",
    "CudaOptions",
    "RuntimeConfig",
    "SourceConfig",
    "TensorrtOptions",
    "TimingsConfig",
    "camel",
    "default_recipe_configuration",
    "diff_keys",
    "engine_keys_changed",
]

PROVIDER_ALIASES = {
    "tensorrt": "TensorrtExecutionProvider",
    "trt": "TensorrtExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "cpu": "CPUExecutionProvider",
}
_KNOWN_PROVIDERS = set(PROVIDER_ALIASES.values()) | {
    "OpenVINOExecutionProvider",
    "ROCMExecutionProvider",
    "MIGraphXExecutionProvider",
    "DmlExecutionProvider",
    "CoreMLExecutionProvider",
    "QNNExecutionProvider",
    "XnnpackExecutionProvider",
    "ACLExecutionProvider",
}
SOURCE_KINDS = ("none", "camera", "video", "folder")
RESULT_FORMATS = ("edgeinfer", "dlr")


def camel(name: str) -> str:
    """`max_queue_delay_us` → `maxQueueDelayUs`."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def normalize_provider(name: str) -> str:
    """`tensorrt`/`cuda`/`cpu` (any case) or ORT's full provider name → ORT's full provider name."""
    return PROVIDER_ALIASES.get(name.strip().lower(), name.strip())


def is_known_provider(name: str) -> bool:
    """An execution provider this project can name (an alias or ORT's name; loading is another matter)."""
    return normalize_provider(name) in _KNOWN_PROVIDERS


@dataclass
class TensorrtOptions:
    """TensorRT execution provider options (ORT's names). Cache paths are filled in by the engine."""

    trt_fp16_enable: bool = True
    trt_int8_enable: bool = True
    trt_engine_cache_enable: bool = True
    trt_timing_cache_enable: bool = True
    trt_max_workspace_size: int = 2 << 30
    trt_builder_optimization_level: int = 3
    trt_cuda_graph_enable: bool = False
    device_id: int = 0


@dataclass
class CudaOptions:
    """CUDA execution provider options. `HEURISTIC` starts fast; `EXHAUSTIVE` benchmarks every conv."""

    cudnn_conv_algo_search: str = "HEURISTIC"
    do_copy_in_default_stream: bool = True
    device_id: int = 0
    io_binding: bool = True  # not an ORT option: run through session.io_binding() on this provider
    # Not an ORT option: every batch on the CUDA provider runs at maxBatchSize, padded. ORT 1.31's
    # CUDA provider spent 190-250 ms of CPU on every run whose input shape differed from the previous
    # run's, even for shapes warmed before (H200, cuDNN 9), against 1.5 ms for batch 8 and 1.0 ms for
    # batch 1 at one shape. (TensorRT takes any shape in its profile without that cost.)
    fixed_batch: bool = True


@dataclass
class CpuOptions:
    """Session options for the CPU provider. `intra_op_num_threads` 0 = one per usable core."""

    intra_op_num_threads: int = 0
    # session.intra_op.allow_spinning and session.force_spinning_stop. Spinning between the layers of
    # a run took b1 on two threads from 6.4-7.0 to 4.6-5.5 ms back to back, but a run after the
    # machine idled a moment got slower (p75 8.4-9.3 -> 10-12 ms: a spinning thread waits on a
    # partner whose vCPU is asleep), and sporadic requests are the common case on a device. Off; with
    # force_spinning_stop the pool stops spinning when a run returns, so turning it on costs no core
    # between requests. It applies only with lanes (`cpu_lanes() > 1`): with one lane the whole
    # session also runs under load, beside the decode workers.
    allow_spinning: bool = False
    force_spinning_stop: bool = True
    opencv_threads: int = 1  # cv2.setNumThreads: decode runs on our own pool, not OpenCV's
    python_switch_interval_us: int = 500  # sys.setswitchinterval: hand the GIL back to the engine soon
    # Niceness of the decode workers (Linux, 0-19): with cores shared, a preempted ORT thread stalls
    # its partners at every layer; decode at a lower priority fills the gaps instead.
    decode_nice: int = 0
    # Batches run at once under load, each on one thread of its own session (what OpenVINO calls
    # streams): a one-thread run wastes no time at the parallel-for barriers, and a preempted thread
    # delays only its own batch. A batch that finds nothing else queued or running still gets every
    # thread (the latency path). The lanes' session is a second copy of the model in memory and is
    # warmed up too (start → RUNNING +~0.2 s here). 0: one lane per usable core; 1: off.
    lanes: int = 0
    # A batch at an idle runtime gets the whole session (every core) only while fewer than this share
    # of recent arrivals found work in flight; under load it takes a lane like any other. 1: always.
    full_session_max_contention: float = 0.25
    # The most requests a batch on one lane holds; 0: its share of maxBatchSize (8 over 2 lanes: 4).
    # On one thread an image costs the same in a batch of 4 as of 8 (4.97 vs 4.98 ms here), and a
    # batch of 8 makes every request in it wait twice as long. A batch with every core may be full
    # (with one lane, every batch).
    lane_max_batch_size: int = 0


@dataclass
class SourceConfig:
    """A frame source beyond requests (the DLR component's UseCamera / ImageDirectory / InferenceInterval).

    `kind`: none | camera (`uri` = device index or path) | video (file or stream URL) | folder.
    `rate_hz`: frames taken per second (latest frame wins; older frames are dropped and counted).
    `loop`: start a video file or folder again at its end.
    """

    kind: str = "none"
    uri: str = ""
    rate_hz: float = 1.0
    loop: bool = False
    top_k: int = 5
    result_topic: str = ""  # empty: edgeinfer/{thing}/result on local pub/sub
    publish_to_iot: bool = False


@dataclass
class TimingsConfig:
    enabled: bool = True
    max_records: int = 32  # publish when this many records are waiting …
    flush_interval_ms: float = 250.0  # … or this long after the first one


@dataclass
class RuntimeConfig:
    """Everything the recipe's DefaultConfiguration sets. See `default_recipe_configuration()`."""

    execution_providers: list[str] = field(
        default_factory=lambda: [
            "TensorrtExecutionProvider",
            "CUDAExecutionProvider",
            "CPUExecutionProvider",
        ]
    )
    model_dir: str = ""  # empty: the ModelStore artifacts folder passed on the command line
    input_size: int = 0  # 0: the manifest's preferred input size
    max_batch_size: int = 8
    max_queue_delay_us: int = 2000
    max_queue_size: int = 64
    decode_threads: int = 2
    # An unloaded runtime decodes, runs and answers a request on the thread it arrived on (no hand-offs).
    run_inline_when_idle: bool = True
    max_payload_bytes: int = 4 * 1024 * 1024
    max_image_pixels: int = 40_000_000
    min_image_side: int = 8
    default_deadline_ms: float = 0.0  # 0: no deadline unless the request sets one
    top_k: int = 5
    result_format: str = "edgeinfer"
    subscribe_local: bool = True
    subscribe_iot: bool = True
    reply_to_topics: list[str] = field(default_factory=lambda: ["edgeinfer/{thing}/result/#"])
    image_folders: list[str] = field(default_factory=list)
    tensorrt: TensorrtOptions = field(default_factory=TensorrtOptions)
    cuda: CudaOptions = field(default_factory=CudaOptions)
    cpu: CpuOptions = field(default_factory=CpuOptions)
    source: SourceConfig = field(default_factory=SourceConfig)
    timings: TimingsConfig = field(default_factory=TimingsConfig)
    placement: dict[str, Any] = field(default_factory=dict)  # read by the placement policy, opaque here

    # ----------------------------------------------------------------------------------- recipe I/O

    @classmethod
    def from_recipe(cls, doc: Any) -> tuple[RuntimeConfig, list[str]]:
        """Build from the component configuration (camelCase). Returns the config and the problems.

        Unknown keys are ignored (the nucleus also stores `accessControl` and the like there); values
        of the wrong type are reported and replaced by the default, so the result is always usable.
        """
        problems: list[str] = []
        cfg = _from_dict(cls, doc if isinstance(doc, dict) else {}, "", problems)
        assert isinstance(cfg, RuntimeConfig)
        cfg.execution_providers = [normalize_provider(p) for p in cfg.execution_providers]
        problems += cfg.validate()
        return cfg, problems

    def to_recipe(self) -> dict[str, Any]:
        return _to_dict(self)

    def validate(self) -> list[str]:
        out: list[str] = []
        if not self.execution_providers:
            out.append("executionProviders must name at least one provider")
        for name in self.execution_providers:
            if not is_known_provider(name):
                out.append(f"executionProviders: unknown provider {name!r}")
        if not 1 <= self.max_batch_size <= 256:
            out.append("maxBatchSize must be from 1 to 256")
        if not 0 <= self.max_queue_delay_us <= 1_000_000:
            out.append("maxQueueDelayUs must be from 0 to 1000000")
        if self.max_queue_size < self.max_batch_size:
            out.append("maxQueueSize must be at least maxBatchSize")
        if not 1 <= self.decode_threads <= 64:
            out.append("decodeThreads must be from 1 to 64")
        if self.max_payload_bytes < 1024:
            out.append("maxPayloadBytes must be at least 1024")
        if self.max_image_pixels < 64 * 64:
            out.append("maxImagePixels must be at least 4096")
        if not 1 <= self.min_image_side <= 4096:
            out.append("minImageSide must be from 1 to 4096")
        if self.input_size and not 16 <= self.input_size <= 4096:
            out.append("inputSize must be 0 (from the manifest) or from 16 to 4096")
        if self.default_deadline_ms < 0:
            out.append("defaultDeadlineMs must be 0 (none) or positive")
        if not 1 <= self.top_k <= 100:
            out.append("topK must be from 1 to 100")
        if self.result_format not in RESULT_FORMATS:
            out.append("resultFormat must be 'edgeinfer' or 'dlr'")
        if self.cuda.cudnn_conv_algo_search not in ("EXHAUSTIVE", "HEURISTIC", "DEFAULT"):
            out.append("cuda.cudnnConvAlgoSearch must be EXHAUSTIVE, HEURISTIC or DEFAULT")
        if not 50 <= self.cpu.python_switch_interval_us <= 100_000:
            out.append("cpu.pythonSwitchIntervalUs must be from 50 to 100000")
        if not 0 <= self.cpu.decode_nice <= 19:
            out.append("cpu.decodeNice must be from 0 to 19")
        if not 0 <= self.cpu.lanes <= 64:
            out.append("cpu.lanes must be from 0 (one per core) to 64")
        if not 0 <= self.cpu.lane_max_batch_size <= 1024:
            out.append("cpu.laneMaxBatchSize must be from 0 (the lane's share of maxBatchSize) to 1024")
        if not 0 <= self.cpu.full_session_max_contention <= 1:
            out.append("cpu.fullSessionMaxContention must be from 0 (never) to 1 (always)")
        if self.cpu.intra_op_num_threads < 0:
            out.append("cpu.intraOpNumThreads must be 0 (one per core) or positive")
        if self.source.kind not in SOURCE_KINDS:
            out.append(f"source.kind must be one of {', '.join(SOURCE_KINDS)}")
        elif self.source.kind != "none" and not self.source.uri:
            out.append(f"source.uri is required for source.kind {self.source.kind!r}")
        if not 0 < self.source.rate_hz <= 1000:
            out.append("source.rateHz must be above 0 and at most 1000")
        if not 1 <= self.timings.max_records <= 1000:
            out.append("timings.maxRecords must be from 1 to 1000")
        for topic in self.reply_to_topics:
            if not topic or "#" in topic[:-1]:
                out.append(f"replyToTopics: {topic!r} is not a topic filter")
        for folder in self.image_folders:
            if not os.path.isabs(folder):
                out.append(f"imageFolders: {folder!r} must be an absolute path")
        return out

    def cpu_lanes(self) -> int:
        """`cpu.lanes` resolved: 0 → one per usable core (see `intra_op_threads`)."""
        return self.cpu.lanes or self.intra_op_threads()

    def intra_op_threads(self) -> int:
        if self.cpu.intra_op_num_threads:
            return self.cpu.intra_op_num_threads
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except AttributeError:  # pragma: no cover - not Linux
            return max(1, os.cpu_count() or 1)


# Changing any of these means a new ONNX Runtime session (built and warmed off the hot path).
ENGINE_KEYS = frozenset(
    {"execution_providers", "model_dir", "input_size", "max_batch_size", "tensorrt", "cuda", "cpu"}
)


# `cpu` fields that never reach an ORT session: the process, the decode pool and the batcher take
# them live (`apply_process_options`, `InferenceServer.apply_config`).
CPU_LIVE_KEYS = frozenset(
    {
        "opencv_threads",
        "python_switch_interval_us",
        "decode_nice",
        "full_session_max_contention",
        "lane_max_batch_size",
    }
)


def diff_keys(old: RuntimeConfig, new: RuntimeConfig) -> set[str]:
    """Top-level fields whose value changed."""
    return {f.name for f in dataclasses.fields(old) if getattr(old, f.name) != getattr(new, f.name)}


def engine_keys_changed(old: RuntimeConfig, new: RuntimeConfig) -> set[str]:
    """The changed `ENGINE_KEYS`: what needs a new engine (a `cpu` change only when a session
    option changed, not for the keys in `CPU_LIVE_KEYS`)."""
    changed = diff_keys(old, new) & ENGINE_KEYS
    if "cpu" in changed:
        live = {k: getattr(new.cpu, k) for k in CPU_LIVE_KEYS}
        if dataclasses.replace(old.cpu, **live) == new.cpu:
            changed.discard("cpu")
    return changed


def default_recipe_configuration() -> dict[str, Any]:
    """The recipe's DefaultConfiguration (tests check the recipe file against this)."""
    return RuntimeConfig().to_recipe()


# ------------------------------------------------------------------------------------------ helpers


def _from_dict(cls: type[Any], doc: dict[str, Any], prefix: str, problems: list[str]) -> Any:
    kwargs: dict[str, Any] = {}
    defaults = cls()
    for f in dataclasses.fields(cls):
        key = camel(f.name)
        if key not in doc:
            continue
        value = doc[key]
        default = getattr(defaults, f.name)
        where = f"{prefix}{key}"
        if dataclasses.is_dataclass(default):
            if isinstance(value, dict):
                kwargs[f.name] = _from_dict(type(default), value, f"{where}.", problems)
            else:
                problems.append(f"{where} must be an object")
            continue
        coerced = _coerce(value, default)
        if coerced is _BAD:
            problems.append(f"{where} must be {_type_name(default)}, got {value!r}"[:200])
        else:
            kwargs[f.name] = coerced
    return cls(**kwargs)


_BAD = object()


def _coerce(value: Any, default: Any) -> Any:
    # The nucleus may hand numbers over as floats (JSON) and users write "true" in YAML strings.
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        return _BAD
    if isinstance(default, int):
        if isinstance(value, bool):
            return _BAD
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                return _BAD
        return _BAD
    if isinstance(default, float):
        if isinstance(value, bool):
            return _BAD
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                return _BAD
        return _BAD
    if isinstance(default, str):
        return value if isinstance(value, str) else _BAD
    if isinstance(default, list):
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
        return _BAD
    if isinstance(default, dict):
        return dict(value) if isinstance(value, dict) else _BAD
    return _BAD  # pragma: no cover


def _type_name(default: Any) -> str:
    for kind, name in ((bool, "true or false"), (int, "an integer"), (float, "a number")):
        if isinstance(default, kind):
            return name
    if isinstance(default, str):
        return "a string"
    if isinstance(default, list):
        return "a list of strings"
    return "an object"


def _to_dict(obj: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        out[camel(f.name)] = _to_dict(value) if dataclasses.is_dataclass(value) else value
    return out
