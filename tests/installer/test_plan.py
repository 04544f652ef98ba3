"""The installer's decisions over recorded platforms: probe → allow-list → plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeinfer.installer.plan import (
    CPU,
    CUDA,
    TENSORRT,
    ConfigError,
    InstallerConfig,
    UnsupportedPlatformError,
    choose,
)
from edgeinfer.installer.probe import PlatformInfo, RecordedProbe, probe

PLATFORMS = Path(__file__).parent / "platforms"


def found(name: str) -> PlatformInfo:
    return probe(RecordedProbe.load(PLATFORMS / f"{name}.json"))


def ort_requirements(requirements: list[str]) -> list[str]:
    return [r for r in requirements if r.split("[")[0].split("=")[0].split(" ")[0].startswith("onnxruntime")]


def test_probe_x86_64_cpu() -> None:
    info = found("x86_64_cpu")
    assert (info.os, info.architecture, info.accelerator) == ("linux", "x86_64", "cpu")
    assert info.gpu is None
    assert info.os_release == "Debian GNU/Linux 12 (bookworm)"


def test_probe_cuda_without_toolkit() -> None:
    info = found("x86_64_cuda")
    assert info.gpu is not None
    assert (info.gpu.name, info.gpu.driver_version, info.gpu.memory_mib) == (
        "NVIDIA A10G",
        "550.54.15",
        23028,
    )
    assert info.gpu.cuda_driver_version == "12.4"
    assert info.cuda_version is None
    assert info.cudnn_version is None
    assert info.tensorrt_version is None
    assert info.accelerator == "cuda"
    assert info.cuda_major == "12"


def test_probe_cuda_with_tensorrt() -> None:
    info = found("x86_64_cuda_trt")
    assert info.cuda_version == "12.6.2"
    assert info.cudnn_version == "9.5.1"
    assert info.tensorrt_version == "10.6.0"


def test_probe_jetson() -> None:
    info = found("jetson_orin")
    assert info.accelerator == "jetson"
    assert info.jetson is not None
    assert info.jetson.model == "NVIDIA Jetson AGX Orin Developer Kit"
    assert info.jetson.l4t_version == "36.4.0"
    assert info.tensorrt_version == "10.3.0"
    assert info.architecture == "aarch64"


def test_plan_x86_64_cpu() -> None:
    plan = choose(found("x86_64_cpu"), InstallerConfig())
    assert plan.accelerator == "cpu"
    assert plan.onnxruntime_package == "onnxruntime"
    assert ort_requirements(plan.requirements) == ["onnxruntime==1.32.0"]
    assert plan.expected_providers == [CPU]
    assert plan.constraints["numpy"]  # the rest of the stack is pinned


def test_plan_cuda_takes_cuda_libraries_from_wheels_when_absent() -> None:
    plan = choose(found("x86_64_cuda"), InstallerConfig())
    assert plan.accelerator == "cuda"
    assert ort_requirements(plan.requirements) == ["onnxruntime-gpu[cuda,cudnn]==1.26.0"]  # CUDA 12
    assert plan.expected_providers == [CUDA, CPU]
    assert "nvidia-ml-py" in plan.requirements  # NVML for the telemetry's GPU figures


def test_plan_cuda_tensorrt_only_when_asked() -> None:
    info = found("x86_64_cuda_trt")
    plain = choose(info, InstallerConfig())
    assert ort_requirements(plain.requirements) == ["onnxruntime-gpu==1.26.0"]  # the system's CUDA 12
    assert plain.expected_providers == [CUDA, CPU]
    asked = choose(info, InstallerConfig(enableTensorRT=True))
    assert asked.expected_providers == [TENSORRT, CUDA, CPU]
    assert not [r for r in asked.requirements if r.startswith("tensorrt")]  # the system has libnvinfer


def test_plan_tensorrt_asked_but_absent_installs_the_pip_package() -> None:
    plan = choose(found("x86_64_cuda"), InstallerConfig(enableTensorRT=True))
    assert "tensorrt-cu12-libs<11" in plan.requirements  # ORT's TensorRT provider links libnvinfer.so.10
    assert plan.expected_providers[0] == TENSORRT
    named = choose(
        found("x86_64_cuda"), InstallerConfig(enableTensorRT=True, tensorrtPackage="tensorrt-cu12")
    )
    assert "tensorrt-cu12" in named.requirements


def test_plan_cuda13_driver_takes_the_cuda13_build() -> None:
    info = found("x86_64_cuda13")
    assert info.cuda_major == "13"
    plan = choose(info, InstallerConfig(enableTensorRT=True))
    assert plan.rule == "linux-x86_64-cuda"
    assert ort_requirements(plan.requirements) == ["onnxruntime-gpu[cuda,cudnn]==1.31.1"]
    assert "tensorrt-cu13-libs<11" in plan.requirements
    assert any("built for CUDA 13" in note for note in plan.notes)


def test_plan_prefers_the_build_for_a_complete_system_cuda_stack() -> None:
    info = found("x86_64_cuda_trt")  # system CUDA 12.6, cuDNN 9, TensorRT 10 (built for CUDA 12)
    assert info.gpu is not None
    info.gpu.cuda_driver_version = "13.0"  # a driver that would run the CUDA 13 build too
    plan = choose(info, InstallerConfig(enableTensorRT=True))
    assert ort_requirements(plan.requirements) == ["onnxruntime-gpu==1.26.0"]  # no GB of wheels
    assert not [r for r in plan.requirements if r.startswith("tensorrt")]
    info.cudnn_version = None  # incomplete: the CUDA 13 build, and a TensorRT for it
    plan = choose(info, InstallerConfig(enableTensorRT=True))
    assert ort_requirements(plan.requirements) == ["onnxruntime-gpu[cuda,cudnn]==1.31.1"]
    assert "tensorrt-cu13-libs<11" in plan.requirements


def test_plan_gpu_build_is_the_newest_the_driver_runs() -> None:
    info = found("x86_64_cuda13")
    assert info.gpu is not None
    info.gpu.cuda_driver_version = "14.1"  # a newer driver runs the CUDA 13 build
    config = InstallerConfig.from_mapping(
        {"onnxruntimeGpuVersions": '{"12": "1.26.0", "13": "1.31.0"}', "allowList": [{"name": "any"}]}
    )
    assert ort_requirements(choose(info, config).requirements) == ["onnxruntime-gpu[cuda,cudnn]==1.31.0"]
    only13 = InstallerConfig(onnxruntimeGpuVersions={"13": "1.31.1"})
    with pytest.raises(UnsupportedPlatformError, match=r"^no onnxruntime-gpu build for CUDA 12 .*has: 13\)$"):
        choose(found("x86_64_cuda"), only13)


def test_plan_jetson_needs_an_index_or_wheel() -> None:
    info = found("jetson_orin")
    with pytest.raises(UnsupportedPlatformError, match="jetsonIndexUrl or jetsonWheelUrl"):
        choose(info, InstallerConfig())
    index = "https://pypi.jetson-ai-lab.example/jp6/cu126"
    plan = choose(info, InstallerConfig(jetsonIndexUrl=index))
    assert plan.accelerator == "jetson"
    assert plan.extra_index_urls == [index]
    assert ort_requirements(plan.requirements) == ["onnxruntime-gpu==1.32.0"]
    wheel = "https://example.invalid/onnxruntime_gpu-1.20.0-cp310-cp310-linux_aarch64.whl"
    plan = choose(info, InstallerConfig(jetsonWheelUrl=wheel, enableTensorRT=True))
    assert ort_requirements(plan.requirements) == [f"onnxruntime-gpu @ {wheel}"]
    assert plan.expected_providers == [TENSORRT, CUDA, CPU]


@pytest.mark.parametrize("name", ["raspberry_pi_armv7", "macos_arm64"])
def test_unsupported_platform_is_refused_in_one_line(name: str) -> None:
    with pytest.raises(UnsupportedPlatformError) as err:
        choose(found(name), InstallerConfig())
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("unsupported platform:")
    assert "linux-x86_64-cpu" in message  # says what is allowed


def test_gpu_outside_the_allow_list_falls_back_to_cpu_or_is_refused() -> None:
    info = found("x86_64_cuda11")
    plan = choose(info, InstallerConfig())
    assert plan.accelerator == "cpu"
    assert any("CUDA 11" in note for note in plan.notes)
    with pytest.raises(UnsupportedPlatformError, match=r"Tesla T4, driver 470\.256\.02, CUDA 11"):
        choose(info, InstallerConfig(allowCpuFallback=False))


def test_exactly_one_onnxruntime_in_every_plan() -> None:
    for name in ("x86_64_cpu", "x86_64_cuda", "x86_64_cuda_trt"):
        plan = choose(found(name), InstallerConfig(enableTensorRT=True))
        assert len(ort_requirements(plan.requirements)) == 1


def test_config_from_recipe_values() -> None:
    config = InstallerConfig.from_mapping(
        {
            "enableTensorRT": "true",
            "allowList": '[{"name": "only-cpu", "architectures": ["x86_64"], "accelerators": ["cpu"]}]',
            "packages": "[]",
            "packageVersions": {"numpy": "2.4.6"},
            "pipTimeoutSeconds": "5",
            "existingVenv": "{configuration:/existingVenv}",  # unresolved variable: the default
            "indexUrl": "",
        }
    )
    assert config.enableTensorRT is True
    assert [r.name for r in config.allowList] == ["only-cpu"]
    assert config.packages == []
    assert config.pipTimeoutSeconds == 5
    assert config.existingVenv == ""
    with pytest.raises(UnsupportedPlatformError):
        choose(
            found("x86_64_cuda11"), InstallerConfig.from_mapping({"allowList": [], "allowCpuFallback": False})
        )


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ({"packages": ["onnxruntime-gpu"]}, "exactly one"),
        ({"allowLits": []}, "unknown installer configuration key 'allowLits'"),
        ({"allowList": [{"architectures": ["x86_64"]}]}, "needs a name"),
        ({"enableTensorRT": "maybe"}, "expected true or false"),
        ({"allowList": "[not json"}, "not valid JSON"),
        ({"keepVenvs": "inf"}, "keepVenvs: expected a number"),
    ],
)
def test_bad_config_is_one_clear_line(raw: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        InstallerConfig.from_mapping(raw)
