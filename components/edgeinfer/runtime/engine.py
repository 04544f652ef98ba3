"""The ONNX Runtime session: provider selection with fallback detection, warm-up, batched runs, top-k.

`Engine.create` tries the configured providers in order. For each it loads the manifest's variant
meant for that provider and asks `providers.serving_provider` what really serves it: when ORT fell
back silently (CUDA or TensorRT libraries missing), or lists TensorRT first although TensorRT built
no engine (after one run, the engine cache is still empty; its parser took no node and CUDA runs the
graph), that attempt is discarded and the next provider is tried with *its* variant — so the variant
that runs is always the one the manifest meant for the provider that really serves. What runs is
logged once at start and reported in every result (`provider`, `model.variant`).

ONNX Runtime's Python layer has a fallback of its own: a TensorRT session whose creation or run
raises is quietly remade on CUDA (the TensorRT variant, default CUDA options), and any other on the
CPU, with a banner on stdout. It is switched off for every session made here, so a failure is one
line in `attempts` and the next provider is tried as configured.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeinfer import postprocess
from edgeinfer.files import sha256_file
from edgeinfer.messages import Box, Detection, ModelRef, Prediction
from edgeinfer.model.manifest import Manifest, ManifestError, Variant
from edgeinfer.runtime.config import RuntimeConfig
from edgeinfer.runtime.providers import (
    CPU,
    CUDA,
    SHORT_NAMES,
    TRT,
    UNREADABLE_ENGINE,
    PlatformInfo,
    ProviderPlan,
    engine_files,
    first_line,
    ort_session,
    plan_for,
    preload_gpu_libraries,
    provider_attempts,
    remove_engines,
    serving_provider,
    session_options,
)

if TYPE_CHECKING:  # decode loads OpenCV, which an engine does not need
    from edgeinfer.runtime.decode import Letterbox

log = logging.getLogger(__name__)

SessionFactory = Callable[[str, Any, list[str], list[dict[str, Any]]], Any]


@dataclass(frozen=True)
class BackgroundLoad:
    """How a model built while other models serve spends the CPU (`edgeinfer bench models` measures
    it). Only its warm-up changes: the session is made, and later serves, exactly as any other.

    `pace`: after each warm-up run, idle for this many times the run's duration, so that the serving
    engines' batches find the cores free most of the time. `nice`: the warm-up's runs are made from a
    thread of their own at this much higher niceness, so that the scheduler prefers the serving
    engines' threads while both want a core (raising it needs no privilege; the thread ends with the
    warm-up, and the session's own pool threads, made before, keep the runtime's priority).
    `every_size`: warm up every batch size as at start; without it, on the CPU provider, batch 1
    only: ORT's CPU kernels pay their one-time cost on a session's very first run, and the first run
    of a larger batch measured no slower than its next ones (the GPU providers pay per shape: they
    warm up every size regardless). That load is far shorter and costs the serving models far less
    in all, but what is left of it is mostly the session's creation, at the runtime's priority, so
    the pinned model's p99 over the load's own span is worse (bench/results/README.md, `bench
    models`): the default keeps every size."""

    pace: float = 2.0
    nice: int = 19
    every_size: bool = True


_loading = threading.local()  # .settings: the BackgroundLoad of the load on this thread, if any


@contextlib.contextmanager
def background_load(settings: BackgroundLoad | None) -> Iterator[None]:
    """Engines built and warmed up on this thread inside the block follow `settings` (None: as at
    start). The model repository's loader wraps every load in it."""
    previous = loading_settings()
    _loading.settings = settings
    try:
        yield
    finally:
        _loading.settings = previous


def loading_settings() -> BackgroundLoad | None:
    """The settings of the `background_load` block this thread is in, if any."""
    settings: BackgroundLoad | None = getattr(_loading, "settings", None)
    return settings


class EngineError(Exception):
    """No provider could run the model (the message lists every attempt and why it failed)."""


@dataclass
class Attempt:
    provider: str
    outcome: str


@dataclass
class Engine:
    session: Any
    manifest: Manifest
    variant: Variant
    provider: str
    plan: ProviderPlan
    labels: list[str]
    input_name: str
    output_name: str
    input_size: int
    max_batch_size: int
    attempts: list[Attempt] = field(default_factory=list)
    apply_softmax: bool | None = None
    warmup_ms: dict[int, float] = field(default_factory=dict)
    executions: int = 0
    # CPU lanes (see RuntimeConfig.lanes): a one-thread session that up to `lanes` batches share at once.
    lane_session: Any = None
    lanes: int = 1
    gpu_libraries: str | None = None  # what preload_gpu_libraries said, when a GPU provider was asked
    # Every run at this batch size, padded (`cudaFixedBatch` on the CUDA provider); 0: as it comes.
    fixed_batch: int = 0
    # A detector's graph has two outputs (boxes, scores); `run` hands them back side by side.
    output_names: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._binding = self.session.io_binding() if self.plan.io_binding and self.provider != CPU else None
        self._thread = threading.local()  # .warm: this thread has run this engine

    # ------------------------------------------------------------------------------------------ create

    @classmethod
    def create(
        cls,
        manifest: Manifest,
        cfg: RuntimeConfig,
        work_dir: str,
        *,
        platform: PlatformInfo | None = None,
        session_factory: SessionFactory | None = None,
    ) -> Engine:
        platform = platform or PlatformInfo.detect()
        factory = session_factory or ort_session
        order, skipped = provider_attempts(cfg.execution_providers, platform.available)
        gpu_libraries = preload_gpu_libraries(order) if session_factory is None else None
        attempts = [Attempt(s.split(":")[0], s.split(": ", 1)[1]) for s in skipped]
        size = cfg.input_size or int(manifest.preprocessing.preferred_input[0])
        input_name = manifest.inputs[0].name if manifest.inputs else "input"
        labels = manifest.labels()
        for wanted in order:
            try:
                variant = _variant_for(manifest, wanted, platform.int8_host)
            except ManifestError:
                if wanted != CPU:
                    attempts.append(Attempt(wanted, "the model store has no variant for it"))
                    continue
                variant = manifest.fp32
            path = str(manifest.path(variant))
            plan = plan_for(
                wanted,
                cfg,
                platform=platform,
                model_sha256=variant.sha256 or sha256_file(Path(path)),
                quantized=variant.precision == "int8",
                input_name=input_name,
                input_size=size,
                work_dir=work_dir,
            )
            if plan.cache_dir:
                os.makedirs(plan.cache_dir, exist_ok=True)
            before = engine_files(plan.cache_dir)
            try:
                session = _new_session(factory, path, cfg, plan)
            except Exception as exc:  # ORT raises its own Fail/RuntimeException types
                attempts.append(Attempt(wanted, f"session creation failed: {first_line(exc, 300)}"))
                continue
            try:
                engines = _engines_after_a_run(session, wanted, cfg, plan, before=before, size=size)
            except Exception as exc:
                attempts.append(Attempt(wanted, f"its first run failed: {first_line(exc, 300)}"))
                del session
                continue
            really, ok, why = serving_provider(wanted, session.get_providers(), engines)
            if not ok:
                attempts.append(Attempt(wanted, why))
                del session
                continue
            attempts.append(Attempt(wanted, "loaded"))
            if why != "loaded":
                log.info("%s: %s", wanted, why)
            lanes = cfg.cpu_lanes() if really == CPU else 1
            lane_session = None
            if lanes > 1:
                try:
                    lane_session = factory(
                        path, session_options(cfg, wanted, threads=1), plan.providers, plan.provider_options
                    )
                except Exception as exc:
                    log.warning("no CPU lanes (one-thread session failed: %s)", first_line(exc, 300))
                    lanes = 1
            inputs = session.get_inputs()
            outputs = session.get_outputs()
            engine = cls(
                session=session,
                manifest=manifest,
                variant=variant,
                provider=really,
                plan=plan,
                labels=labels,
                input_name=inputs[0].name,
                output_name=outputs[0].name,
                input_size=size,
                max_batch_size=cfg.max_batch_size,
                attempts=attempts,
                apply_softmax=_softmax_hint(outputs[0].name),
                lane_session=lane_session,
                lanes=lanes,
                gpu_libraries=gpu_libraries,
                fixed_batch=cfg.max_batch_size if really == CUDA and cfg.cuda_fixed_batch else 0,
                output_names=[o.name for o in outputs] if manifest.is_detector else [outputs[0].name],
            )
            log.info(
                "inference runs on %s with model %s %s variant %s (%s)%s%s",
                really,
                manifest.name,
                manifest.version,
                variant.name or variant.file,
                variant.quant_format or variant.precision,
                f", {lanes} lanes under load" if lanes > 1 else "",
                "; not loaded: " + "; ".join(f"{a.provider}: {a.outcome}" for a in attempts[:-1])
                if len(attempts) > 1
                else "",
            )
            return engine
        raise EngineError(
            "no execution provider could run the model: "
            + "; ".join(f"{a.provider}: {a.outcome}" for a in attempts)
        )

    # --------------------------------------------------------------------------------------------- run

    @property
    def model_ref(self) -> ModelRef:
        return ModelRef(self.manifest.name, self.manifest.version, self.variant.name or self.variant.file)

    @property
    def detail(self) -> int:
        """The network's own input size (what survives the in-graph crop and resize)."""
        return int(self.manifest.preprocessing.size or self.input_size)

    @property
    def detector(self) -> bool:
        return self.manifest.is_detector

    @property
    def short_provider(self) -> str:
        return SHORT_NAMES.get(self.provider, self.provider)

    @property
    def thread_bound(self) -> bool:
        """The CUDA and TensorRT providers keep their handles (cuBLAS/cuDNN, execution contexts) per
        thread: the first run on a thread cost 3-6 ms more (H200), so the runtime runs their batches
        on engine threads that warmed themselves up."""
        return self.provider in (CUDA, TRT)

    def warm_thread(self) -> None:
        """One run on this thread, unless it has run this engine before."""
        if not getattr(self._thread, "warm", False):
            self.run(np.zeros((1, self.input_size, self.input_size, 3), dtype=np.uint8))

    def run(self, batch: np.ndarray, *, lane: bool = False) -> np.ndarray:
        """uint8 NHWC batch → class probabilities `[N, classes]` float32, or for a detector
        `[N, A, 4 + C]` (its boxes beside its scores; `detect` reads one row). `lane`: on the
        one-thread session, beside other lanes' batches (ORT sessions take concurrent runs)."""
        n = batch.shape[0]
        if self.fixed_batch and n > self.fixed_batch:  # a batch queued before an engine swap
            step = self.fixed_batch
            return np.concatenate([self.run(batch[i : i + step], lane=lane) for i in range(0, n, step)])
        if self.fixed_batch and n < self.fixed_batch:
            padded = np.zeros((self.fixed_batch, *batch.shape[1:]), dtype=batch.dtype)
            padded[:n] = batch
            batch = padded
        names = self.output_names or [self.output_name]
        if lane and self.lane_session is not None:
            outs = self.lane_session.run(names, {self.input_name: batch})
            with self._lock:
                self.executions += 1
        else:
            with self._lock:  # one IO binding, one run at a time on it
                if self._binding is not None:
                    self._binding.bind_cpu_input(self.input_name, batch)
                    for name in names:
                        self._binding.bind_output(name)
                    self.session.run_with_iobinding(self._binding)
                    outs = self._binding.copy_outputs_to_cpu()
                else:
                    outs = self.session.run(names, {self.input_name: batch})
                self.executions += 1
        self._thread.warm = True
        if self.detector:
            return np.concatenate([np.asarray(o, dtype=np.float32) for o in outs], axis=2)[:n]
        out = np.asarray(outs[0], dtype=np.float32).reshape(batch.shape[0], -1)[:n]
        if self.apply_softmax is None:
            self.apply_softmax = not _looks_like_probabilities(out)
        return postprocess.softmax(out) if self.apply_softmax else out

    def warm_up(
        self,
        max_batch: int | None = None,
        runs: int = 2,
        *,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ) -> dict[int, float]:
        """Run every batch size so the first real request meets a warm engine: batch 1 and the largest
        `runs` times (the first run of a shape is the slow one), the sizes between once. Inside
        `background_load`, paced (idle by `sleep`, runs timed by `clock`) and from a thread of lower
        priority (see `BackgroundLoad`)."""
        settings = loading_settings()
        if settings is None or settings.nice <= 0:
            return self._warm_up(max_batch, runs, settings, clock, sleep)
        out: dict[int, float] = {}
        failed: list[BaseException] = []

        def warm() -> None:
            _raise_niceness(settings.nice)
            try:
                out.update(self._warm_up(max_batch, runs, settings, clock, sleep))
            except BaseException as exc:  # handed to the caller's thread
                failed.append(exc)

        thread = threading.Thread(target=warm, name="edgeinfer-warm-up", daemon=True)
        thread.start()
        thread.join()
        if failed:
            raise failed[0]
        return out

    def _warm_up(
        self,
        max_batch: int | None,
        runs: int,
        settings: BackgroundLoad | None,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
    ) -> dict[int, float]:
        pace = settings.pace if settings is not None else 0.0
        top = max_batch or self.max_batch_size
        if settings is not None and not settings.every_size and self.provider == CPU:
            top = 1
        rng = np.random.default_rng(0)
        image = rng.integers(0, 256, (self.input_size, self.input_size, 3), dtype=np.uint8)
        if self.fixed_batch:  # every size is one shape: its first run is nobody's, or batch 1 looks slow
            self.run(image[None])
        for n in range(1, top + 1):
            batch = np.ascontiguousarray(np.broadcast_to(image, (n, *image.shape)))
            k = runs if n in (1, top) else 1
            took = 0.0
            for _ in range(k):
                start = clock()
                self.run(batch)
                end = clock()
                took += end - start
                _idle(pace * (end - start), sleep)
            self.warmup_ms[n] = took * 1000 / k
            if self.lane_session is not None:
                for _ in range(k):
                    start = clock()
                    self.run(batch, lane=True)
                    _idle(pace * (clock() - start), sleep)
        self.executions = 0
        return dict(self.warmup_ms)

    def top_k(self, probs: np.ndarray, k: int) -> list[Prediction]:
        return [Prediction(i, self.label(i), p) for i, p in postprocess.top_k(probs, k)]

    def label(self, index: int) -> str:
        return self.labels[index] if index < len(self.labels) else str(index)

    def detect(
        self,
        row: np.ndarray,
        *,
        max_detections: int | None = None,
        score_threshold: float | None = None,
        geometry: Letterbox | None = None,
    ) -> list[Detection]:
        """One image's row of `run` → its detections in the source image's pixels, best first.
        `geometry`: how the runtime letterboxed the image before the graph (None: it did not)."""
        spec = self.manifest.detection
        found = postprocess.detections(
            row[:, :4],
            row[:, 4:],
            score_threshold=score_threshold
            if score_threshold is not None
            else (spec.score_threshold if spec else 0.25),
            iou_threshold=spec.iou_threshold if spec else 0.45,
            max_detections=max_detections or (spec.max_detections if spec else 100),
            scale=geometry.scale if geometry else (1.0, 1.0),
            offset=geometry.offset if geometry else (0.0, 0.0),
            limit=geometry.limit if geometry else None,
        )
        return [
            Detection(
                d.index, self.label(d.index), d.score, Box(d.box.x_min, d.box.y_min, d.box.x_max, d.box.y_max)
            )
            for d in found
        ]

    def describe(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "variant": self.variant.name or self.variant.file,
            "model": f"{self.manifest.name} {self.manifest.version}",
            "input_size": self.input_size,
            "max_batch_size": self.max_batch_size,
            "lanes": self.lanes,
            "cache_dir": self.plan.cache_dir,
            "attempts": [f"{a.provider}: {a.outcome}" for a in self.attempts],
            "gpu_libraries": self.gpu_libraries,
            "fixed_batch": self.fixed_batch,
        }


def _idle(seconds: float, sleep: Callable[[float], None]) -> None:
    if seconds > 0:
        sleep(seconds)


def _raise_niceness(nice: int) -> None:
    """This thread's niceness up by `nice` (Linux schedules threads one by one)."""
    if hasattr(os, "setpriority"):
        try:
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + nice)
        except OSError as exc:
            log.debug("warm-up priority unchanged: %s", exc)


def _new_session(factory: SessionFactory, path: str, cfg: RuntimeConfig, plan: ProviderPlan) -> Any:
    """The session of one attempt. An engine in the TensorRT cache that TensorRT cannot read (cut
    short when the device lost power while ORT wrote it; built by another TensorRT whose version read
    the same) fails every start alike: its files are removed and the session made once more, which
    builds the engine anew."""

    def make() -> Any:
        return factory(path, session_options(cfg, plan.wanted), plan.providers, plan.provider_options)

    try:
        return make()
    except Exception as exc:
        if plan.wanted != TRT or not plan.cache_dir or UNREADABLE_ENGINE not in str(exc):
            raise
        removed = remove_engines(plan.cache_dir)
        if not removed:
            raise
        log.warning(
            "%s: removed the engine cache TensorRT cannot read (%s), building anew: %s",
            TRT,
            ", ".join(removed),
            first_line(exc, 300),
        )
        return make()


def _engines_after_a_run(
    session: Any, wanted: str, cfg: RuntimeConfig, plan: ProviderPlan, *, before: dict[str, float], size: int
) -> tuple[dict[str, float], dict[str, float]] | None:
    """For a TensorRT session, the engine cache before it was made and after one run; None for other
    providers, or with the cache off.

    With the profile shapes `plan_for` always passes (batch 1 to maxBatchSize), ORT builds the engine,
    or loads it from the cache, while it makes the session; the run makes sure of it where ORT defers
    the build to the first run of a shape, and a TensorRT that cannot run gives way to the next
    provider here rather than in the warm-up. A session that does not list TensorRT first is not
    run: nothing of it will serve."""
    if wanted != TRT or not cfg.tensorrt.trt_engine_cache_enable:
        return None
    if session.get_providers()[:1] != [TRT]:
        return before, engine_files(plan.cache_dir)
    name = session.get_inputs()[0].name
    session.run(None, {name: np.zeros((1, size, size, 3), dtype=np.uint8)})
    return before, engine_files(plan.cache_dir)


def _softmax_hint(output_name: str) -> bool | None:
    name = output_name.lower()
    if "prob" in name or "softmax" in name:
        return False
    if "logit" in name:
        return True
    return None


def _looks_like_probabilities(out: np.ndarray) -> bool:
    return bool(out.size and out.min() >= 0.0 and np.allclose(out.sum(axis=-1), 1.0, atol=1e-3))


def _variant_for(manifest: Manifest, provider: str, host: str | None) -> Variant:
    """The manifest's variant for `provider`; on the CPU, past one whose integer kernels saturate on
    this host (U8S8 on x86-64 without VNNI: its gate judged the exact arithmetic ARM and VNNI run)."""
    first = manifest.variant_for(provider)
    if provider != CPU or host is None or host not in first.saturates_on:
        return first
    chosen = manifest.variant_for(provider, host)
    log.info(
        "skipping model variant %s on this %s host (its int8 kernels saturate here); using %s",
        first.name or first.file,
        host,
        chosen.name or chosen.file,
    )
    return chosen


def stack(images: Sequence[np.ndarray]) -> np.ndarray:
    return np.ascontiguousarray(np.stack(images, axis=0))
