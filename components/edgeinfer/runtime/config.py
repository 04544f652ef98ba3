"""The runtime's configuration: plain dataclasses read by `edgeinfer.config` (recipe keys camelCase).

The dataclasses named after an ONNX Runtime option list hold only those options, under ORT's names
(`TensorrtOptions.trt_fp16_enable`, `CudaOptions.cudnn_conv_algo_search`, `CpuOptions` for the session
options of a CPU run); the runtime's own knobs (lanes, decode priority, CUDA IO binding, …) are
fields of `RuntimeConfig`. `RuntimeConfig.from_recipe` raises `ConfigError` with every refused key;
the component hands those reasons back to the nucleus when it validates a proposed change.

Which keys apply live and which need a new engine is decided by `engine_keys_changed`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from edgeinfer import config as reader
from edgeinfer.config import ConfigError, camel
from edgeinfer.limits import IPC_MAX_BYTES

__all__ = [
    "COMPONENT",
    "ENGINE_KEYS",
    "PROVIDER_ALIASES",
    "ConfigError",
    "CpuOptions",
    "CudaOptions",
    "ModelEntry",
    "PipelineEntry",
    "RuntimeConfig",
    "SourceConfig",
    "TensorrtOptions",
    "TimingsConfig",
    "camel",
    "default_recipe_configuration",
    "diff_keys",
    "engine_keys_changed",
]

COMPONENT = "com.edgeinfer.InferenceRuntime"

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
SOURCE_KINDS = ("none", "camera", "video", "stream", "folder")
RESULT_FORMATS = ("edgeinfer", "dlr")


def normalize_provider(name: str) -> str:
    """`tensorrt`/`cuda`/`cpu` (any case) or ORT's full provider name → ORT's full provider name."""
    return PROVIDER_ALIASES.get(name.strip().lower(), name.strip())


def is_known_provider(name: str) -> bool:
    """An execution provider this project can name (an alias or ORT's name; loading is another matter)."""
    return normalize_provider(name) in _KNOWN_PROVIDERS


@dataclass
class TensorrtOptions:
    """TensorRT execution provider options, ORT's names and nothing else (cache paths are filled in by
    the engine). Upstream list:
    https://onnxruntime.ai/docs/execution-providers/TensorRT-ExecutionProvider.html#configurations
    """

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
    """CUDA execution provider options, ORT's names and nothing else. `HEURISTIC` starts fast;
    `EXHAUSTIVE` benchmarks every conv. Upstream list:
    https://onnxruntime.ai/docs/execution-providers/CUDA-ExecutionProvider.html#configuration-options
    """

    cudnn_conv_algo_search: str = "HEURISTIC"
    do_copy_in_default_stream: bool = True
    device_id: int = 0

    def check(self) -> list[tuple[str, str]]:
        if self.cudnn_conv_algo_search not in ("EXHAUSTIVE", "HEURISTIC", "DEFAULT"):
            return [("cudnnConvAlgoSearch", "must be EXHAUSTIVE, HEURISTIC or DEFAULT")]
        return []


@dataclass
class CpuOptions:
    """ONNX Runtime session options of a CPU run and nothing else: `SessionOptions.intra_op_num_threads`
    (0 = one per usable core) and the session configuration entries `session.intra_op.allow_spinning`
    and `session.force_spinning_stop`. Upstream lists:
    https://onnxruntime.ai/docs/api/python/api_summary.html#sessionoptions and
    https://github.com/microsoft/onnxruntime/blob/main/include/onnxruntime/core/session/onnxruntime_session_options_config_keys.h
    """

    intra_op_num_threads: int = 0
    # Spinning between the layers of a run makes runs back to back faster, but a run after the machine
    # idled a moment gets slower (a spinning thread waits on a partner whose vCPU is asleep), and
    # sporadic requests are the common case on a device (bench/results/compare-spin.json). Off; with
    # force_spinning_stop the pool stops spinning when a run returns, so turning it on costs no core
    # between requests. It applies only with lanes (`cpu_lanes() > 1`): with one
    # lane the whole session also runs under load, beside the decode workers.
    allow_spinning: bool = False
    force_spinning_stop: bool = True

    def check(self) -> list[tuple[str, str]]:
        if self.intra_op_num_threads < 0:
            return [("intraOpNumThreads", "must be 0 (one per core) or positive")]
        return []


@dataclass
class SourceConfig:
    """A frame source beyond requests (the DLR component's UseCamera / ImageDirectory / InferenceInterval).

    `kind`: none | camera (`uri` = device index or path) | video (file or stream URL) | stream (an RTSP
    or HTTP stream URL: reconnected when lost) | folder.
    `rate_hz`: frames taken per second (latest frame wins; older frames are dropped and counted).
    `loop`: start a video file or folder again at its end.
    `name`: how results, frame ids and telemetry name it (empty: its kind, or `sourceN` in `sources`);
    `model`: the model (or pipeline) that serves its frames (empty: the default model).
    A camera or stream that is lost is opened again with exponential backoff up to `reconnect_max_s`.
    """

    kind: str = "none"
    uri: str = ""
    rate_hz: float = 1.0
    loop: bool = False
    top_k: int = 5
    result_topic: str = ""  # empty: edgeinfer/{thing}/result on local pub/sub
    publish_to_iot: bool = False
    name: str = ""
    model: str = ""
    reconnect_max_s: float = 3.0
    # Frames of this source served at once: with one, a source's rate is capped at one frame per
    # frame → result latency; a second frame overlaps the first's answer (never a stale one: a frame
    # is only taken at its tick).
    max_in_flight: int = 2

    def check(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if self.kind not in SOURCE_KINDS:
            out.append(("kind", f"must be one of {', '.join(SOURCE_KINDS)}"))
        elif self.kind != "none" and not self.uri:
            out.append(("uri", f"is required for kind {self.kind!r}"))
        if not 0 < self.rate_hz <= 1000:
            out.append(("rateHz", "must be above 0 and at most 1000"))
        if not 0.1 <= self.reconnect_max_s <= 3600:
            out.append(("reconnectMaxS", "must be from 0.1 to 3600"))
        if not 1 <= self.max_in_flight <= 16:
            out.append(("maxInFlight", "must be from 1 to 16"))
        return out


@dataclass
class ModelEntry:
    """One model the runtime serves (`models`): a store folder (`dir`) or a Greengrass model component
    (`component`, found by the `work/<component>/artifacts-path` its install step writes, and followed
    to its new versions). `pinned`: never evicted; `preload`: loaded at start, not on first use."""

    dir: str = ""
    component: str = ""
    pinned: bool = False
    preload: bool = False

    def check(self) -> list[tuple[str, str]]:
        if bool(self.dir) == bool(self.component):
            return [("", "give exactly one of dir and component")]
        if self.dir and not os.path.isabs(self.dir):
            return [("dir", f"{self.dir!r} must be an absolute path")]
        return []


@dataclass
class PipelineEntry:
    """One pipeline (`pipelines`, by the name a request's `model` gives): the `detector`'s boxes of
    `classes` (its labels; none: every class) scoring at least `min_score`, whose shorter side is at
    least `min_box_size` source pixels, are cropped (each side widened by `padding` times the box's
    side; the `max_crops` best of a frame) and classified by the `classifier`, answered as one result
    (docs/models.md, "Pipelines")."""

    detector: str = ""
    classifier: str = ""
    classes: list[str] = field(default_factory=list)
    min_score: float = 0.0
    min_box_size: int = 0
    padding: float = 0.0
    max_crops: int = 16

    def check(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if self.max_crops < 1:
            out.append(("maxCrops", "must be 1 or more"))
        for key, name in (("detector", self.detector), ("classifier", self.classifier)):
            if not name:
                out.append((key, "must name a model this runtime serves"))
        if not 0 <= self.min_score <= 1:
            out.append(("minScore", "must be from 0 to 1"))
        if self.min_box_size < 0:
            out.append(("minBoxSize", "must be 0 or more"))
        if not 0 <= self.padding <= 1:
            out.append(("padding", "must be from 0 to 1"))
        return out


@dataclass
class TimingsConfig:
    enabled: bool = True
    max_records: int = 32  # publish when this many records are waiting …
    flush_interval_ms: float = 250.0  # … or this long after the first one

    def check(self) -> list[tuple[str, str]]:
        if not 1 <= self.max_records <= 1000:
            return [("maxRecords", "must be from 1 to 1000")]
        return []


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
    # Several models served at once (see docs/models.md); empty: the one store above.
    models: list[ModelEntry] = field(default_factory=list)
    max_loaded_models: int = 0  # models loaded at once; 0: every one configured
    # Detect → crop → classify on the models above, each requested like a model by its name.
    pipelines: dict[str, PipelineEntry] = field(default_factory=dict)
    input_size: int = 0  # 0: the manifest's preferred input size
    max_batch_size: int = 8
    max_queue_delay_us: int = 2000
    max_queue_size: int = 64
    # Admission answers DEADLINE_EXCEEDED at once to a request with less time left than the full
    # batches admitted ahead of it take (at the engine's recent batch time): decoded, it would only
    # expire in the queue, after taking a decode worker's time from those that can still make it.
    admit_by_deadline: bool = True
    decode_threads: int = 2
    # Niceness of the decode workers (Linux, 0-19): with cores shared, a preempted ORT thread stalls
    # its partners at every layer; decode at a lower priority fills the gaps instead.
    decode_nice: int = 0
    # An unloaded runtime decodes, runs and answers a request on the thread it arrived on (no hand-offs).
    run_inline_when_idle: bool = True
    max_payload_bytes: int = 4 * 1024 * 1024
    max_image_pixels: int = 40_000_000
    min_image_side: int = 8
    default_deadline_ms: float = 0.0  # 0: no deadline unless the request sets one
    top_k: int = 5
    max_detections: int = 0  # detectors; 0: the model manifest's default
    score_threshold: float = 0.0  # detectors; 0: the model manifest's default
    result_format: str = "edgeinfer"
    # The largest IPC message a result may take, as framed (`edgeinfer.runtime.ipc_frame`); a larger
    # one is answered TOO_LARGE. Nucleus lite closes a component's whole IPC connection on a message
    # over its cap, which is the default; a deployment on the classic nucleus alone may raise it.
    max_ipc_message_bytes: int = IPC_MAX_BYTES
    subscribe_local: bool = True
    subscribe_iot: bool = True
    reply_to_topics: list[str] = field(default_factory=lambda: ["edgeinfer/{thing}/result/#"])
    image_folders: list[str] = field(default_factory=list)
    # Prefixes a request's `image_url` must start with (`s3://bucket/`, `https://host/path/`); none:
    # every image_url is refused. The runtime fetches what a sender names, so an operator says where.
    image_urls: list[str] = field(default_factory=list)
    tensorrt: TensorrtOptions = field(default_factory=TensorrtOptions)
    cuda: CudaOptions = field(default_factory=CudaOptions)
    # Run every batch on the CUDA provider through session.io_binding().
    cuda_io_binding: bool = True
    # Every batch on the CUDA provider runs at maxBatchSize, padded: ORT's CUDA provider spends far more
    # CPU on a run whose input shape differs from the previous run's, even for shapes warmed before,
    # than padding costs (bench/results/gpu-h200.json). TensorRT takes any shape in its profile
    # without that cost.
    cuda_fixed_batch: bool = True
    cpu: CpuOptions = field(default_factory=CpuOptions)
    # Batches run at once under load, each on one thread of its own session (what OpenVINO calls
    # streams): a one-thread run wastes no time at the parallel-for barriers, and a preempted thread
    # delays only its own batch. A batch that finds nothing else queued or running still gets every
    # thread (the latency path). The lanes' session is a second copy of the model in memory and is
    # warmed up too, which lengthens the start. 0: one lane per usable core; 1: off.
    lanes: int = 0
    # A batch at an idle runtime gets the whole session (every core) only while fewer than this share
    # of recent arrivals found work in flight; under load it takes a lane like any other. 1: always.
    full_session_max_contention: float = 0.25
    # The most requests a batch on one lane holds; 0: its share of maxBatchSize (8 over 2 lanes: 4).
    # On one thread an image costs about the same in a batch of 4 as of 8, and a batch of 8 makes
    # every request in it wait twice as long. A batch with every core may be full
    # (with one lane, every batch).
    lane_max_batch_size: int = 0
    opencv_threads: int = 1  # cv2.setNumThreads: decode runs on our own pool, not OpenCV's
    python_switch_interval_us: int = 500  # sys.setswitchinterval: hand the GIL back to the engine soon
    source: SourceConfig = field(default_factory=SourceConfig)
    # More frame sources, each as `source` (docs/sources.md); `source` is the first when set.
    sources: list[SourceConfig] = field(default_factory=list)
    # A source's frame waits up to this long for a frame of each other source on its model, to run
    # with them as one batch (one source on a model never waits); 0: every frame on its own.
    source_batch_window_ms: float = 50.0
    timings: TimingsConfig = field(default_factory=TimingsConfig)
    placement: dict[str, Any] = field(default_factory=dict)  # read by the placement policy, opaque here
    capture: dict[str, Any] = field(default_factory=dict)  # read by edgeinfer.capture, opaque here

    # ----------------------------------------------------------------------------------- recipe I/O

    @classmethod
    def from_recipe(cls, doc: Mapping[str, Any] | None) -> RuntimeConfig:
        """Build from the component's configuration (camelCase keys, either nucleus's typing).
        Raises ConfigError naming every refused key."""
        cfg = reader.read(cls, doc, component=COMPONENT)
        cfg.execution_providers = [normalize_provider(p) for p in cfg.execution_providers]
        return cfg

    def to_recipe(self) -> dict[str, Any]:
        """The recipe's DefaultConfiguration: every key but those whose default ships in the code."""
        doc = reader.to_recipe(self)
        for key in SHIPPED_IN_CODE:
            doc.pop(key, None)
        return doc

    def check(self) -> list[tuple[str, str]]:
        return [
            *self._check_providers(),
            *self._check_batching(),
            *self._check_images(),
            *self._check_answers(),
            *self._check_threads(),
            *self._check_paths(),
            *self._check_models(),
            *self._check_sources(),
        ]

    def _check_sources(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        names = [s.name for s in self.frame_sources()]
        if not 0 <= self.source_batch_window_ms <= 1000:
            out.append(("sourceBatchWindowMs", "must be from 0 (off) to 1000"))
        for i, entry in enumerate(self.sources):
            if entry.kind == "none":
                out.append((f"sources[{i}].kind", "must name a source (none is only for `source`)"))
        for name in sorted({n for n in names if names.count(n) > 1}):
            out.append(("sources", f"name {name!r} is used twice"))
        return out

    def frame_sources(self) -> list[SourceConfig]:
        """`source` (when set) and `sources`, each with its name (the default's filled in)."""
        out = [dataclasses.replace(self.source, name=self.source.name or self.source.kind)]
        out = out if self.source.kind != "none" else []
        for i, entry in enumerate(self.sources):
            out.append(dataclasses.replace(entry, name=entry.name or f"source{i}"))
        return out

    def _check_providers(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if not self.execution_providers:
            out.append(("executionProviders", "must name at least one provider"))
        for name in self.execution_providers:
            if not is_known_provider(name):
                out.append(("executionProviders", f"unknown provider {name!r}"))
        return out

    def _check_batching(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if not 1 <= self.max_batch_size <= 256:
            out.append(("maxBatchSize", "must be from 1 to 256"))
        if not 0 <= self.max_queue_delay_us <= 1_000_000:
            out.append(("maxQueueDelayUs", "must be from 0 to 1000000"))
        if self.max_queue_size < self.max_batch_size:
            out.append(("maxQueueSize", "must be at least maxBatchSize"))
        if not 1 <= self.decode_threads <= 64:
            out.append(("decodeThreads", "must be from 1 to 64"))
        if not 0 <= self.decode_nice <= 19:
            out.append(("decodeNice", "must be from 0 to 19"))
        return out

    def _check_images(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if self.max_payload_bytes < 1024:
            out.append(("maxPayloadBytes", "must be at least 1024"))
        if self.max_image_pixels < 64 * 64:
            out.append(("maxImagePixels", "must be at least 4096"))
        if not 1 <= self.min_image_side <= 4096:
            out.append(("minImageSide", "must be from 1 to 4096"))
        if self.input_size and not 16 <= self.input_size <= 4096:
            out.append(("inputSize", "must be 0 (from the manifest) or from 16 to 4096"))
        return out

    def _check_answers(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if self.default_deadline_ms < 0:
            out.append(("defaultDeadlineMs", "must be 0 (none) or positive"))
        if not 1 <= self.top_k <= 100:
            out.append(("topK", "must be from 1 to 100"))
        if not 0 <= self.max_detections <= 300:
            out.append(("maxDetections", "must be 0 (the model's) or from 1 to 300"))
        if not 0 <= self.score_threshold < 1:
            out.append(("scoreThreshold", "must be 0 (the model's) or a fraction below 1"))
        if self.result_format not in RESULT_FORMATS:
            out.append(("resultFormat", "must be 'edgeinfer' or 'dlr'"))
        if self.max_ipc_message_bytes < 1000:
            out.append(("maxIpcMessageBytes", "must be at least 1000"))
        return out

    def _check_threads(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if not 50 <= self.python_switch_interval_us <= 100_000:
            out.append(("pythonSwitchIntervalUs", "must be from 50 to 100000"))
        if not 0 <= self.lanes <= 64:
            out.append(("lanes", "must be from 0 (one per core) to 64"))
        if not 0 <= self.lane_max_batch_size <= 1024:
            out.append(("laneMaxBatchSize", "must be from 0 (the lane's share of maxBatchSize) to 1024"))
        if not 0 <= self.full_session_max_contention <= 1:
            out.append(("fullSessionMaxContention", "must be from 0 (never) to 1 (always)"))
        return out

    def _check_paths(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for topic in self.reply_to_topics:
            if not topic or "#" in topic[:-1]:
                out.append(("replyToTopics", f"{topic!r} is not a topic filter"))
        for folder in self.image_folders:
            if not os.path.isabs(folder):
                out.append(("imageFolders", f"{folder!r} must be an absolute path"))
        for prefix in self.image_urls:
            scheme, sep, rest = prefix.partition("://")
            if scheme not in ("s3", "https", "http") or not sep or not rest.split("/")[0]:
                out.append(
                    ("imageUrls", f"{prefix!r} is not an s3://, https:// or http:// prefix with a host")
                )
        return out

    def _check_models(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if self.max_loaded_models < 0:
            out.append(("maxLoadedModels", "must be 0 (every model) or positive"))
        pinned = sum(1 for m in self.models if m.pinned) + (0 if self.models and self.models[0].pinned else 1)
        if self.max_loaded_models and self.models and pinned > self.max_loaded_models:
            out.append(
                ("maxLoadedModels", f"is below the {pinned} models always loaded (the first and pinned)")
            )
        return out

    def cpu_lanes(self) -> int:
        """`lanes` resolved: 0 → one per usable core (see `intra_op_threads`)."""
        return self.lanes or self.intra_op_threads()

    def intra_op_threads(self) -> int:
        if self.cpu.intra_op_num_threads:
            return self.cpu.intra_op_num_threads
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except AttributeError:  # pragma: no cover - not Linux
            return max(1, os.cpu_count() or 1)


# Changing any of these means a new ONNX Runtime session (built and warmed off the hot path).
ENGINE_KEYS = frozenset(
    {
        "execution_providers",
        "model_dir",
        "input_size",
        "max_batch_size",
        "tensorrt",
        "cuda",
        "cuda_io_binding",
        "cuda_fixed_batch",
        "cpu",
        "lanes",
    }
)


def diff_keys(old: RuntimeConfig, new: RuntimeConfig) -> set[str]:
    """Top-level fields whose value changed."""
    return {f.name for f in dataclasses.fields(old) if getattr(old, f.name) != getattr(new, f.name)}


def engine_keys_changed(old: RuntimeConfig, new: RuntimeConfig) -> set[str]:
    """The changed `ENGINE_KEYS`: what needs a new engine."""
    return diff_keys(old, new) & ENGINE_KEYS


# Recipe keys whose default is only in the code (nucleus lite caps a recipe's size): `capture` is a
# whole node (docs/capture.md), empty unless a deployment merges one; so is `imageUrls`, and
# `maxIpcMessageBytes` is for the classic-only deployment that raises it. The `tensorrt` and `cuda`
# provider options read a merged node's missing keys as their defaults, so a deployment merging one
# key there gets what it got when the recipe carried the whole node. `pipelines` is empty unless a
# deployment merges one (docs/models.md).
SHIPPED_IN_CODE = frozenset({"capture", "imageUrls", "maxIpcMessageBytes", "tensorrt", "cuda", "pipelines"})


def default_recipe_configuration() -> dict[str, Any]:
    """The recipe's DefaultConfiguration (tests check the recipe file against this)."""
    return RuntimeConfig().to_recipe()
