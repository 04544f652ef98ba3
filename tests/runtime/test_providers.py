"""Provider planning and selection: order, TensorRT options and cache keys, fallback detection."""

from __future__ import annotations

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
from edgeinfer.runtime.providers import (
    CPU,
    CUDA,
    TRT,
    PlatformInfo,
    engine_files,
    loaded_provider,
    plan_for,
    preload_gpu_libraries,
    profile_shapes,
    provider_attempts,
    session_options,
    tensorrt_backed,
    trt_cache_key,
)
from tests.helpers import PROJECT
from tests.helpers.tiny_store import write_tiny_store
from tests.test_procfs import ALDER_LAKE, EPYC_AVX2, PI4, XEON_VNNI

GPU = PlatformInfo("1.20.0", "10.4.0", "NVIDIA H100", (TRT, CUDA, CPU))


def test_attempt_order_filters_and_ends_with_cpu() -> None:
    order, skipped = provider_attempts(["tensorrt", "cuda"], (CUDA, CPU))
    assert order == [CUDA, CPU]
    assert skipped == [f"{TRT}: not in this ONNX Runtime build"]
    assert provider_attempts([CPU, "cpu"], (CPU,))[0] == [CPU]


def test_trt_plan_options_and_cache_dir(tmp_path: Path) -> None:
    cfg = RuntimeConfig(max_batch_size=8)
    plan = plan_for(
        TRT,
        cfg,
        platform=GPU,
        model_sha256="ab" * 32,
        quantized=True,
        input_name="input",
        input_size=256,
        work_dir=str(tmp_path),
    )
    assert plan.providers == [TRT, CUDA, CPU]
    trt = plan.provider_options[0]
    assert trt["trt_fp16_enable"]
    assert trt["trt_int8_enable"]
    assert trt["trt_engine_cache_enable"]
    assert trt["trt_timing_cache_enable"]
    assert trt["trt_engine_cache_path"] == trt["trt_timing_cache_path"] == plan.cache_dir
    assert plan.cache_dir is not None
    assert plan.cache_dir.startswith(str(tmp_path / "trt-cache"))
    assert trt["trt_profile_min_shapes"] == "input:1x256x256x3"
    assert trt["trt_profile_opt_shapes"] == trt["trt_profile_max_shapes"] == "input:8x256x256x3"
    assert plan.provider_options[1]["cudnn_conv_algo_search"] == "HEURISTIC"
    fp32 = plan_for(
        TRT,
        cfg,
        platform=GPU,
        model_sha256="cd" * 32,
        quantized=False,
        input_name="input",
        input_size=256,
        work_dir=str(tmp_path),
    )
    assert fp32.provider_options[0]["trt_int8_enable"] is False  # no calibration table for FP32
    assert fp32.cache_dir != plan.cache_dir


def test_cache_key_changes_with_every_ingredient() -> None:
    base: dict[str, Any] = {
        "model_sha256": "m",
        "ort_version": "1.20",
        "trt_version": "10.4",
        "gpu_name": "H100",
        "profiles": profile_shapes("input", 8, 224),
        "fp16": True,
        "int8": True,
    }
    key = trt_cache_key(**base)
    assert key == trt_cache_key(**base)
    for field, other in (
        ("model_sha256", "m2"),
        ("ort_version", "1.21"),
        ("trt_version", "10.5"),
        ("gpu_name", "Orin"),
        ("profiles", profile_shapes("input", 4, 224)),
        ("fp16", False),
    ):
        assert trt_cache_key(**{**base, field: other}) != key, field


def test_cuda_and_cpu_plans() -> None:
    cfg = RuntimeConfig()
    cuda = plan_for(
        CUDA,
        cfg,
        platform=GPU,
        model_sha256="x",
        quantized=True,
        input_name="input",
        input_size=224,
        work_dir="/w",
    )
    assert cuda.providers == [CUDA, CPU]
    assert cuda.io_binding
    assert cuda.cache_dir is None
    cpu = plan_for(
        CPU,
        cfg,
        platform=GPU,
        model_sha256="x",
        quantized=True,
        input_name="input",
        input_size=224,
        work_dir="/w",
    )
    assert cpu.providers == [CPU]
    assert not cpu.io_binding


def test_loaded_provider() -> None:
    assert loaded_provider([TRT, CUDA, CPU], TRT) == (TRT, True)
    assert loaded_provider([CPU], TRT) == (CPU, False)


def test_tensorrt_backed_refuses_the_fallback_recorded_on_the_h200() -> None:
    # ORT 1.31.1 in a venv without TensorRT's libraries: the session came up on CUDA, no engine.
    run = json.loads((PROJECT / "bench" / "results" / "gpu-h200.json").read_text())
    recorded = run["default_order"]
    fell_back = [recorded["provider"], CPU]
    engines = dict.fromkeys(recorded["engine_files"], 0.0)
    assert tensorrt_backed(fell_back, {}, engines) == (
        False,
        "ONNX Runtime fell back to CUDAExecutionProvider",
    )
    # Listed first is not enough: ORT lists TensorRT even when its parser took no node.
    ok, why = tensorrt_backed([TRT, CUDA, CPU], {}, {})
    assert not ok
    assert why.startswith("TensorRT is listed first but built no engine")
    assert tensorrt_backed([TRT, CUDA, CPU], {}, {"TRTKernel_graph_1.engine": 5.0}) == (
        True,
        "engine built: TRTKernel_graph_1.engine",
    )
    cached = {"TRTKernel_graph_1.engine": 5.0}
    assert tensorrt_backed([TRT, CUDA, CPU], cached, dict(cached)) == (
        True,
        "engine reused from the cache: TRTKernel_graph_1.engine",
    )
    assert not tensorrt_backed([], {}, cached)[0]


def test_engine_files_are_the_engines_only(tmp_path: Path) -> None:
    assert engine_files(None) == {}
    assert engine_files(str(tmp_path / "absent")) == {}
    for name in ("TRTKernel_graph_1.engine", "TRTKernel_graph_1.profile", "timing.cache"):
        (tmp_path / name).write_bytes(b"x")
    assert list(engine_files(str(tmp_path))) == ["TRTKernel_graph_1.engine"]


class FakeOrt:
    """An `onnxruntime` module as far as `preload_gpu_libraries` sees it."""

    def __init__(self, says: str = "", fails: bool = False) -> None:
        self.calls = 0
        self.says = says
        self.fails = fails

    def preload_dlls(self) -> None:
        self.calls += 1
        if self.says:
            print(self.says)
        if self.fails:
            raise RuntimeError("Invalid parameter of directory=None. The directory does not exist!")


def test_gpu_libraries_are_preloaded_once_and_only_for_a_gpu_provider(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ort = FakeOrt()
    assert preload_gpu_libraries([CPU], ort) is None
    assert ort.calls == 0
    assert preload_gpu_libraries(["cuda", CPU], ort) == "CUDA and cuDNN preloaded"
    assert preload_gpu_libraries(["cuda"], ort) == "CUDA and cuDNN preloaded"
    assert ort.calls == 1

    # What preload_dlls prints (colour codes and all) goes to the note, not to the component's stdout.
    loud = FakeOrt(says="\x1b[33mFailed to load libcudnn.so.9: not found\x1b[0m")
    assert preload_gpu_libraries([CUDA], loud) == "preload_dlls: Failed to load libcudnn.so.9: not found"
    assert capsys.readouterr().out == ""
    note = preload_gpu_libraries([TRT], FakeOrt(fails=True))
    assert note is not None
    assert note.startswith("preload_dlls failed: Invalid parameter")
    older = preload_gpu_libraries([CUDA], object())  # ORT before 1.21
    assert older is not None
    assert "loader path" in older


def test_tensorrt_libraries_come_from_the_wheel_when_there_is_one(tmp_path: Path) -> None:
    for name in ("libnvinfer.so.10", "libnvinfer.so.10.16.1", "libnvonnxparser.so.10", "libcudart.so.13"):
        (tmp_path / name).write_bytes(b"")
    wheel = type("Module", (), {"__path__": [str(tmp_path)]})()
    loaded: list[str] = []

    def has_wheel(name: str) -> Any:
        assert name == "tensorrt_libs"
        return wheel

    def no_wheel(name: str) -> Any:
        raise ModuleNotFoundError(name)

    ort = FakeOrt()
    note = preload_gpu_libraries([TRT, CUDA], ort, has_wheel, loaded.append)
    assert note == (
        "CUDA and cuDNN preloaded; "
        "TensorRT from the tensorrt_libs wheel (libnvinfer.so.10, libnvonnxparser.so.10)"
    )
    assert [Path(p).name for p in loaded] == ["libnvinfer.so.10", "libnvonnxparser.so.10"]
    assert preload_gpu_libraries([TRT], ort, has_wheel, loaded.append) == note
    assert len(loaded) == 2  # once per process
    assert ort.calls == 1
    assert preload_gpu_libraries([CUDA], ort, has_wheel, loaded.append) == "CUDA and cuDNN preloaded"
    system = preload_gpu_libraries([TRT], FakeOrt(), no_wheel, loaded.append)
    assert system is not None
    assert system.endswith("TensorRT from the loader path (no tensorrt_libs wheel)")


class FakeSession:
    """Stands in for an ORT session on a GPU machine: `loads` says which providers really load."""

    def __init__(self, path: str, providers: list[str], loads: set[str]) -> None:
        self.path = path
        self.providers = [p for p in providers if p in loads] or [CPU]

    def get_providers(self) -> list[str]:
        return self.providers

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
        return FakeSession(path, providers, loads)

    return make


@pytest.mark.parametrize(
    ("loads", "provider", "variant", "tries"),
    [
        ({TRT, CUDA, CPU}, TRT, "int8-tensorrt", 1),
        ({CUDA, CPU}, CUDA, "fp32", 2),  # TRT fell back silently: retried with CUDA's variant
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


def test_session_options_spin_only_inside_a_run() -> None:
    cfg = RuntimeConfig()
    assert not cfg.cpu.allow_spinning  # the default: see CpuOptions
    cfg.cpu.allow_spinning = True
    cfg.cpu.intra_op_num_threads = 2
    whole, lane = session_options(cfg, CPU), session_options(cfg, CPU, threads=1)
    assert (whole.intra_op_num_threads, lane.intra_op_num_threads) == (2, 1)
    for so in (whole, lane):
        assert so.get_session_config_entry("session.intra_op.allow_spinning") == "1"
        assert so.get_session_config_entry("session.force_spinning_stop") == "1"
    assert session_options(cfg, CUDA).intra_op_num_threads == 1  # the GPU's host thread only
    cfg.lanes = 1  # one lane: the whole session also runs under load, beside the decode workers
    assert session_options(cfg, CPU).get_session_config_entry("session.intra_op.allow_spinning") == "0"
    cfg.lanes = 0
    cfg.cpu.allow_spinning = False
    cfg.cpu.force_spinning_stop = False
    so = session_options(cfg, CPU)
    assert so.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert so.get_session_config_entry("session.force_spinning_stop") == "0"


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
    def __init__(self, path: str, providers: list[str], loads: set[str]) -> None:
        super().__init__(path, providers, loads)
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
        return BindingSession(path, providers, {TRT, CUDA, CPU})

    on_trt = Engine.create(store, RuntimeConfig(), str(tmp_path), platform=GPU, session_factory=trt)
    assert (on_trt.provider, on_trt.fixed_batch, on_trt.thread_bound) == (TRT, 0, True)
