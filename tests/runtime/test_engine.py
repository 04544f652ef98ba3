"""The engine: which provider serves and with which variant (fake sessions stand in for a GPU's),
CPU lanes, IO binding and fixed GPU batches, and one real CPU engine."""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from edgeinfer import procfs
from edgeinfer.model.manifest import Manifest
from edgeinfer.runtime.config import RuntimeConfig
from edgeinfer.runtime.engine import Engine, EngineError
from edgeinfer.runtime.providers import CPU, CUDA, TRT, PlatformInfo
from tests.helpers.tiny_store import write_tiny_store
from tests.test_procfs import ALDER_LAKE, EPYC_AVX2, PI4, XEON_VNNI

GPU = PlatformInfo("1.20.0", "10.4.0", "NVIDIA H100", (TRT, CUDA, CPU))


NO_ENGINE = "no-engine"  # in `loads`: TensorRT is listed first, but its parser took no node


# What ORT's TensorRT provider names an engine in its cache folder: its fused node's name (graph,
# model hash, subgraph), the precision and the GPU's compute capability.
ENGINE = "TensorrtExecutionProvider_TRTKernel_graph_main_1234567890_0_0_fp16_sm90.engine"


class FakeSession:
    """Stands in for an ORT session on a GPU machine: `loads` says which providers really load; a
    TensorRT session writes an engine (and its .profile) into its cache folder as ORT's provider
    does — while the session is made when every dynamic input has profile shapes, else on its first
    run — unless `loads` holds NO_ENGINE (the fallback ORT does not report)."""

    def __init__(
        self, path: str, providers: list[str], loads: set[str], options: list[dict[str, Any]] | None = None
    ) -> None:
        self.path = path
        self.providers = [p for p in providers if p in loads] or [CPU]
        self.options = options or [{}]
        self.builds = NO_ENGINE not in loads
        self.first_runs: list[tuple[int, ...]] = []
        if "trt_profile_min_shapes" in self.options[0]:
            self._build()

    def _build(self) -> None:
        cache = self.options[0].get("trt_engine_cache_path")
        if self.providers[0] == TRT and self.builds and cache and not (Path(cache) / ENGINE).exists():
            (Path(cache) / ENGINE).write_bytes(b"engine")
            (Path(cache) / ENGINE.replace(".engine", ".profile")).write_bytes(b"profile")

    def get_providers(self) -> list[str]:
        return self.providers

    def run(self, names: Any, feed: dict[str, Any]) -> list[Any]:
        import numpy as np

        self.first_runs.append(next(iter(feed.values())).shape)
        self._build()
        return [np.zeros((1, 10), np.float32)]

    def get_inputs(self) -> list[Any]:
        return [type("I", (), {"name": "input"})()]

    def get_outputs(self) -> list[Any]:
        return [type("O", (), {"name": "logits"})()]

    def io_binding(self) -> None:
        return None


def factory(loads: set[str], calls: list[tuple[str, list[str], list[dict[str, Any]]]]) -> Callable[..., Any]:
    def make(path: str, so: Any, providers: list[str], options: list[dict[str, Any]]) -> FakeSession:
        calls.append((Path(path).name, providers, options))
        if "boom" in loads and providers[0] == TRT:
            raise RuntimeError("TensorRT EP failed to create: libnvinfer.so.10 not found")
        return FakeSession(path, providers, loads, options)

    return make


@pytest.mark.parametrize(
    ("loads", "provider", "variant", "tries"),
    [
        ({TRT, CUDA, CPU}, TRT, "int8-tensorrt", 1),
        ({CUDA, CPU}, CUDA, "fp32", 2),  # TRT fell back silently: retried with CUDA's variant
        ({TRT, NO_ENGINE, CUDA, CPU}, CUDA, "fp32", 2),  # listed first, built nothing: the same
        ({CPU}, CPU, "int8-cpu", 3),
        ({"boom", CUDA, CPU}, CUDA, "fp32", 2),  # TRT raised at creation
    ],
)
def test_variant_follows_the_provider_that_really_loaded(  # noqa: PLR0917
    tiny_store: Path, tmp_path: Path, loads: set[str], provider: str, variant: str, tries: int
) -> None:
    calls: list[tuple[str, list[str], list[dict[str, Any]]]] = []
    cfg = RuntimeConfig()
    cfg.lanes = 1  # count provider attempts only (lanes add a session, see below)
    engine = Engine.create(
        Manifest.load(tiny_store),
        cfg,
        str(tmp_path),
        platform=GPU,
        session_factory=factory(loads, calls),
    )
    assert engine.provider == provider
    assert engine.variant.name == variant
    assert len(calls) == tries
    assert engine.attempts[-1].outcome == "loaded"
    if provider != TRT:
        assert any(a.provider == TRT and a.outcome != "loaded" for a in engine.attempts)
    assert engine.model_ref.variant == variant


@pytest.mark.parametrize(
    ("cpuinfo", "machine", "variant"),
    [
        (EPYC_AVX2, "x86_64", "fp32"),  # U8S8 saturates here: the next CPU variant
        (XEON_VNNI, "x86_64", "int8-cpu"),
        (ALDER_LAKE, "x86_64", "int8-cpu"),
        (PI4, "aarch64", "int8-cpu"),
    ],
)
def test_cpu_variant_that_saturates_on_this_host_is_skipped(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    cpuinfo: str,
    machine: str,
    variant: str,
) -> None:
    store = write_tiny_store(tmp_path / "store")
    doc = json.loads((store / "manifest.json").read_text())
    for v in doc["variants"]:
        if v["name"] == "int8-cpu":
            v["saturates_on"] = [procfs.SATURATING_INT8]
    (store / "manifest.json").write_text(json.dumps(doc))
    host = procfs.int8_saturating_host(machine, cpuinfo)
    calls: list[tuple[str, list[str], list[dict[str, Any]]]] = []
    cfg = RuntimeConfig()
    cfg.lanes = 1
    with caplog.at_level(logging.INFO, "edgeinfer.runtime.engine"):
        engine = Engine.create(
            Manifest.load(store),
            cfg,
            str(tmp_path),
            platform=PlatformInfo("1.20.0", int8_host=host),
            session_factory=factory({CPU}, calls),
        )
    assert (engine.provider, engine.variant.name) == (CPU, variant)
    skipped = [r.getMessage() for r in caplog.records if "skipping model variant" in r.getMessage()]
    assert len(skipped) == (variant == "fp32")
    # A manifest without the field (older stores) loads, and its int8-cpu runs everywhere.
    old = Engine.create(
        Manifest.load(write_tiny_store(tmp_path / "old")),
        cfg,
        str(tmp_path),
        platform=PlatformInfo("1.20.0", int8_host=procfs.SATURATING_INT8),
        session_factory=factory({CPU}, calls),
    )
    assert old.variant.name == "int8-cpu"


@pytest.mark.parametrize(("loads", "lanes"), [({CPU}, 3), ({CUDA, CPU}, 1)])
def test_cpu_lanes_get_a_one_thread_session_of_the_same_variant(
    tiny_store: Path, tmp_path: Path, loads: set[str], lanes: int
) -> None:
    threads: list[int] = []
    calls: list[tuple[str, list[str], list[dict[str, Any]]]] = []
    make = factory(loads, calls)

    def spy(path: str, so: Any, providers: list[str], options: list[dict[str, Any]]) -> Any:
        threads.append(so.intra_op_num_threads)
        return make(path, so, providers, options)

    cfg = RuntimeConfig(execution_providers=[TRT, CUDA, CPU])
    cfg.lanes = 3
    cfg.cpu.intra_op_num_threads = 4
    engine = Engine.create(Manifest.load(tiny_store), cfg, str(tmp_path), platform=GPU, session_factory=spy)
    assert engine.lanes == lanes
    if lanes > 1:  # the CPU: its full session, then the lanes' one-thread session of the same file
        assert threads[-2:] == [4, 1]
        assert calls[-1][0] == calls[-2][0]
        assert engine.lane_session is not None
    else:  # a GPU provider runs one batch at a time
        assert engine.lane_session is None


def test_no_provider_loads_raises_with_reasons(tiny_store: Path, tmp_path: Path) -> None:
    cfg = RuntimeConfig(execution_providers=[TRT])
    with pytest.raises(EngineError, match="fell back"):
        Engine.create(
            Manifest.load(tiny_store),
            cfg,
            str(tmp_path),
            platform=PlatformInfo("1", "none", "none", (TRT, CPU)),
            session_factory=lambda path, so, providers, options: (
                (_ for _ in ()).throw(RuntimeError("cpu broken"))
                if providers == [CPU]
                else FakeSession(path, providers, {CPU})
            ),
        )


def test_real_cpu_engine(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(RuntimeConfig(max_batch_size=3))
    assert engine.provider == CPU
    assert engine.variant.name == "int8-cpu"
    assert sorted(engine.warmup_ms) == [1, 2, 3]
    assert engine.describe()["attempts"][-1] == f"{CPU}: loaded"


class FakeBinding:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.batch: Any = None

    def bind_cpu_input(self, name: str, array: Any) -> None:
        self.calls.append(f"in:{name}")
        self.batch = array

    def bind_output(self, name: str) -> None:
        self.calls.append(f"out:{name}")

    def copy_outputs_to_cpu(self) -> list[Any]:
        import numpy as np

        logits = np.zeros((self.batch.shape[0], 10), dtype=np.float32)
        logits[:, 3] = 5.0
        return [logits]


class BindingSession(FakeSession):
    def __init__(
        self, path: str, providers: list[str], loads: set[str], options: list[dict[str, Any]] | None = None
    ) -> None:
        super().__init__(path, providers, loads, options)
        self.binding = FakeBinding()
        self.runs = 0

    def io_binding(self) -> FakeBinding:  # type: ignore[override]
        return self.binding

    def run_with_iobinding(self, binding: FakeBinding) -> None:
        self.runs += 1


def test_cuda_runs_through_io_binding(tiny_store: Path, tmp_path: Path) -> None:
    import numpy as np

    sessions: list[BindingSession] = []

    def make(path: str, so: Any, providers: list[str], options: list[dict[str, Any]]) -> BindingSession:
        sessions.append(BindingSession(path, providers, {CUDA, CPU}))
        return sessions[-1]

    engine = Engine.create(
        Manifest.load(tiny_store), RuntimeConfig(), str(tmp_path), platform=GPU, session_factory=make
    )
    assert engine.provider == CUDA
    probs = engine.run(np.zeros((2, 32, 32, 3), dtype=np.uint8))
    session = sessions[-1]
    assert session.runs == 1
    assert session.binding.calls == ["in:input", "out:logits"]
    assert probs.shape == (2, 10)
    assert int(probs[0].argmax()) == 3
    assert abs(float(probs[0].sum()) - 1.0) < 1e-5  # logits → softmax


def test_gpu_batches_run_at_one_shape_on_warmed_threads(tiny_store: Path, tmp_path: Path) -> None:
    import threading

    import numpy as np

    sessions: list[BindingSession] = []

    def make(path: str, so: Any, providers: list[str], options: list[dict[str, Any]]) -> BindingSession:
        sessions.append(BindingSession(path, providers, {CUDA, CPU}))
        return sessions[-1]

    store = Manifest.load(tiny_store)
    engine = Engine.create(store, RuntimeConfig(), str(tmp_path), platform=GPU, session_factory=make)
    assert (engine.fixed_batch, engine.thread_bound) == (8, True)
    images = np.full((3, 32, 32, 3), 7, dtype=np.uint8)
    assert engine.run(images).shape == (3, 10)
    fed = sessions[-1].binding.batch
    assert fed.shape == (8, 32, 32, 3)  # padded to maxBatchSize: one input shape for every run
    assert (fed[:3] == 7).all()
    assert not fed[3:].any()

    # A thread's first run is its warm-up; the next warm_thread on it does nothing.
    engine.warm_thread()
    assert sessions[-1].runs == 1
    other = threading.Thread(target=engine.warm_thread)
    other.start()
    other.join()
    assert sessions[-1].runs == 2

    # A batch over the size (queued before an engine swap) runs in pieces of it.
    big = np.concatenate([images, images, images, images])
    assert engine.run(big).shape == (12, 10)
    assert sessions[-1].runs == 4
    assert sessions[-1].binding.batch.shape[0] == 8

    cfg = RuntimeConfig()
    cfg.cuda_fixed_batch = False
    loose = Engine.create(store, cfg, str(tmp_path), platform=GPU, session_factory=make)
    loose.run(images)
    assert (loose.fixed_batch, sessions[-1].binding.batch.shape[0]) == (0, 3)
    cpu = Engine.create(
        store, RuntimeConfig(), str(tmp_path), platform=PlatformInfo("1.20.0"), session_factory=make
    )
    assert (cpu.provider, cpu.fixed_batch, cpu.thread_bound) == (CPU, 0, False)

    # TensorRT takes any shape in its profile without a cost: not padded, but bound to its threads.
    def trt(path: str, so: Any, providers: list[str], options: list[dict[str, Any]]) -> BindingSession:
        return BindingSession(path, providers, {TRT, CUDA, CPU}, options)

    on_trt = Engine.create(store, RuntimeConfig(), str(tmp_path), platform=GPU, session_factory=trt)
    assert (on_trt.provider, on_trt.fixed_batch, on_trt.thread_bound) == (TRT, 0, True)


def test_tensorrt_that_built_no_engine_reports_cuda_and_runs_cudas_variant(
    tiny_store: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # As on the H200: ORT lists TensorRT first, its engine cache stays empty, CUDA runs the graph.
    calls: list[tuple[str, list[str], list[dict[str, Any]]]] = []
    cfg = RuntimeConfig()
    cfg.lanes = 1
    with caplog.at_level(logging.INFO, "edgeinfer.runtime.engine"):
        engine = Engine.create(
            Manifest.load(tiny_store),
            cfg,
            str(tmp_path),
            platform=GPU,
            session_factory=factory({TRT, NO_ENGINE, CUDA, CPU}, calls),
        )
    assert (engine.provider, engine.short_provider, engine.model_ref.variant) == (CUDA, "cuda", "fp32")
    assert [c[1][0] for c in calls] == [TRT, CUDA]
    assert calls[0][0] != calls[1][0]  # the TensorRT variant's file, then CUDA's
    described = engine.describe()
    assert described["provider"] == CUDA
    assert described["attempts"][0].startswith(f"{TRT}: TensorRT is listed first but built no engine")
    started = [r.getMessage() for r in caplog.records if r.getMessage().startswith("inference runs on")]
    assert len(started) == 1
    assert started[0].startswith(f"inference runs on {CUDA} ")
    assert "built no engine" in started[0]

    # Without CUDA in the order, the CPU serves next, with its own variant.
    only = RuntimeConfig(execution_providers=[TRT, CPU])
    only.lanes = 1
    cpu = Engine.create(
        Manifest.load(tiny_store),
        only,
        str(tmp_path / "cpu"),
        platform=GPU,
        session_factory=factory({TRT, NO_ENGINE, CUDA, CPU}, []),
    )
    assert (cpu.provider, cpu.model_ref.variant) == (CPU, "int8-cpu")


def test_tensorrt_is_accepted_on_an_engine_built_now_or_reused_from_the_cache(
    tiny_store: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = RuntimeConfig()
    cfg.lanes = 1
    sessions: list[FakeSession] = []

    def make(loads: set[str]) -> Callable[..., Any]:
        def session(path: str, so: Any, providers: list[str], options: list[dict[str, Any]]) -> Any:
            sessions.append(FakeSession(path, providers, loads, options))
            return sessions[-1]

        return session

    with caplog.at_level(logging.INFO, "edgeinfer.runtime.engine"):
        first = Engine.create(
            Manifest.load(tiny_store),
            cfg,
            str(tmp_path),
            platform=GPU,
            session_factory=make({TRT, CUDA, CPU}),
        )
        # The next start finds the engine in the cache (the fake builds none now): still TensorRT.
        second = Engine.create(
            Manifest.load(tiny_store),
            cfg,
            str(tmp_path),
            platform=GPU,
            session_factory=make({TRT, NO_ENGINE, CUDA, CPU}),
        )
    assert (first.provider, second.provider) == (TRT, TRT)
    assert second.model_ref.variant == "int8-tensorrt"
    assert first.plan.cache_dir == second.plan.cache_dir
    size = first.input_size
    assert [s.first_runs for s in sessions] == [[(1, size, size, 3)]] * 2  # one run each, to look
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"{TRT}: loaded")]
    assert said == [
        f"{TRT}: loaded (engine built: {ENGINE})",
        f"{TRT}: loaded (engine reused from the cache: {ENGINE})",
    ]


def test_with_the_engine_cache_off_tensorrt_is_taken_as_listed_and_said_unchecked(
    tiny_store: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = RuntimeConfig()
    cfg.lanes = 1
    cfg.tensorrt.trt_engine_cache_enable = False
    sessions: list[FakeSession] = []

    def make(path: str, so: Any, providers: list[str], options: list[dict[str, Any]]) -> Any:
        sessions.append(FakeSession(path, providers, {TRT, NO_ENGINE, CUDA, CPU}, options))
        return sessions[-1]

    with caplog.at_level(logging.INFO, "edgeinfer.runtime.engine"):
        engine = Engine.create(
            Manifest.load(tiny_store), cfg, str(tmp_path), platform=GPU, session_factory=make
        )
    assert engine.provider == TRT
    assert sessions[0].first_runs == []
    assert any("engine cache off" in r.getMessage() for r in caplog.records)


def test_a_tensorrt_session_whose_first_run_fails_gives_way_to_the_next_provider(
    tiny_store: Path, tmp_path: Path
) -> None:
    class Failing(FakeSession):
        def run(self, names: Any, feed: dict[str, Any]) -> list[Any]:
            raise RuntimeError("TensorRT EP execution context enqueue failed\nmore")

    def make(path: str, so: Any, providers: list[str], options: list[dict[str, Any]]) -> Any:
        kind = Failing if providers[0] == TRT else FakeSession
        return kind(path, providers, {TRT, CUDA, CPU}, options)

    cfg = RuntimeConfig()
    cfg.lanes = 1
    engine = Engine.create(Manifest.load(tiny_store), cfg, str(tmp_path), platform=GPU, session_factory=make)
    assert engine.provider == CUDA
    assert engine.describe()["attempts"][0] == (
        f"{TRT}: its first run failed: TensorRT EP execution context enqueue failed"
    )


def test_a_tensorrt_session_that_came_up_without_tensorrt_is_not_run_to_look(
    tiny_store: Path, tmp_path: Path
) -> None:
    # libnvinfer missing: ORT registers CUDA and the CPU only. Nothing of that session will serve.
    sessions: list[FakeSession] = []

    def make(path: str, so: Any, providers: list[str], options: list[dict[str, Any]]) -> Any:
        sessions.append(FakeSession(path, providers, {CUDA, CPU}, options))
        return sessions[-1]

    cfg = RuntimeConfig()
    cfg.lanes = 1
    engine = Engine.create(Manifest.load(tiny_store), cfg, str(tmp_path), platform=GPU, session_factory=make)
    assert engine.provider == CUDA
    assert [s.providers[0] for s in sessions] == [CUDA, CUDA]  # the TensorRT attempt's, then CUDA's
    assert sessions[0].first_runs == []
    assert engine.describe()["attempts"][0] == f"{TRT}: ONNX Runtime fell back to {CUDA}"


def test_failures_without_a_message_are_one_line_too(
    tiny_store: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def make(path: str, so: Any, providers: list[str], options: list[dict[str, Any]]) -> Any:
        if providers[0] == TRT:
            raise RuntimeError("\n")
        if so.intra_op_num_threads == 1:  # the CPU lanes' one-thread session
            raise RuntimeError()
        return FakeSession(path, providers, {CPU}, options)

    cfg = RuntimeConfig(execution_providers=[TRT, CPU])
    cfg.lanes = 2
    cfg.cpu.intra_op_num_threads = 2
    with caplog.at_level(logging.WARNING, "edgeinfer.runtime.engine"):
        engine = Engine.create(
            Manifest.load(tiny_store), cfg, str(tmp_path), platform=GPU, session_factory=make
        )
    assert (engine.provider, engine.lanes) == (CPU, 1)
    assert engine.describe()["attempts"][0] == f"{TRT}: session creation failed: RuntimeError"
    said = [r.getMessage() for r in caplog.records]
    assert said == ["no CPU lanes (one-thread session failed: RuntimeError)"]


def test_real_sessions_leave_falling_back_to_the_engine(tiny_store: Path) -> None:
    import numpy as np

    from edgeinfer.runtime.providers import ort_session, session_options

    manifest = Manifest.load(tiny_store)
    cfg = RuntimeConfig()
    session = ort_session(str(manifest.path(manifest.fp32)), session_options(cfg, CPU), [CPU], [{}])
    # ORT's Python layer would remake a session whose run raises EPFail on its fallback providers
    # (a TensorRT variant on CUDA, with CUDA's default options): off, the error reaches the engine.
    assert session._enable_fallback is False
    size = int(manifest.preprocessing.preferred_input[0])
    out = session.run(None, {session.get_inputs()[0].name: np.zeros((1, size, size, 3), np.uint8)})
    assert out[0].shape[0] == 1


def test_an_engine_tensorrt_cannot_read_is_built_anew(
    tiny_store: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A first start lost power while ORT wrote the engine: what is left of it fails every start.
    cfg = RuntimeConfig()
    cfg.lanes = 1
    made: list[list[str]] = []

    def make(path: str, so: Any, providers: list[str], options: list[dict[str, Any]]) -> Any:
        made.append(providers)
        engine = Path(options[0].get("trt_engine_cache_path", "")) / ENGINE
        if providers[0] == TRT and engine.exists() and engine.read_bytes() == b"cut sh":
            raise RuntimeError(
                "[ONNXRuntimeError] : 11 : EP_FAIL : TensorRT EP could not deserialize engine from cache: "
                f"{engine}"
            )
        return FakeSession(path, providers, {TRT, CUDA, CPU}, options)

    first = Engine.create(Manifest.load(tiny_store), cfg, str(tmp_path), platform=GPU, session_factory=make)
    assert first.plan.cache_dir is not None
    cache = Path(first.plan.cache_dir)
    (cache / ENGINE).write_bytes(b"cut sh")
    made.clear()
    with caplog.at_level(logging.WARNING, "edgeinfer.runtime.engine"):
        again = Engine.create(
            Manifest.load(tiny_store), cfg, str(tmp_path), platform=GPU, session_factory=make
        )
    assert (again.provider, again.model_ref.variant) == (TRT, "int8-tensorrt")
    assert made == [[TRT, CUDA, CPU]] * 2  # the session once more, after the removal
    assert (cache / ENGINE).read_bytes() == b"engine"  # built anew
    assert again.attempts[-1].outcome == "loaded"
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith(f"{TRT}: removed the engine cache TensorRT cannot read ({ENGINE}, ")

    # Any other failure at creation is not the cache's: nothing is removed, CUDA serves.
    def broken(path: str, so: Any, providers: list[str], options: list[dict[str, Any]]) -> Any:
        if providers[0] == TRT:
            raise RuntimeError("[ONNXRuntimeError] : 11 : EP_FAIL : User needs to provide all the profiles")
        return FakeSession(path, providers, {CUDA, CPU}, options)

    cuda = Engine.create(Manifest.load(tiny_store), cfg, str(tmp_path), platform=GPU, session_factory=broken)
    assert cuda.provider == CUDA
    assert (cache / ENGINE).exists()
    assert cuda.attempts[0].outcome.startswith("session creation failed: [ONNXRuntimeError] : 11 : EP_FAIL")


def test_a_cpu_only_host_makes_one_session_and_runs_nothing_to_look(tiny_store: Path, tmp_path: Path) -> None:
    sessions: list[FakeSession] = []

    def make(path: str, so: Any, providers: list[str], options: list[dict[str, Any]]) -> Any:
        sessions.append(FakeSession(path, providers, {CPU}, options))
        return sessions[-1]

    cfg = RuntimeConfig()  # the recipe's order: TensorRT, CUDA, CPU
    assert cfg.execution_providers[0] == TRT
    cfg.lanes = 1
    engine = Engine.create(
        Manifest.load(tiny_store), cfg, str(tmp_path), platform=PlatformInfo("1.20.0"), session_factory=make
    )
    assert engine.provider == CPU
    assert [(s.providers, s.first_runs) for s in sessions] == [([CPU], [])]
    assert not (tmp_path / "trt-cache").exists()


# ------------------------------------------------------------------------------- background loads


def _recording_runs(engine: Engine) -> list[tuple[int, int, float, float]]:
    """Each run of `engine` from now on: (thread, its niceness, start, end) on time.monotonic."""
    import os
    import threading
    import time

    runs: list[tuple[int, int, float, float]] = []
    run = engine.run

    def recorded(*args: Any, **kwargs: Any) -> Any:
        tid = threading.get_native_id()
        start = time.monotonic()
        out = run(*args, **kwargs)
        runs.append((tid, os.getpriority(os.PRIO_PROCESS, tid), start, time.monotonic()))
        return out

    engine.run = recorded  # type: ignore[method-assign]
    return runs


def test_a_background_warm_up_is_paced_and_runs_at_a_lower_priority(
    make_engine: Callable[..., Engine],
) -> None:
    import os
    import threading

    from edgeinfer.runtime.engine import BackgroundLoad, background_load, loading_settings

    engine = make_engine(RuntimeConfig(max_batch_size=3, lanes=1), warm=False)
    runs = _recording_runs(engine)
    mine = threading.get_native_id()
    nice = os.getpriority(os.PRIO_PROCESS, mine)
    settings = BackgroundLoad(pace=2.0, nice=5, every_size=True)
    with background_load(settings):
        assert loading_settings() is settings
        warm = engine.warm_up()
    assert loading_settings() is None
    assert sorted(warm) == [1, 2, 3]
    assert len(runs) == 5  # batch 1 and 3 twice, 2 once: as at start
    assert {tid for tid, *_ in runs} != {mine}
    assert {n for _, n, *_ in runs} == {min(19, nice + 5)}
    assert os.getpriority(os.PRIO_PROCESS, mine) == nice  # the caller's own priority is untouched
    for (_, _, start, end), (_, _, next_start, _) in itertools.pairwise(runs):
        assert next_start - end >= 2.0 * (end - start)  # idle twice as long as the run took


def test_a_warm_up_outside_a_background_load_runs_here_unpaced(make_engine: Callable[..., Engine]) -> None:
    import threading

    engine = make_engine(RuntimeConfig(max_batch_size=2), warm=False)
    runs = _recording_runs(engine)
    engine.warm_up()
    assert {tid for tid, *_ in runs} == {threading.get_native_id()}


def test_a_background_warm_up_that_fails_raises_on_the_callers_thread(
    make_engine: Callable[..., Engine],
) -> None:
    from edgeinfer.runtime.engine import BackgroundLoad, background_load

    engine = make_engine(RuntimeConfig(max_batch_size=2), warm=False)

    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("the session broke")

    engine.run = broken  # type: ignore[method-assign]
    with background_load(BackgroundLoad()), pytest.raises(RuntimeError, match="the session broke"):
        engine.warm_up()


def test_a_background_warm_up_on_the_cpu_can_run_batch_1_only(make_engine: Callable[..., Engine]) -> None:
    from edgeinfer.runtime.engine import BackgroundLoad, background_load

    engine = make_engine(RuntimeConfig(max_batch_size=4, lanes=1), warm=False)
    shapes: list[int] = []
    run = engine.run

    def recorded(batch: Any, **kwargs: Any) -> Any:
        shapes.append(batch.shape[0])
        return run(batch, **kwargs)

    engine.run = recorded  # type: ignore[method-assign]
    with background_load(BackgroundLoad(pace=0.0, every_size=False)):
        assert sorted(engine.warm_up()) == [1]
    assert shapes == [1, 1]
    shapes.clear()
    with background_load(BackgroundLoad(pace=0.0, every_size=True)):
        assert sorted(engine.warm_up()) == [1, 2, 3, 4]
    assert shapes == [1, 1, 2, 3, 4, 4]


def test_a_background_warm_up_idles_pace_times_each_run_on_the_clock_and_sleep_it_is_given(
    make_engine: Callable[..., Engine],
) -> None:
    from edgeinfer.runtime.engine import BackgroundLoad, background_load
    from tests.helpers.clock import FakeClock

    engine = make_engine(RuntimeConfig(max_batch_size=3, lanes=1), warm=False)
    clock = FakeClock()
    run = engine.run

    def timed(batch: Any, **kwargs: Any) -> Any:
        out = run(batch, **kwargs)
        clock.advance(0.25 * batch.shape[0])  # a run takes a quarter of a second an image, on `clock`
        return out

    engine.run = timed  # type: ignore[method-assign]
    idled: list[float] = []
    with background_load(BackgroundLoad(pace=2.0, nice=5, every_size=True)):
        warm = engine.warm_up(clock=clock, sleep=idled.append)
    assert warm == {1: 250.0, 2: 500.0, 3: 750.0}
    assert idled == [0.5, 0.5, 1.0, 1.5, 1.5]  # twice each run's time: batch 1 and 3 twice, 2 once
