"""Configuration, the hardware allow-list and the install plan (exactly one ONNX Runtime package).

`InstallerConfig` maps the component's recipe configuration (camelCase keys, as AWS's components
use). `choose(platform, config)` checks the platform against the allow-list and returns the plan, or
raises `UnsupportedPlatformError` with one line that says what was found and what is allowed.
Standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from edgeinfer.errors import EdgeinferError
from edgeinfer.installer.preflight import interpreter_refusal
from edgeinfer.installer.probe import PlatformInfo

__all__ = [
    "CPU",
    "CUDA",
    "DEFAULT_ALLOW_LIST",
    "DEFAULT_PACKAGES",
    "DEFAULT_PINS",
    "NVIDIA_INDEX",
    "ORT_PACKAGES",
    "TENSORRT",
    "AllowRule",
    "ConfigError",
    "InstallerConfig",
    "Plan",
    "UnsupportedPlatformError",
    "choose",
]

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"

# Every distribution that ships the `onnxruntime` import package: two in one venv break each other.
ORT_PACKAGES = frozenset(
    {
        "onnxruntime",
        "onnxruntime-gpu",
        "onnxruntime-directml",
        "onnxruntime-openvino",
        "onnxruntime-qnn",
        "onnxruntime-training",
        "ort-nightly",
        "ort-nightly-gpu",
    }
)

# The rest of the stack the device side imports (the project's own runtime dependencies).
DEFAULT_PACKAGES = ["numpy", "opencv-python-headless", "awsiotsdk", "PyYAML", "rich", "orjson", "pybase64"]

# Pins per Python minor of the venv: versions that have wheels for every platform the default
# allow-list admits (manylinux x86-64 and aarch64), checked against the index by
# tests/installer/test_matrix.py. Besides distributions, the keys name the ONNX Runtime builds:
# `onnxruntime` (CPU), `onnxruntime-gpu-cudaNN` (PyPI's onnxruntime-gpu built for CUDA NN: CUDA 12 up to
# 1.26.0, CUDA 13 from 1.27.0, cp311+ from 1.24, aarch64 from 1.29) and `onnxruntime-gpu-jetson` (what
# to ask of jetsonIndexUrl). An empty value is the same as an absent key: unpinned, or for a build,
# none — a deployment's merge can override any default this way, though it cannot delete a key.
_STACK = {
    "opencv-python-headless": "5.0.0.93",
    "awsiotsdk": "1.31.0",
    "awscrt": "0.36.1",  # awsiotsdk 1.31.0 asks for exactly this one
    "PyYAML": "6.0.4",
    "rich": "15.0.0",
    "orjson": "3.13.0",
    "pybase64": "1.5.1",
    # TensorRT 10 (what ORT's TensorRT provider links: libnvinfer.so.10 in 1.23.2, 1.26.0 and 1.31.1)
    "tensorrt-cu12-libs": "10.16.1.11",
    "tensorrt-cu13-libs": "10.16.1.11",
}
DEFAULT_PINS: dict[str, dict[str, str]] = {
    # NumPy >= 2.3 and ONNX Runtime >= 1.24 need Python >= 3.11
    "3.10": {
        "onnxruntime": "1.23.2",
        "onnxruntime-gpu-cuda12": "1.23.2",
        "onnxruntime-gpu-cuda13": "",
        "onnxruntime-gpu-jetson": "",
        "numpy": "2.2.6",
        **_STACK,
    },
    **{
        minor: {
            "onnxruntime": "1.32.0",
            "onnxruntime-gpu-cuda12": "1.26.0",
            "onnxruntime-gpu-cuda13": "1.31.1",
            "onnxruntime-gpu-jetson": "",
            "numpy": "2.4.6",
            **_STACK,
        }
        for minor in ("3.11", "3.12", "3.13")
    },
}
ORT_TENSORRT_MAJOR = "10"  # the TensorRT major of every onnxruntime-gpu build in DEFAULT_PINS
AARCH64_GPU_WHEELS_FROM = (1, 29)  # PyPI's first aarch64 onnxruntime-gpu (CUDA 13, SBSA builds)
# Where NVIDIA publishes the TensorRT wheels themselves; PyPI's tensorrt-cuNN-libs are stubs that
# download from here when built, which --only-binary refuses.
NVIDIA_INDEX = "https://pypi.nvidia.com"

DEFAULT_ALLOW_LIST: list[dict[str, Any]] = [
    {"name": "linux-x86_64-cpu", "os": "linux", "architectures": ["x86_64"], "accelerators": ["cpu"]},
    {
        "name": "linux-x86_64-cuda",
        "os": "linux",
        "architectures": ["x86_64"],
        "accelerators": ["cuda"],
        "cudaMajors": ["12", "13"],
        "minDriverVersion": "525.60",
    },
    {"name": "linux-aarch64-cpu", "os": "linux", "architectures": ["aarch64"], "accelerators": ["cpu"]},
    {
        # Xavier (tegra194), Orin (tegra234), Thor (tegra264) on JetPack 5.1, 6.x and 7.x
        "name": "jetson",
        "os": "linux",
        "architectures": ["aarch64"],
        "accelerators": ["jetson"],
        "jetsonChips": ["tegra194", "tegra234", "tegra264"],
        "l4tMajors": ["35", "36", "38", "39"],
    },
]


class ConfigError(EdgeinferError):
    """The installer's configuration is malformed."""


class UnsupportedPlatformError(EdgeinferError):
    """The platform is not on the allow-list, or the plan cannot be made for it."""


def _version_tuple(text: str) -> tuple[int, ...]:
    out = []
    for part in text.split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


@dataclass
class AllowRule:
    """One allow-list entry. Empty lists mean "any"."""

    name: str
    os: str = "linux"
    architectures: list[str] = field(default_factory=list)
    accelerators: list[str] = field(default_factory=list)  # "cpu" | "cuda" | "jetson"
    cudaMajors: list[str] = field(default_factory=list)  # noqa: N815 (recipe key)
    minDriverVersion: str = ""  # noqa: N815
    jetsonChips: list[str] = field(default_factory=list)  # noqa: N815 (/proc/device-tree/compatible)
    jetsonModels: list[str] = field(default_factory=list)  # noqa: N815 (substrings of the board model)
    l4tMajors: list[str] = field(default_factory=list)  # noqa: N815

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> AllowRule:
        if not isinstance(data, Mapping) or not data.get("name"):
            raise ConfigError(f"allowList: every entry needs a name, got {data!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"allowList entry {data['name']!r}: unknown keys {', '.join(unknown)}")
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key in ("name", "os", "minDriverVersion"):
                kwargs[key] = str(value)
            else:
                items = value if isinstance(value, list) else [value]
                kwargs[key] = [str(v) for v in items]
        return cls(**kwargs)

    def refusal(self, info: PlatformInfo, accelerator: str) -> str | None:
        """None if this rule admits the platform with `accelerator`, else why not (short)."""
        if self.os and info.os != self.os.lower():
            return f"os {info.os}"
        if self.architectures and info.architecture not in [a.lower() for a in self.architectures]:
            return f"architecture {info.architecture}"
        if self.accelerators and accelerator not in [a.lower() for a in self.accelerators]:
            return f"accelerator {accelerator}"
        if accelerator == "cuda":
            major = info.cuda_major
            if self.cudaMajors and major not in self.cudaMajors:
                return f"CUDA {major or 'unknown'}"
            driver = info.gpu.driver_version if info.gpu else ""
            if self.minDriverVersion and _version_tuple(driver) < _version_tuple(self.minDriverVersion):
                return f"driver {driver or 'unknown'} < {self.minDriverVersion}"
        if accelerator == "jetson" and info.jetson is not None:
            chip = info.jetson.chip or ""
            if self.jetsonChips and chip not in [c.lower() for c in self.jetsonChips]:
                return f"chip {chip or 'unknown'}"
            model = info.jetson.model.lower()
            if self.jetsonModels and not any(m.lower() in model for m in self.jetsonModels):
                return f"board {info.jetson.model!r}"
            if self.l4tMajors and info.jetson.l4t_major not in self.l4tMajors:
                return f"L4T {info.jetson.l4t_version or 'unknown'}"
        return None


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off", ""):
        return False
    raise ConfigError(f"{key}: expected true or false, got {value!r}")


def _as_int(key: str, value: Any) -> int:
    try:
        return int(float(value))
    except (TypeError, ValueError, OverflowError):  # OverflowError: "inf"
        raise ConfigError(f"{key}: expected a number, got {value!r}") from None


def _as_list(key: str, value: Any) -> list[Any]:
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return []
        if text.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{key}: not valid JSON ({exc.msg})") from None
        else:
            return [p.strip() for p in text.split(",") if p.strip()]
    if not isinstance(value, list):
        raise ConfigError(f"{key}: expected a list, got {type(value).__name__}")
    return value


def _as_map(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        if not value.strip():
            return {}
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{key}: not valid JSON ({exc.msg})") from None
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key}: expected an object, got {type(value).__name__}")
    return dict(value)


@dataclass
class InstallerConfig:
    """The component configuration (recipe keys). See recipes/com.edgeinfer.RuntimeInstaller.yaml."""

    allowList: list[AllowRule] = field(  # noqa: N815
        default_factory=lambda: [AllowRule.from_mapping(r) for r in DEFAULT_ALLOW_LIST]
    )
    # no GPU build fits, or the allow-list refuses the GPU → CPU plan, with one warning
    allowCpuFallback: bool = True  # noqa: N815
    # TensorRT where the device has it (Jetson: JetPack's) or can get it (x86-64: NVIDIA's wheels)
    enableTensorRT: bool = True  # noqa: N815
    pins: dict[str, dict[str, str]] = field(  # Python minor → package → version (DEFAULT_PINS)
        default_factory=lambda: {k: dict(v) for k, v in DEFAULT_PINS.items()}
    )
    packages: list[str] = field(default_factory=lambda: list(DEFAULT_PACKAGES))
    packageVersions: dict[str, str] = field(default_factory=dict)  # noqa: N815 (over pins, any Python)
    indexUrl: str = ""  # noqa: N815 (empty: pip's own configuration)
    extraIndexUrls: list[str] = field(default_factory=list)  # noqa: N815
    jetsonIndexUrl: str = ""  # noqa: N815 (e.g. a Jetson AI Lab index for your JetPack)
    jetsonWheelUrl: str = ""  # noqa: N815 (or one onnxruntime-gpu wheel URL / path)
    # The pip requirement for TensorRT where the system has none for the build; empty: the pinned
    # tensorrt-cuNN-libs of the build's CUDA major, from tensorrtIndexUrl.
    tensorrtPackage: str = ""  # noqa: N815
    tensorrtIndexUrl: str = NVIDIA_INDEX  # noqa: N815
    allowSourceBuilds: bool = False  # noqa: N815 (pip may build sdists: hours on a board, or a failure)
    wheelhouse: str = ""  # empty: the unpacked artifact `wheelhouse/`, when present
    offline: bool = False  # never contact an index (a wheelhouse is required)
    usePipConfig: bool = False  # noqa: N815 (honour the machine's pip.conf / PIP_* variables)
    existingVenv: str = ""  # noqa: N815 (verify and link this environment instead of installing)
    allowRoot: bool = False  # noqa: N815
    requireProviders: bool = False  # noqa: N815 (fail when an expected GPU provider does not load)
    systemSitePackages: bool = False  # noqa: N815 (Jetson: see JetPack's Python packages)
    installProject: bool = True  # noqa: N815 (install the edgeinfer wheel shipped as an artifact)
    pipTimeoutSeconds: int = 60  # noqa: N815 (pip's per-connection timeout)
    pipRetries: int = 2  # noqa: N815
    installTimeoutSeconds: int = 1500  # noqa: N815 (whole pip run; keep under the lifecycle Timeout)
    keepVenvs: int = 2  # noqa: N815 (current + previous, so a running runtime keeps its files)
    python: str = "python3"  # the interpreter the recipe's Install step runs (and makes the venv from)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> InstallerConfig:
        """Build from recipe configuration. Empty strings and unresolved `{configuration:...}`
        variables mean "use the default"; unknown keys are refused (typos should not pass silently)."""
        known = {f.name: f for f in fields(cls)}
        defaults = cls()
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key not in known:
                raise ConfigError(f"unknown installer configuration key {key!r}")
            if value is None or (isinstance(value, str) and value.startswith("{configuration:")):
                continue
            default = getattr(defaults, key)
            if key == "allowList":
                kwargs[key] = [AllowRule.from_mapping(r) for r in _as_list(key, value)]
            elif key == "packageVersions":
                kwargs[key] = {str(k): str(v) for k, v in _as_map(key, value).items()}
            elif key == "pins":
                merged = {k: dict(v) for k, v in DEFAULT_PINS.items()}  # a partial map overrides
                for minor, row in _as_map(key, value).items():
                    values = _as_map(f"pins.{minor}", row).items()
                    merged.setdefault(str(minor), {}).update(
                        {str(k): "" if v is None else str(v) for k, v in values}
                    )
                kwargs[key] = merged
            elif isinstance(default, bool):
                kwargs[key] = _as_bool(key, value)
            elif isinstance(default, int):
                kwargs[key] = _as_int(key, value)
            elif isinstance(default, list):
                kwargs[key] = [str(v) for v in _as_list(key, value)]
            else:
                kwargs[key] = str(value)
        config = cls(**kwargs)
        named_ort = [p for p in config.packages if _req_name(p) in ORT_PACKAGES]
        if named_ort:
            raise ConfigError(
                f"packages must not name an ONNX Runtime package ({', '.join(named_ort)}): "
                "the installer picks exactly one for the platform"
            )
        return config


def _req_name(requirement: str) -> str:
    name = requirement.strip()
    for sep in ("[", "=", "<", ">", "!", "~", " ", "@", ";"):
        name = name.split(sep, 1)[0]
    return name.lower().replace("_", "-")


@dataclass
class Plan:
    """What to install. `requirements` are pip requirement specifiers; `constraints` pin the rest;
    `optional` is installed after them and may fail without failing the plan (TensorRT's libraries:
    the CUDA provider still runs)."""

    accelerator: str
    rule: str
    onnxruntime_package: str
    requirements: list[str]
    constraints: dict[str, str]
    expected_providers: list[str]
    python: str = ""  # the venv's Python minor, whose pins these are
    platform_tags: list[str] = field(default_factory=list)  # the wheels this machine takes
    index_url: str = ""
    extra_index_urls: list[str] = field(default_factory=list)
    optional: list[str] = field(default_factory=list)
    optional_index_urls: list[str] = field(default_factory=list)
    only_binary: bool = True
    system_site_packages: bool = False
    notes: list[str] = field(default_factory=list)  # warnings, each logged once
    details: list[str] = field(default_factory=list)  # how the plan was made

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _select(info: PlatformInfo, config: InstallerConfig) -> tuple[str, AllowRule, list[str]]:
    """(accelerator, rule, notes): the best accelerator an allow-list rule admits."""
    candidates = [info.accelerator]
    if info.accelerator != "cpu" and config.allowCpuFallback:
        candidates.append("cpu")
    reasons: list[str] = []
    notes: list[str] = []
    for accelerator in candidates:
        for rule in config.allowList:
            why = rule.refusal(info, accelerator)
            if why is None:
                if accelerator != info.accelerator:
                    notes.append(
                        f"{info.accelerator} is not allowed here ({'; '.join(reasons)}); using the CPU"
                    )
                return accelerator, rule, notes
            reasons.append(f"{rule.name}: {why}")
    found = f"{info.os} {info.architecture} {info.accelerator}"
    if info.gpu is not None:
        found += f" ({info.gpu.name}, driver {info.gpu.driver_version}, CUDA {info.cuda_major or '?'})"
    if info.jetson is not None:
        found += f" ({info.jetson.model}, L4T {info.jetson.l4t_version or '?'})"
    allowed = ", ".join(r.name for r in config.allowList) or "nothing"
    raise UnsupportedPlatformError(
        f"unsupported platform: {found} is not in the allow-list (allowed: {allowed})"
    )


def _requirement(name: str, version: str) -> str:
    """`name==version`, `name<range>` when the pin is a range, or `name` when it is empty."""
    version = version.strip()
    if not version:
        return name
    return f"{name}{version}" if version[0] in "<>=!~" else f"{name}=={version}"


def pins_for(info: PlatformInfo, config: InstallerConfig) -> dict[str, str]:
    """This Python's pins with `packageVersions` over them; empty values dropped (unpinned / none)."""
    minor = info.python_minor
    row = config.pins.get(minor)
    if not row:
        known = sorted((k for k, v in config.pins.items() if v), key=_version_tuple)
        raise UnsupportedPlatformError(
            f"Python {minor} has no pins (pins has {', '.join(known) or 'none'}): set python: "
            f'python{known[-1] if known else "3.12"}, or add pins."{minor}" to the configuration'
        )
    merged = {**row, **config.packageVersions}
    return {k: v.strip() for k, v in merged.items() if v and v.strip()}


def _gpu_builds(pins: dict[str, str]) -> dict[int, str]:
    builds: dict[int, str] = {}
    for key, version in pins.items():
        major = key[len("onnxruntime-gpu-cuda") :]
        if key.startswith("onnxruntime-gpu-cuda") and major.isdigit():
            builds[int(major)] = version
    return builds


def _gpu_build(info: PlatformInfo, builds: dict[int, str], tensorrt: bool) -> tuple[int, str, bool] | None:
    """(CUDA major, onnxruntime-gpu version, whether the system's CUDA stack serves it), or None when
    no build runs on this driver: the build for the system's own CUDA when it has cuDNN (and a
    TensorRT the build links, when asked), else the newest build the driver runs (its CUDA and cuDNN
    then come from the nvidia-* wheels). Drivers run older CUDA majors."""
    machine = info.cuda_major or ""
    runs = sorted(m for m in builds if machine.isdigit() and m <= int(machine))
    if not runs:
        return None
    system = (info.cuda_version or "").split(".")[0]
    trt_major = (info.tensorrt_version or "").split(".")[0]
    complete = info.cudnn_version is not None and (not tensorrt or trt_major == ORT_TENSORRT_MAJOR)
    if complete and system.isdigit() and int(system) in runs:
        return int(system), builds[int(system)], True
    return runs[-1], builds[runs[-1]], False


def _jetson_pypi_build(info: PlatformInfo, builds: dict[int, str]) -> str | None:
    """PyPI's aarch64 onnxruntime-gpu for a CUDA-13 JetPack (7.x), when the pinned build has one."""
    jetson = info.jetson
    cuda = (info.cuda_version or "").split(".")[0]
    if jetson is None or not (jetson.l4t_major in ("38", "39") or cuda == "13"):
        return None
    version = builds.get(13, "")
    if not version or version[0] in "<>=!~" or _version_tuple(version) < AARCH64_GPU_WHEELS_FROM:
        return None
    return version


def _cpu_instead(config: InstallerConfig, why: str, setting: str) -> str:
    """The one warning of a GPU device that gets the CPU build; a refusal when that is not allowed."""
    if not config.allowCpuFallback:
        raise UnsupportedPlatformError(f"{why}; set {setting} (or allowCpuFallback: true for the CPU build)")
    return f"{why}, so the CPU build is installed: set {setting} for the GPU"


def choose(info: PlatformInfo, config: InstallerConfig) -> Plan:
    """Check the interpreter and the allow-list, and plan the package set for this platform."""
    refusal = interpreter_refusal(
        info.python, os_id=info.os_id, os_version=info.os_version, available=info.pythons
    )
    if refusal:
        raise UnsupportedPlatformError(refusal)
    pins = pins_for(info, config)
    accelerator, rule, notes = _select(info, config)
    minor = info.python_minor
    details: list[str] = []
    extra = list(config.extraIndexUrls)
    expected = [CPU]
    extras_pkgs: list[str] = []
    optional: list[str] = []
    optional_index: list[str] = []
    package = "onnxruntime"
    ort_req = ""
    builds = _gpu_builds(pins)
    if accelerator == "cuda":
        build = _gpu_build(info, builds, config.enableTensorRT)
        if build is None:
            have = ", ".join(f"CUDA {m}" for m in sorted(builds)) or "none"
            notes.append(
                _cpu_instead(
                    config,
                    f"no onnxruntime-gpu build for Python {minor} runs on CUDA {info.cuda_major} "
                    f"(the pins have: {have})",
                    f'pins."{minor}".onnxruntime-gpu-cuda{info.cuda_major}',
                )
            )
            accelerator = "cpu"
        else:
            cuda_major, gpu_version, system_stack = build
            package = "onnxruntime-gpu"
            # CUDA/cuDNN runtime libraries from PyPI (nvidia-* wheels) unless the system's serve the build.
            spec = "onnxruntime-gpu" if system_stack else "onnxruntime-gpu[cuda,cudnn]"
            if not system_stack:
                found_cuda = f"CUDA {info.cuda_version}" if info.cuda_version else "no CUDA runtime"
                found_cudnn = "cuDNN" if info.cudnn_version else "no cuDNN"
                details.append(
                    f"the system has {found_cuda} and {found_cudnn}; onnxruntime-gpu {gpu_version} is "
                    f"built for CUDA {cuda_major}: taking CUDA and cuDNN from the nvidia-* wheels"
                )
            ort_req = _requirement(spec, gpu_version)
            expected = [CUDA, CPU]
            extras_pkgs.append("nvidia-ml-py")  # NVML: the telemetry component's GPU figures
            if config.enableTensorRT:
                expected = [TENSORRT, *expected]
                if not system_stack or info.tensorrt_version is None:
                    name = f"tensorrt-cu{cuda_major}-libs"
                    trt = config.tensorrtPackage or _requirement(name, pins.get(name, "") or "<11")
                    optional.append(trt)
                    if config.tensorrtIndexUrl:
                        optional_index.append(config.tensorrtIndexUrl)
                    details.append(
                        f"TensorRT {ORT_TENSORRT_MAJOR} for CUDA {cuda_major} from {trt} "
                        "(the system has none for this build)"
                    )
    elif accelerator == "jetson":
        jetson = info.jetson
        assert jetson is not None  # the rule admitted a Jetson
        board = f"{jetson.model} ({jetson.chip or 'Jetson'}, L4T {jetson.l4t_version or '?'}"
        board += f", JetPack {jetson.jetpack})"
        pypi = _jetson_pypi_build(info, builds)
        if config.jetsonWheelUrl:
            ort_req = f"onnxruntime-gpu @ {config.jetsonWheelUrl}"
        elif config.jetsonIndexUrl:
            ort_req = _requirement("onnxruntime-gpu", pins.get("onnxruntime-gpu-jetson", ""))
            extra.insert(0, config.jetsonIndexUrl)
        elif pypi is not None:
            ort_req = f"onnxruntime-gpu=={pypi}"
            details.append(
                f"{board}: PyPI's aarch64 CUDA-13 onnxruntime-gpu {pypi} on JetPack's CUDA and cuDNN "
                "(built for SBSA servers; the provider check tells whether it runs here)"
            )
        else:
            notes.append(
                _cpu_instead(
                    config,
                    f"{board}: no GPU build of ONNX Runtime for Python {minor} is configured",
                    f"jetsonIndexUrl (an index with onnxruntime-gpu for JetPack {jetson.jetpack}, such as "
                    "NVIDIA's Jetson AI Lab) or jetsonWheelUrl",
                )
            )
            accelerator = "cpu"
        if accelerator == "jetson":
            package = "onnxruntime-gpu"
            expected = [CUDA, CPU]
            trt_major = (info.tensorrt_version or "").split(".")[0]
            if config.enableTensorRT and trt_major == ORT_TENSORRT_MAJOR:
                expected = [TENSORRT, *expected]
            elif config.enableTensorRT:
                details.append(
                    f"JetPack {jetson.jetpack}'s TensorRT {info.tensorrt_version or 'is missing'}: ONNX "
                    f"Runtime's TensorRT provider links TensorRT {ORT_TENSORRT_MAJOR}, so CUDA runs"
                )
    if accelerator == "cpu":
        package = "onnxruntime"
        ort_req = _requirement("onnxruntime", pins.get("onnxruntime", ""))
    constraints = {
        k: v for k, v in pins.items() if not k.startswith(("onnxruntime", "tensorrt")) and v[0] not in "<>=!~"
    }
    return Plan(
        accelerator=accelerator,
        rule=rule.name,
        onnxruntime_package=package,
        requirements=[ort_req, *extras_pkgs, *config.packages],
        constraints=dict(sorted(constraints.items())),
        expected_providers=expected,
        python=minor,
        platform_tags=info.platform_tags(),
        index_url=config.indexUrl,
        extra_index_urls=extra,
        optional=optional,
        optional_index_urls=optional_index,
        only_binary=not config.allowSourceBuilds,
        system_site_packages=config.systemSitePackages,
        notes=notes,
        details=details,
    )
