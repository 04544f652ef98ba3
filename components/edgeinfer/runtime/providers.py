"""Execution-provider planning: which providers to ask ONNX Runtime for, with which options.

Pure functions over plain values so every decision is unit-tested without a GPU:

- `provider_attempts` — the order to try (configuration order, filtered to what this ORT build has);
- `plan_for` — the `providers=` list and per-provider options for one attempt;
- `trt_cache_key` — the TensorRT engine/timing cache key: model hash, ORT and TensorRT versions, GPU,
  profile shapes, precisions and builder settings (an engine built for another of these is invalid
  or not what the configuration asks for, and ORT names its engine files by none of the versions or
  builder settings, so it would load it anyway; without a stable cache folder TRT would rebuild at
  every start);
- `serving_provider` — what really runs, the one rule the runtime and the installer's verify step
  share: ORT falls back silently when CUDA/TensorRT libraries fail to load, so the session's own
  `get_providers()` is the first truth (`loaded_provider`); for TensorRT `tensorrt_backed` asks more
  (an engine in the cache), since ORT lists TensorRT even when it took no node;
- `preload_gpu_libraries` — loads the CUDA and cuDNN of the `nvidia-*` wheels before the first GPU
  session, since nothing else points ORT's pip build at them (and TensorRT's, from its wheel).

`PlatformInfo.detect()` gathers the versions and the GPU name cheaply (no subprocess).
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import hashlib
import importlib
import importlib.metadata
import io
import json
import logging
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from edgeinfer import procfs
from edgeinfer.runtime.config import RuntimeConfig, normalize_provider

log = logging.getLogger(__name__)

TRT = "TensorrtExecutionProvider"
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
SHORT_NAMES = {TRT: "tensorrt", CUDA: "cuda", CPU: "cpu"}


@dataclass(frozen=True)
class PlatformInfo:
    ort_version: str
    trt_version: str = "none"
    gpu_name: str = "none"
    available: tuple[str, ...] = (CPU,)
    int8_host: str | None = None  # procfs.SATURATING_INT8 where U8S8 kernels saturate, else None

    @classmethod
    def detect(cls) -> PlatformInfo:
        import onnxruntime as ort

        available = tuple(ort.get_available_providers())
        gpu = trt = "none"
        if TRT in available or CUDA in available:
            gpu = detect_gpu_name()
        if TRT in available:
            trt = detect_trt_version()
        return cls(
            ort_version=ort.__version__,
            trt_version=trt,
            gpu_name=gpu,
            available=available,
            int8_host=procfs.saturating_int8_here(),
        )


def detect_trt_version() -> str:
    """TensorRT's version from its Python/lib wheels, or the Jetson/Debian header; `unknown` if none."""
    for dist in (
        "tensorrt",
        "tensorrt-cu13",
        "tensorrt-cu13-libs",
        "tensorrt-cu12",
        "tensorrt-cu12-libs",
        "tensorrt-libs",
        "tensorrt-cu11",
    ):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    for header in glob.glob("/usr/include/*/NvInferVersion.h") + glob.glob("/usr/include/NvInferVersion.h"):
        try:
            text = open(header, encoding="utf-8", errors="replace").read()  # noqa: SIM115
        except OSError:
            continue
        parts = [re.search(rf"#define NV_TENSORRT_{k} (\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
        if all(parts):
            return ".".join(m.group(1) for m in parts if m)
    libs = sorted(glob.glob("/usr/lib/*/libnvinfer.so.*"))
    return os.path.basename(libs[-1]).removeprefix("libnvinfer.so.") if libs else "unknown"


def detect_gpu_name() -> str:
    """The GPU model from the NVIDIA driver's procfs (or the Jetson device tree); `unknown` if none."""
    for info in sorted(glob.glob("/proc/driver/nvidia/gpus/*/information")):
        try:
            for line in open(info, encoding="utf-8", errors="replace"):  # noqa: SIM115
                if line.startswith("Model:"):
                    return line.split(":", 1)[1].strip()
        except OSError:
            continue
    try:
        with open("/proc/device-tree/model", encoding="utf-8", errors="replace") as fh:
            return fh.read().strip("\x00 \n")
    except OSError:
        return "unknown"


# --------------------------------------------------------------------------------------------- plans


def provider_attempts(order: Sequence[str], available: Sequence[str]) -> tuple[list[str], list[str]]:
    """The providers worth trying, in order, and a note for each one skipped. CPU is always last."""
    tried: list[str] = []
    skipped: list[str] = []
    for raw in order:
        name = normalize_provider(raw)
        if name in tried:
            continue
        if name not in available:
            skipped.append(f"{name}: not in this ONNX Runtime build")
            continue
        tried.append(name)
    if CPU not in tried:
        tried.append(CPU)
    return tried, skipped


def profile_shapes(input_name: str, max_batch: int, size: int) -> dict[str, str]:
    """`trt_profile_min/opt/max_shapes` for a dynamic batch at a fixed common image size."""

    def shape(n: int) -> str:
        return f"{input_name}:{n}x{size}x{size}x3"

    return {
        "trt_profile_min_shapes": shape(1),
        "trt_profile_opt_shapes": shape(max_batch),
        "trt_profile_max_shapes": shape(max_batch),
    }


def trt_cache_key(
    *,
    model_sha256: str,
    ort_version: str,
    trt_version: str,
    gpu_name: str,
    profiles: dict[str, str],
    fp16: bool,
    int8: bool,
    builder: dict[str, Any] | None = None,
) -> str:
    """`builder`: the build settings that change the engine but not ORT's file name for it
    (optimisation level, workspace)."""
    doc = {
        "model": model_sha256,
        "ort": ort_version,
        "trt": trt_version,
        "gpu": gpu_name,
        "profiles": profiles,
        "fp16": fp16,
        "int8": int8,
        "builder": builder or {},
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:20]


@dataclass
class ProviderPlan:
    """One attempt: the provider we want, what to pass to InferenceSession, and the cache folder."""

    wanted: str
    providers: list[str]
    provider_options: list[dict[str, Any]]
    cache_dir: str | None = None
    io_binding: bool = False
    notes: list[str] = field(default_factory=list)


def plan_for(
    wanted: str,
    cfg: RuntimeConfig,
    *,
    platform: PlatformInfo,
    model_sha256: str,
    quantized: bool,
    input_name: str,
    input_size: int,
    work_dir: str,
) -> ProviderPlan:
    """Providers and options for a session that should run on `wanted`.

    TensorRT gets CUDA and then the CPU behind it for the nodes it does not take; CUDA gets the CPU.
    """
    if wanted == TRT:
        t = cfg.tensorrt
        shapes = profile_shapes(input_name, cfg.max_batch_size, input_size)
        int8 = bool(t.trt_int8_enable and quantized)  # QDQ models quantize explicitly; FP32 would
        key = trt_cache_key(  # need a calibration table
            model_sha256=model_sha256,
            ort_version=platform.ort_version,
            trt_version=platform.trt_version,
            gpu_name=platform.gpu_name,
            profiles=shapes,
            fp16=t.trt_fp16_enable,
            int8=int8,
            builder={
                "trt_builder_optimization_level": t.trt_builder_optimization_level,
                "trt_max_workspace_size": t.trt_max_workspace_size,
            },
        )
        cache_dir = os.path.join(work_dir, "trt-cache", key)
        trt_opts: dict[str, Any] = {
            "device_id": t.device_id,
            "trt_fp16_enable": t.trt_fp16_enable,
            "trt_int8_enable": int8,
            "trt_engine_cache_enable": t.trt_engine_cache_enable,
            "trt_engine_cache_path": cache_dir,
            "trt_timing_cache_enable": t.trt_timing_cache_enable,
            "trt_timing_cache_path": cache_dir,
            "trt_max_workspace_size": t.trt_max_workspace_size,
            "trt_builder_optimization_level": t.trt_builder_optimization_level,
            "trt_cuda_graph_enable": t.trt_cuda_graph_enable,
            **shapes,
        }
        return ProviderPlan(
            wanted,
            [TRT, CUDA, CPU],
            [trt_opts, cuda_options(cfg), {}],
            cache_dir=cache_dir,
            io_binding=cfg.cuda_io_binding,
        )
    if wanted == CUDA:
        return ProviderPlan(wanted, [CUDA, CPU], [cuda_options(cfg), {}], io_binding=cfg.cuda_io_binding)
    if wanted == CPU:
        return ProviderPlan(wanted, [CPU], [{}])
    return ProviderPlan(wanted, [wanted, CPU], [{}, {}])


def cuda_options(cfg: RuntimeConfig) -> dict[str, Any]:
    c = cfg.cuda
    return {
        "device_id": c.device_id,
        "cudnn_conv_algo_search": c.cudnn_conv_algo_search,
        "do_copy_in_default_stream": c.do_copy_in_default_stream,
    }


def session_options(cfg: RuntimeConfig, wanted: str, *, threads: int = 0) -> Any:
    """ORT SessionOptions: all graph optimisations, threads sized to the cores (or `threads`: a
    lane's session), spinning as `cfg.cpu` says (by default only inside a Run, and only with lanes)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.intra_op_num_threads = (threads or cfg.intra_op_threads()) if wanted == CPU else 1
    so.inter_op_num_threads = 1
    # Spinning only where lanes take the load: with one lane the whole session runs under load too,
    # and its pool would spin against the decode workers.
    spin = "1" if cfg.cpu.allow_spinning and cfg.cpu_lanes() > 1 else "0"
    so.add_session_config_entry("session.intra_op.allow_spinning", spin)
    so.add_session_config_entry("session.inter_op.allow_spinning", spin)
    so.add_session_config_entry("session.force_spinning_stop", "1" if cfg.cpu.force_spinning_stop else "0")
    so.log_severity_level = 3
    return so


def apply_process_options(cfg: RuntimeConfig) -> None:
    """Process-wide settings for a process that decodes and runs a model (the runtime, the router, a
    benchmark's edge): OpenCV's own pool off (decode runs on our workers), and how long a Python
    thread may hold the GIL — the engine thread needs it back as soon as ONNX Runtime returns, and
    the default 5 ms is a whole batch; measured in `bench offload`, a router left at the defaults
    spent 4.7 ms (p50) on a 1.6 ms decode."""
    import sys

    import cv2

    cv2.setNumThreads(cfg.opencv_threads)
    sys.setswitchinterval(cfg.python_switch_interval_us / 1e6)


# What was loaded, once per process (per module, so that tests can bring their own).
_ORT_PRELOADED: dict[Any, str] = {}
_TRT_PRELOADED: dict[Any, str] = {}


def first_line(exc: BaseException, limit: int = 200) -> str:
    """An exception as one line for a log or an attempt: its message's first line (ORT's run on over
    several), else its type's name."""
    lines = str(exc).strip().splitlines()
    return lines[0][:limit] if lines else type(exc).__name__


def ort_session(path: str, so: Any, providers: list[str], options: list[dict[str, Any]]) -> Any:
    """An ORT session without ORT's own Python fallback, which remakes a TensorRT session whose
    creation or run raises on CUDA (the TensorRT variant, default CUDA options) and any other on the
    CPU, its reason only on stdout: `enable_fallback=0` makes a failed creation raise (a release
    without the keyword ignores it, and `get_providers()` then shows the remade session),
    `disable_fallback()` makes a failed run raise. The runtime's engine and the installer's
    verification make every session with it."""
    import onnxruntime as ort

    session = ort.InferenceSession(
        path, sess_options=so, providers=providers, provider_options=options, enable_fallback=0
    )
    session.disable_fallback()
    return session


def _preload_dlls(ort_module: Any) -> str:
    preload = getattr(ort_module, "preload_dlls", None)
    if preload is None:
        return "no preload_dlls in this ONNX Runtime: CUDA and cuDNN come from the loader path"
    said = io.StringIO()  # preload_dlls reports on stdout, which is the component's log
    try:
        with contextlib.redirect_stdout(said):
            preload()
    except Exception as exc:
        return f"preload_dlls failed: {first_line(exc)}"
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in said.getvalue().splitlines()]
    lines = [line for line in lines if line]
    return "CUDA and cuDNN preloaded" if not lines else "preload_dlls: " + "; ".join(lines)[:300]


TRT_LIBRARIES = ("libnvinfer.so", "libnvinfer_plugin.so", "libnvonnxparser.so")


def _load_tensorrt_libs(import_module: Callable[[str], Any], load: Callable[[str], Any]) -> str:
    """The wheel's package loads its libraries when imported; loading the ones the TensorRT provider
    links once more by path costs nothing and does not depend on how the wheel does it."""
    try:
        package = import_module("tensorrt_libs")
        folders = list(getattr(package, "__path__", []))
        loaded = []
        for stem in TRT_LIBRARIES:
            for path in sorted(glob.glob(os.path.join(folders[0], stem + ".*")) if folders else []):
                if re.search(r"\.so\.\d+$", path):
                    load(path)
                    loaded.append(os.path.basename(path))
    except ModuleNotFoundError:
        return "TensorRT from the loader path (no tensorrt_libs wheel)"
    except Exception as exc:  # a wheel for another CUDA, a broken install: say so, ORT decides
        return f"tensorrt_libs failed to load: {first_line(exc)}"
    return f"TensorRT from the tensorrt_libs wheel ({', '.join(loaded) or 'no libraries found'})"


def preload_gpu_libraries(
    order: Sequence[str],
    ort_module: Any = None,
    import_module: Callable[[str], Any] = importlib.import_module,
    load: Callable[[str], Any] = ctypes.CDLL,
) -> str | None:
    """Load CUDA and cuDNN (and TensorRT, when asked) for ORT's GPU providers, once per process; a
    note for the log, or None when `order` asks for no GPU provider.

    `onnxruntime-gpu[cuda,cudnn]` (what the installer asks for) brings them as `nvidia-*` wheels, but
    the provider libraries carry no RUNPATH to them: unless they are loaded first (`preload_dlls`,
    ORT >= 1.21) or on the loader path, the CUDA provider fails to load and ORT runs on the CPU.
    Where the libraries come from the system (JetPack, a CUDA install) this finds them there too.
    TensorRT's pip wheel (`tensorrt-cuNN-libs`, package `tensorrt_libs`) is the same case for the
    libnvinfer that the TensorRT provider links.
    """
    wanted = {normalize_provider(p) for p in order}
    if not wanted & {TRT, CUDA}:
        return None
    if ort_module is None:
        import onnxruntime

        ort_module = onnxruntime
    if ort_module not in _ORT_PRELOADED:
        _ORT_PRELOADED[ort_module] = _preload_dlls(ort_module)
        log.info("GPU libraries: %s", _ORT_PRELOADED[ort_module])
    note = _ORT_PRELOADED[ort_module]
    if TRT in wanted:
        if import_module not in _TRT_PRELOADED:
            _TRT_PRELOADED[import_module] = _load_tensorrt_libs(import_module, load)
            log.info("GPU libraries: %s", _TRT_PRELOADED[import_module])
        note += "; " + _TRT_PRELOADED[import_module]
    return note


def loaded_provider(session_providers: Sequence[str], wanted: str) -> tuple[str, bool]:
    """(the provider that really runs the graph, whether it is the one we asked for)."""
    first = session_providers[0] if session_providers else CPU
    return first, first == wanted


ENGINE_SUFFIX = ".engine"
PROFILE_SUFFIX = ".profile"  # the profile shapes ORT built an engine for, beside it


def engine_files(cache_dir: str | None) -> dict[str, float]:
    """The TensorRT engines in an engine cache folder: file name → modification time."""
    if not cache_dir or not os.path.isdir(cache_dir):
        return {}
    found = {}
    for entry in os.scandir(cache_dir):
        if entry.is_file() and entry.name.endswith(ENGINE_SUFFIX):
            found[entry.name] = entry.stat().st_mtime
    return found


def remove_engines(cache_dir: str) -> list[str]:
    """Remove the TensorRT engines of an engine cache folder and their profile files; their names."""
    removed = []
    for entry in os.scandir(cache_dir):
        if entry.is_file() and entry.name.endswith((ENGINE_SUFFIX, PROFILE_SUFFIX)):
            os.unlink(entry.path)
            removed.append(entry.name)
    return sorted(removed)


# ORT's words when TensorRT cannot read an engine file of the cache.
UNREADABLE_ENGINE = "could not deserialize engine"


def tensorrt_backed(
    session_providers: Sequence[str], before: dict[str, float], after: dict[str, float]
) -> tuple[bool, str]:
    """Whether a session really runs on TensorRT, and why (or why not).

    `get_providers()` lists the providers a session registered, not the ones that took nodes: ORT
    lists TensorRT first when its library loaded even if the TensorRT parser refused every node (the
    graph then runs on CUDA), and lists CUDA first when libnvinfer failed to load. So a session is
    TensorRT-backed only when TensorRT is listed first AND its engine cache (`trt_engine_cache_path`,
    looked at `before` the session was made and `after` it ran) holds an engine: one built now, or a
    cached one reused (the cache folder is keyed by model, ORT, TensorRT, GPU, shapes and build settings).
    """
    first = session_providers[0] if session_providers else "no provider"
    if first != TRT:
        return False, f"ONNX Runtime fell back to {first}"
    if not after:
        return False, "TensorRT is listed first but built no engine (the engine cache stayed empty)"
    built = sorted(n for n in after if n not in before or after[n] != before[n])
    if built:
        return True, f"engine built: {', '.join(built)}"
    return True, f"engine reused from the cache: {', '.join(sorted(after))}"


def serving_provider(
    wanted: str,
    session_providers: Sequence[str],
    engines: tuple[dict[str, float], dict[str, float]] | None = None,
) -> tuple[str, bool, str]:
    """(the provider that really serves a session made for `wanted`, whether it is `wanted`, why).

    For TensorRT, `engines` is the engine cache (`engine_files`) before the session was made and
    after it ran once: TensorRT serves only when `tensorrt_backed` says so, else the provider listed
    after it (CUDA) runs the graph. `engines` None: the engine cache is off, so nothing can show an
    engine and the listing is all there is (said in `why`)."""
    first, ok = loaded_provider(session_providers, wanted)
    if not ok:
        return first, False, f"ONNX Runtime fell back to {first}"
    if wanted != TRT:
        return first, True, "loaded"
    if engines is None:
        return TRT, True, "loaded (engine cache off: whether TensorRT built an engine is not checked)"
    backed, why = tensorrt_backed(session_providers, *engines)
    if backed:
        return TRT, True, f"loaded ({why})"
    behind = [p for p in session_providers if p != TRT]
    return behind[0] if behind else CPU, False, why
