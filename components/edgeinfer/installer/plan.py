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
from edgeinfer.installer.probe import PlatformInfo

__all__ = [
    "CPU",
    "CUDA",
    "DEFAULT_ALLOW_LIST",
    "DEFAULT_ONNXRUNTIME_GPU_VERSIONS",
    "DEFAULT_PACKAGES",
    "DEFAULT_PACKAGE_VERSIONS",
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
# Pins: a set known to work together (the project's CI environment). Override per fleet in the
# deployment's configuration (`packageVersions`), e.g. for Python 3.10 devices.
DEFAULT_ONNXRUNTIME_VERSION = "1.32.0"
# onnxruntime-gpu per CUDA major. PyPI's builds are for CUDA 12 up to 1.26.0 and for CUDA 13 from
# 1.27.0, and they lag the CPU package (1.31.1 while `onnxruntime` is at 1.32.0): one pin for both
# would name a wheel that does not exist. A machine whose driver runs a newer CUDA than any key takes
# the newest key's build (drivers run older CUDA majors).
DEFAULT_ONNXRUNTIME_GPU_VERSIONS = {"12": "1.26.0", "13": "1.31.1"}
DEFAULT_PACKAGE_VERSIONS = {
    "numpy": "2.4.6",
    "opencv-python-headless": "5.0.0.93",
    "awsiotsdk": "1.31.0",
    "awscrt": "0.36.1",
    "PyYAML": "6.0.4",
    "rich": "15.0.0",
    "orjson": "3.13.0",
    "pybase64": "1.5.1",
}

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
        "name": "jetson-orin-xavier",
        "os": "linux",
        "architectures": ["aarch64"],
        "accelerators": ["jetson"],
        "jetsonModels": ["Orin", "Xavier"],
        "l4tMajors": ["35", "36"],
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
            model = info.jetson.model.lower()
            if self.jetsonModels and not any(m.lower() in model for m in self.jetsonModels):
                return f"board {info.jetson.model!r}"
            l4t_major = (info.jetson.l4t_version or "").split(".")[0]
            if self.l4tMajors and l4t_major not in self.l4tMajors:
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
    allowCpuFallback: bool = True  # noqa: N815 (GPU found but not allowed → CPU plan, with a warning)
    enableTensorRT: bool = False  # noqa: N815
    onnxruntimeVersion: str = DEFAULT_ONNXRUNTIME_VERSION  # noqa: N815 (CPU, and Jetson's index)
    onnxruntimeGpuVersions: dict[str, str] = field(  # noqa: N815 (CUDA major → onnxruntime-gpu)
        default_factory=lambda: dict(DEFAULT_ONNXRUNTIME_GPU_VERSIONS)
    )
    packages: list[str] = field(default_factory=lambda: list(DEFAULT_PACKAGES))
    packageVersions: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_PACKAGE_VERSIONS))  # noqa: N815
    indexUrl: str = ""  # noqa: N815 (empty: pip's own configuration)
    extraIndexUrls: list[str] = field(default_factory=list)  # noqa: N815
    jetsonIndexUrl: str = ""  # noqa: N815 (e.g. a Jetson AI Lab index for your JetPack)
    jetsonWheelUrl: str = ""  # noqa: N815 (or one onnxruntime-gpu wheel URL / path)
    # The pip requirement when TensorRT is asked but absent; empty: TensorRT 10's libraries for the
    # CUDA major of the onnxruntime-gpu build (its TensorRT provider links libnvinfer.so.10).
    tensorrtPackage: str = ""  # noqa: N815
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
            elif key in ("packageVersions", "onnxruntimeGpuVersions"):
                kwargs[key] = {str(k): str(v) for k, v in _as_map(key, value).items()}
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
    """What to install. `requirements` are pip requirement specifiers; `constraints` pin the rest."""

    accelerator: str
    rule: str
    onnxruntime_package: str
    requirements: list[str]
    constraints: dict[str, str]
    expected_providers: list[str]
    index_url: str = ""
    extra_index_urls: list[str] = field(default_factory=list)
    system_site_packages: bool = False
    notes: list[str] = field(default_factory=list)

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


def _gpu_build(info: PlatformInfo, config: InstallerConfig) -> tuple[str, str, bool]:
    """(CUDA major, onnxruntime-gpu version, whether the system's CUDA stack serves it) for this
    machine: the build for the system's own CUDA when it has cuDNN (and TensorRT, when asked) for it,
    else the newest build its driver runs (its CUDA and cuDNN then come from the nvidia-* wheels)."""
    machine = info.cuda_major or ""
    builds = sorted(
        (int(k), k)
        for k in config.onnxruntimeGpuVersions
        if k.isdigit() and machine.isdigit() and int(k) <= int(machine)
    )
    if not builds:
        known = ", ".join(sorted(config.onnxruntimeGpuVersions)) or "none"
        raise UnsupportedPlatformError(
            f"no onnxruntime-gpu build for CUDA {machine or 'unknown'} "
            f"in onnxruntimeGpuVersions (has: {known})"
        )
    system = (info.cuda_version or "").split(".")[0]
    complete = info.cudnn_version is not None and (
        not config.enableTensorRT or info.tensorrt_version is not None
    )
    if complete and system in {k for _, k in builds}:
        return system, config.onnxruntimeGpuVersions[system].strip(), True
    major = builds[-1][1]
    return major, config.onnxruntimeGpuVersions[major].strip(), False


def choose(info: PlatformInfo, config: InstallerConfig) -> Plan:
    """Check the allow-list and plan the package set for this platform."""
    accelerator, rule, notes = _select(info, config)
    pins = dict(config.packageVersions)
    for name in ORT_PACKAGES:
        pins.pop(name, None)
    version = config.onnxruntimeVersion.strip()
    index_url = config.indexUrl
    extra = list(config.extraIndexUrls)
    expected = [CPU]
    extras_pkgs: list[str] = []
    cuda_major = ""
    system_stack = False
    if accelerator == "cpu":
        package = "onnxruntime"
        ort_req = f"onnxruntime=={version}" if version else "onnxruntime"
    elif accelerator == "cuda":
        package = "onnxruntime-gpu"
        cuda_major, gpu_version, system_stack = _gpu_build(info, config)
        # CUDA/cuDNN runtime libraries from PyPI (nvidia-* wheels) unless the system's serve the build.
        want_libs = not system_stack
        spec = "onnxruntime-gpu[cuda,cudnn]" if want_libs else "onnxruntime-gpu"
        if want_libs:
            found_cuda = f"CUDA {info.cuda_version}" if info.cuda_version else "no CUDA runtime"
            found_cudnn = "cuDNN" if info.cudnn_version else "no cuDNN"
            notes.append(
                f"the system has {found_cuda} and {found_cudnn}; onnxruntime-gpu {gpu_version} is "
                f"built for CUDA {cuda_major}: taking CUDA and cuDNN from the nvidia-* wheels"
            )
        ort_req = f"{spec}=={gpu_version}" if gpu_version else spec
        expected = [CUDA, CPU]
        extras_pkgs.append("nvidia-ml-py")  # NVML: the telemetry component's GPU figures
    else:  # jetson
        package = "onnxruntime-gpu"
        if config.jetsonWheelUrl:
            ort_req = f"onnxruntime-gpu @ {config.jetsonWheelUrl}"
        elif config.jetsonIndexUrl:
            ort_req = f"onnxruntime-gpu=={version}" if version else "onnxruntime-gpu"
            extra.insert(0, config.jetsonIndexUrl)
        else:
            raise UnsupportedPlatformError(
                f"Jetson ({info.jetson.model if info.jetson else '?'}) needs jetsonIndexUrl or "
                "jetsonWheelUrl in the configuration: PyPI has no aarch64 GPU wheels of onnxruntime"
            )
        expected = [CUDA, CPU]
    if config.enableTensorRT and accelerator in ("cuda", "jetson"):
        expected = [TENSORRT, *expected]
        if accelerator == "jetson":
            if info.tensorrt_version is None:
                notes.append("TensorRT asked but not found: install JetPack's TensorRT")
        elif info.tensorrt_version is None or not system_stack:
            # None on the system, or one built for the system's CUDA while the build is for another.
            trt = config.tensorrtPackage or f"tensorrt-cu{cuda_major}-libs<11"
            extras_pkgs.append(trt)
            notes.append(f"installing {trt}: no TensorRT on the system for CUDA {cuda_major}")
    elif config.enableTensorRT:
        notes.append("TensorRT asked, but this plan runs on the CPU")
    requirements = [ort_req, *extras_pkgs, *config.packages]
    return Plan(
        accelerator=accelerator,
        rule=rule.name,
        onnxruntime_package=package,
        requirements=requirements,
        constraints=dict(sorted(pins.items())),
        expected_providers=expected,
        index_url=index_url,
        extra_index_urls=extra,
        system_site_packages=config.systemSitePackages,
        notes=notes,
    )
