"""Provider planning and selection: order, TensorRT options and cache keys, fallback detection."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from edgeinfer.runtime.config import RuntimeConfig
from edgeinfer.runtime.providers import (
    CPU,
    CUDA,
    TRT,
    PlatformInfo,
    ProviderPlan,
    engine_files,
    first_line,
    loaded_provider,
    plan_for,
    preload_gpu_libraries,
    profile_shapes,
    provider_attempts,
    remove_engines,
    serving_provider,
    session_options,
    tensorrt_backed,
    trt_cache_key,
)
from tests.helpers import PROJECT

GPU = PlatformInfo("1.20.0", "10.4.0", "NVIDIA H100", (TRT, CUDA, CPU))


def gpu_plan(
    provider: str,
    cfg: RuntimeConfig,
    work_dir: Path | str,
    *,
    model_sha256: str = "ab" * 32,
    quantized: bool = True,
    input_size: int = 224,
) -> ProviderPlan:
    """`plan_for` on the GPU platform, for a model whose input is named `input`."""
    return plan_for(
        provider,
        cfg,
        platform=GPU,
        model_sha256=model_sha256,
        quantized=quantized,
        input_name="input",
        input_size=input_size,
        work_dir=str(work_dir),
    )


def test_attempt_order_filters_and_ends_with_cpu() -> None:
    order, skipped = provider_attempts(["tensorrt", "cuda"], (CUDA, CPU))
    assert order == [CUDA, CPU]
    assert skipped == [f"{TRT}: not in this ONNX Runtime build"]
    assert provider_attempts([CPU, "cpu"], (CPU,))[0] == [CPU]


def test_trt_plan_options_and_cache_dir(tmp_path: Path) -> None:
    cfg = RuntimeConfig(max_batch_size=8)
    plan = gpu_plan(TRT, cfg, tmp_path, input_size=256)
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
    fp32 = gpu_plan(TRT, cfg, tmp_path, model_sha256="cd" * 32, quantized=False, input_size=256)
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
        ("int8", False),
        ("builder", {"trt_builder_optimization_level": 5}),
    ):
        assert trt_cache_key(**{**base, field: other}) != key, field


def test_a_builder_setting_changed_in_the_configuration_builds_a_new_engine(tmp_path: Path) -> None:
    # ORT names an engine file by its subgraph, precision and GPU architecture only: without the
    # setting in the folder's key, the engine built under the old one would be loaded.
    def cache_dir(cfg: RuntimeConfig) -> str | None:
        return gpu_plan(TRT, cfg, tmp_path).cache_dir

    cfg = RuntimeConfig()
    first = cache_dir(cfg)
    assert cache_dir(RuntimeConfig()) == first
    cfg.tensorrt.trt_builder_optimization_level = 5
    assert cache_dir(cfg) != first
    cfg = RuntimeConfig()
    cfg.tensorrt.trt_max_workspace_size = 1 << 30
    assert cache_dir(cfg) != first
    cfg = RuntimeConfig()
    cfg.tensorrt.trt_cuda_graph_enable = not cfg.tensorrt.trt_cuda_graph_enable  # not the engine's
    assert cache_dir(cfg) == first


def test_cuda_and_cpu_plans() -> None:
    cfg = RuntimeConfig()
    cuda = gpu_plan(CUDA, cfg, "/w", model_sha256="x")
    assert cuda.providers == [CUDA, CPU]
    assert cuda.io_binding
    assert cuda.cache_dir is None
    cpu = gpu_plan(CPU, cfg, "/w", model_sha256="x")
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


def test_serving_provider_is_the_listing_and_for_tensorrt_an_engine() -> None:
    assert serving_provider(CUDA, [CUDA, CPU]) == (CUDA, True, "loaded")
    assert serving_provider(CUDA, [CPU]) == (CPU, False, f"ONNX Runtime fell back to {CPU}")
    assert serving_provider(TRT, [CUDA, CPU], ({}, {})) == (CUDA, False, f"ONNX Runtime fell back to {CUDA}")
    engine = {"TRTKernel_graph_1.engine": 5.0}
    assert serving_provider(TRT, [TRT, CUDA, CPU], ({}, engine)) == (
        TRT,
        True,
        "loaded (engine built: TRTKernel_graph_1.engine)",
    )
    provider, ok, why = serving_provider(TRT, [TRT, CUDA, CPU], ({}, {}))
    assert (provider, ok) == (CUDA, False)
    assert why.startswith("TensorRT is listed first but built no engine")
    assert serving_provider(TRT, [TRT, CPU], ({}, {}))[:2] == (CPU, False)
    provider, ok, why = serving_provider(TRT, [TRT, CUDA, CPU], None)  # the engine cache is off
    assert (provider, ok) == (TRT, True)
    assert "not checked" in why


def test_engine_files_are_the_engines_only(tmp_path: Path) -> None:
    assert engine_files(None) == {}
    assert engine_files(str(tmp_path / "absent")) == {}
    # What ORT's TensorRT provider writes into trt_engine_cache_path / trt_timing_cache_path: per
    # fused subgraph an engine and its profile shapes, per GPU architecture one timing cache; a
    # weight-stripped engine (trt_weight_stripped_engine_enable) is an engine too.
    stem = "TensorrtExecutionProvider_TRTKernel_graph_main_1234567890_0_0"
    for name in (
        f"{stem}_fp16_sm90.engine",
        f"{stem}_fp16_sm90.profile",
        f"{stem}_int8_sm87.stripped.engine",
        "TensorrtExecutionProvider_cache_sm90.timing",
    ):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "old.engine").mkdir()  # not a file
    assert sorted(engine_files(str(tmp_path))) == [
        f"{stem}_fp16_sm90.engine",
        f"{stem}_int8_sm87.stripped.engine",
    ]
    # An unreadable cache goes with its profiles; the timing cache stays.
    assert remove_engines(str(tmp_path)) == [
        f"{stem}_fp16_sm90.engine",
        f"{stem}_fp16_sm90.profile",
        f"{stem}_int8_sm87.stripped.engine",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "TensorrtExecutionProvider_cache_sm90.timing",
        "old.engine",
    ]


@pytest.mark.parametrize(
    ("exc", "line"),
    [
        (RuntimeError("[ONNXRuntimeError] : 11 : EP_FAIL : no profile\nPlease note that ..."), None),
        (RuntimeError("\n  [ONNXRuntimeError] : 1 : FAIL : late first line"), None),
        (RuntimeError(), "RuntimeError"),
        (RuntimeError("\n"), "RuntimeError"),
    ],
)
def test_first_line_is_one_line_whatever_the_message(exc: Exception, line: str | None) -> None:
    said = first_line(exc)
    assert "\n" not in said
    assert said == (line or str(exc).strip().splitlines()[0])
    assert len(first_line(RuntimeError("x" * 500), 300)) == 300


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
