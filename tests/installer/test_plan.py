"""The installer's decisions over recorded platforms: probe → allow-list → plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeinfer.installer.plan import (
    CPU,
    CUDA,
    NVIDIA_INDEX,
    TENSORRT,
    ConfigError,
    InstallerConfig,
    UnsupportedPlatformError,
    choose,
)
from edgeinfer.installer.preflight import interpreter_refusal, venv_refusal
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
    assert info.jetson.chip == "tegra234"
    assert info.tensorrt_version == "10.3.0"
    assert info.architecture == "aarch64"


def test_probe_reads_the_os_glibc_and_interpreters() -> None:
    info = found("al2023_python311_beside")
    assert (info.os_id, info.os_version, info.glibc, info.python_minor) == ("amzn", "2023", "2.34", "3.9")
    assert info.pythons == ["python3.11"]
    tags = info.platform_tags()
    assert tags[0] == "manylinux_2_34_x86_64"
    assert {"manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert found("rpi_trixie_arm64").platform_tags()[0] == "manylinux_2_41_aarch64"


def test_jetson_is_told_by_its_chip_not_its_model_string() -> None:
    xavier = found("jetson_xavier_jp5")
    assert xavier.jetson is not None
    assert (xavier.jetson.model, xavier.jetson.chip, xavier.jetson.jetpack) == (
        "Jetson-AGX",
        "tegra194",
        "5.1",
    )
    thor = found("jetson_thor_jp7")
    assert thor.jetson is not None
    assert (thor.jetson.chip, thor.jetson.l4t_major, thor.jetson.jetpack) == ("tegra264", "38", "7.0")


def test_plan_x86_64_cpu() -> None:
    plan = choose(found("x86_64_cpu"), InstallerConfig())
    assert plan.accelerator == "cpu"
    assert plan.onnxruntime_package == "onnxruntime"
    assert ort_requirements(plan.requirements) == ["onnxruntime==1.32.0"]
    assert plan.expected_providers == [CPU]
    assert plan.constraints["numpy"] == "2.4.6"  # the rest of the stack is pinned
    assert plan.only_binary
    assert not [k for k in plan.constraints if k.startswith(("onnxruntime", "tensorrt"))]


def test_python_310_gets_its_own_pins() -> None:
    plan = choose(found("ubuntu2204_x86_64"), InstallerConfig())
    assert (plan.python, ort_requirements(plan.requirements)) == ("3.10", ["onnxruntime==1.23.2"])
    assert plan.constraints["numpy"] == "2.2.6"  # NumPy >= 2.3 needs Python 3.11
    gpu = choose(found("ubuntu2204_cuda13"), InstallerConfig())  # no CUDA 13 build for cp310
    assert ort_requirements(gpu.requirements) == ["onnxruntime-gpu[cuda,cudnn]==1.23.2"]
    assert gpu.optional == ["tensorrt-cu12-libs==10.16.1.11"]  # the build's CUDA, not the driver's


def test_a_deployment_overrides_any_pin_and_an_empty_value_lifts_it() -> None:
    # What a Greengrass merge can do: change values, add keys, never delete one.
    config = InstallerConfig.from_mapping(
        {"pins": {"3.10": {"numpy": "2.2.5", "onnxruntime": ""}}, "packageVersions": {"rich": "14.0.0"}}
    )
    plan = choose(found("ubuntu2204_x86_64"), config)
    assert ort_requirements(plan.requirements) == ["onnxruntime"]
    assert (plan.constraints["numpy"], plan.constraints["rich"]) == ("2.2.5", "14.0.0")
    assert config.pins["3.11"]["numpy"] == "2.4.6"  # the other rows stay
    ranged = InstallerConfig.from_mapping({"packageVersions": {"onnxruntime": ">=1.20,<1.24"}})
    assert ort_requirements(choose(found("ubuntu2204_x86_64"), ranged).requirements) == [
        "onnxruntime>=1.20,<1.24"
    ]


def test_a_python_without_pins_is_refused_naming_the_setting() -> None:
    info = found("x86_64_cpu")
    info.python = "3.14.0"
    with pytest.raises(
        UnsupportedPlatformError, match=r'^Python 3\.14 has no pins .*python: python3\.13.*pins\."3\.14"'
    ):
        choose(info, InstallerConfig())


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("al2023", "install one: sudo dnf install python3.11, then set python: python3.11"),
        ("al2023_python311_beside", "python3.11 is installed: set python: python3.11"),
        ("ubuntu2004_x86_64", "ppa:deadsnakes/ppa && sudo apt install python3.10 python3.10-venv"),
        ("jetson_xavier_jp5", "set python: python3.10"),
        ("al2", "Amazon Linux 2 is out of support"),
    ],
)
def test_an_old_python_is_refused_in_one_line_naming_what_to_do(name: str, says: str) -> None:
    with pytest.raises(UnsupportedPlatformError) as err:
        choose(found(name), InstallerConfig())
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"Python {found(name).python} is too old")
    assert says in message


def test_interpreter_and_venv_refusals() -> None:
    assert interpreter_refusal("3.10.0") is None
    assert interpreter_refusal("3.13.0") is None
    assert "set python: python3.12" in str(
        interpreter_refusal("3.9.2", available=["python3.12", "python3.10"])
    )
    ok = venv_refusal("python3.12", "3.12.3", os_id="ubuntu", run=lambda argv: True)
    assert ok is None
    missing = venv_refusal("python3.12", "3.12.3", os_id="ubuntu", run=lambda argv: False)
    assert missing == (
        "python3.12 (Python 3.12) cannot make a venv: it has no venv/ensurepip module; "
        "sudo apt install python3.12-venv"
    )
    assert "dnf install python3.11" in str(
        venv_refusal("python3.11", "3.11.9", os_id="amzn", run=lambda a: False)
    )


def test_plan_cuda_takes_cuda_libraries_from_wheels_when_absent() -> None:
    plan = choose(found("x86_64_cuda"), InstallerConfig(enable_tensorrt=False))
    assert plan.accelerator == "cuda"
    assert ort_requirements(plan.requirements) == ["onnxruntime-gpu[cuda,cudnn]==1.26.0"]  # CUDA 12
    assert plan.expected_providers == [CUDA, CPU]
    assert "nvidia-ml-py" in plan.requirements  # NVML for the telemetry's GPU figures
    assert plan.optional == []


def test_plan_cuda_tensorrt_from_the_system_when_it_has_tensorrt_10() -> None:
    info = found("x86_64_cuda_trt")
    plan = choose(info, InstallerConfig())
    assert ort_requirements(plan.requirements) == ["onnxruntime-gpu==1.26.0"]  # the system's CUDA 12
    assert plan.expected_providers == [TENSORRT, CUDA, CPU]
    assert plan.optional == []  # the system has libnvinfer.so.10
    assert choose(info, InstallerConfig(enable_tensorrt=False)).expected_providers == [CUDA, CPU]


def test_plan_tensorrt_absent_installs_nvidia_wheels_of_the_builds_cuda_and_tensorrt_major() -> None:
    plan = choose(found("x86_64_cuda"), InstallerConfig())
    assert plan.optional == ["tensorrt-cu12-libs==10.16.1.11"]  # ORT's TensorRT provider links .so.10
    assert plan.optional_index_urls == [NVIDIA_INDEX]  # PyPI's tensorrt-cu12-libs are build stubs
    assert plan.expected_providers[0] == TENSORRT
    assert not [r for r in plan.requirements if r.startswith("tensorrt")]  # optional: CUDA stands alone
    named = choose(found("x86_64_cuda"), InstallerConfig(tensorrt_package="tensorrt-cu12"))
    assert named.optional == ["tensorrt-cu12"]


def test_plan_cuda13_driver_takes_the_cuda13_build() -> None:
    info = found("x86_64_cuda13")
    assert info.cuda_major == "13"
    plan = choose(info, InstallerConfig())
    assert plan.rule == "linux-x86_64-cuda"
    assert ort_requirements(plan.requirements) == ["onnxruntime-gpu[cuda,cudnn]==1.31.1"]
    assert plan.optional == ["tensorrt-cu13-libs==10.16.1.11"]
    assert any("built for CUDA 13" in detail for detail in plan.details)


def test_plan_prefers_the_build_for_a_complete_system_cuda_stack() -> None:
    info = found("x86_64_cuda_trt")  # system CUDA 12.6, cuDNN 9, TensorRT 10 (built for CUDA 12)
    assert info.gpu is not None
    info.gpu.cuda_driver_version = "13.0"  # a driver that would run the CUDA 13 build too
    plan = choose(info, InstallerConfig())
    assert ort_requirements(plan.requirements) == ["onnxruntime-gpu==1.26.0"]  # no GB of wheels
    assert plan.optional == []
    info.cudnn_version = None  # incomplete: the CUDA 13 build, and a TensorRT for it
    plan = choose(info, InstallerConfig())
    assert ort_requirements(plan.requirements) == ["onnxruntime-gpu[cuda,cudnn]==1.31.1"]
    assert plan.optional == ["tensorrt-cu13-libs==10.16.1.11"]


def test_plan_gpu_build_is_the_newest_the_driver_runs() -> None:
    info = found("x86_64_cuda13")
    assert info.gpu is not None
    info.gpu.cuda_driver_version = "14.1"  # a newer driver runs the CUDA 13 build
    config = InstallerConfig.from_mapping(
        {"pins": {info.python_minor: {"onnxruntime-gpu-cuda13": "1.31.0"}}, "allowList": [{"name": "any"}]}
    )
    assert ort_requirements(choose(info, config).requirements) == ["onnxruntime-gpu[cuda,cudnn]==1.31.0"]


def test_no_gpu_build_for_the_driver_is_the_cpu_with_one_warning_or_a_refusal() -> None:
    only13 = {"pins": {"3.11": {"onnxruntime-gpu-cuda12": ""}}}  # what a merge can do to a default key
    plan = choose(found("x86_64_cuda"), InstallerConfig.from_mapping(only13))
    assert (plan.accelerator, plan.expected_providers) == ("cpu", [CPU])
    assert ort_requirements(plan.requirements) == ["onnxruntime==1.32.0"]
    assert len(plan.notes) == 1
    assert 'set pins."3.11".onnxruntime-gpu-cuda12 for the GPU' in plan.notes[0]
    strict = InstallerConfig.from_mapping({**only13, "allowCpuFallback": False})
    with pytest.raises(
        UnsupportedPlatformError, match=r"^no onnxruntime-gpu build for Python 3\.11 runs on CUDA 12"
    ):
        choose(found("x86_64_cuda"), strict)


def test_jetson_without_a_gpu_source_installs_the_cpu_build_with_one_warning() -> None:
    for name in ("jetson_orin", "jetson_orin_jp6", "jetson_orin_jp60"):
        plan = choose(found(name), InstallerConfig())
        assert (plan.accelerator, plan.rule, plan.expected_providers) == ("cpu", "jetson", [CPU])
        assert ort_requirements(plan.requirements) == ["onnxruntime==1.23.2"]  # aarch64 cp310 wheels
        assert len(plan.notes) == 1
        assert "set jetsonIndexUrl" in plan.notes[0]
        assert "jetsonWheelUrl" in plan.notes[0]
    with pytest.raises(UnsupportedPlatformError, match=r"set jetsonIndexUrl .* \(or allowCpuFallback: true"):
        choose(found("jetson_orin_jp6"), InstallerConfig(allow_cpu_fallback=False))


def test_jetson_with_an_index_or_wheel_never_asks_for_the_cpu_pin() -> None:
    info = found("jetson_orin_jp6")
    index = "https://pypi.jetson-ai-lab.example/jp6/cu126"
    plan = choose(info, InstallerConfig(jetson_index_url=index))
    assert plan.accelerator == "jetson"
    assert plan.extra_index_urls == [index]
    assert ort_requirements(plan.requirements) == ["onnxruntime-gpu"]  # what the index has for cp310
    assert plan.expected_providers == [TENSORRT, CUDA, CPU]  # JetPack 6.2's TensorRT 10.3
    assert plan.optional == []  # JetPack's own CUDA, cuDNN and TensorRT
    pinned = InstallerConfig(jetson_index_url=index, package_versions={"onnxruntime-gpu-jetson": "1.23.0"})
    assert ort_requirements(choose(info, pinned).requirements) == ["onnxruntime-gpu==1.23.0"]
    wheel = "https://example.invalid/onnxruntime_gpu-1.20.0-cp310-cp310-linux_aarch64.whl"
    plan = choose(info, InstallerConfig(jetson_wheel_url=wheel))
    assert ort_requirements(plan.requirements) == [f"onnxruntime-gpu @ {wheel}"]


def test_jetpack_60_tensorrt_8_cannot_serve_the_tensorrt_provider() -> None:
    plan = choose(found("jetson_orin_jp60"), InstallerConfig(jetson_index_url="https://jp6.example/cu122"))
    assert plan.expected_providers == [CUDA, CPU]
    assert any("TensorRT 8.6.2" in detail for detail in plan.details)


def test_jetpack_7_takes_pypis_aarch64_cuda13_build() -> None:
    for name in ("jetson_thor_jp7", "jetson_orin_jp72"):
        plan = choose(found(name), InstallerConfig())
        assert (plan.accelerator, plan.rule) == ("jetson", "jetson")
        assert ort_requirements(plan.requirements) == ["onnxruntime-gpu==1.31.1"]  # no nvidia-* wheels
        assert plan.expected_providers == [TENSORRT, CUDA, CPU]
        assert plan.notes == []
    thor = found("jetson_thor_jp7")
    thor.cudnn_version = None  # cuDNN is an optional JetPack component
    assert ort_requirements(choose(thor, InstallerConfig()).requirements) == [
        "onnxruntime-gpu[cudnn]==1.31.1"
    ]
    old = InstallerConfig(package_versions={"onnxruntime-gpu-cuda13": "1.28.0"})  # no aarch64 wheel
    assert choose(found("jetson_thor_jp7"), old).accelerator == "cpu"


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
        choose(info, InstallerConfig(allow_cpu_fallback=False))


def test_exactly_one_onnxruntime_in_every_plan() -> None:
    for name in ("x86_64_cpu", "x86_64_cuda", "x86_64_cuda_trt"):
        plan = choose(found(name), InstallerConfig(enable_tensorrt=True))
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
    assert config.enable_tensorrt is True
    assert [r.name for r in config.allow_list] == ["only-cpu"]
    assert config.packages == []
    assert config.pip_timeout_seconds == 5
    assert config.existing_venv == ""
    with pytest.raises(UnsupportedPlatformError):
        choose(
            found("x86_64_cuda11"), InstallerConfig.from_mapping({"allowList": [], "allowCpuFallback": False})
        )


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ({"packages": ["onnxruntime-gpu"]}, "packages: must not name an ONNX Runtime package"),
        (
            {"allowList": [{"architectures": ["x86_64"]}]},
            r"allowList\[0\].name: every allowList entry needs a name",
        ),
        ({"enableTensorRT": "maybe"}, "enableTensorRT: must be true or false, got 'maybe'"),
        ({"allowList": "[not json"}, "allowList: must be a list, got '\\[not json'"),
        ({"keepVenvs": "inf"}, "keepVenvs: must be an integer, got 'inf'"),
    ],
)
def test_bad_config_is_one_clear_line(raw: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match) as err:
        InstallerConfig.from_mapping(raw)
    assert str(err.value).startswith("configuration of com.edgeinfer.RuntimeInstaller: ")


def test_unknown_keys_are_warned_by_name(caplog: pytest.LogCaptureFixture) -> None:
    assert InstallerConfig.from_mapping({"allowLits": []}) == InstallerConfig()
    assert "com.edgeinfer.RuntimeInstaller: unknown configuration key allowLits (ignored)" in caplog.text


def test_lite_strings_and_escaped_json_read_as_the_classic_values() -> None:
    from tests.helpers.config import lite_typed

    classic = {
        "allowCpuFallback": False,
        "keepVenvs": 3,
        "allowList": [{"name": "x", "architectures": ["x86_64"], "cudaMajors": ["12"]}],
        "pins": {"3.12": {"numpy": "2.4.6"}},
    }
    assert InstallerConfig.from_mapping(lite_typed(classic)) == InstallerConfig.from_mapping(classic)
    # a list as nucleus lite interpolates it on a command line: JSON with its quotes escaped
    escaped = {"allowList": '[{\\"name\\":\\"x\\",\\"architectures\\":[\\"x86_64\\"]}]'}
    assert [r.architectures for r in InstallerConfig.from_mapping(escaped).allow_list] == [["x86_64"]]
    pinned = InstallerConfig.from_mapping({"pins": {"3.12": {"numpy": None}}}).pins
    assert pinned["3.12"]["numpy"] == ""  # a partial map over the defaults: the rest stays
    assert pinned["3.12"]["onnxruntime"] == InstallerConfig().pins["3.12"]["onnxruntime"]
