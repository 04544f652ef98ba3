"""Configuration, the hardware allow-list and the install plan (exactly one ONNX Runtime package).

`InstallerConfig` is the component's configuration, read by `edgeinfer.config` (snake_case fields,
the recipe's camelCase keys derived from them). `choose(platform, config)` checks the platform
against the allow-list and returns the plan, or raises `UnsupportedPlatformError` with one line
that says what was found and what is allowed.
Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from edgeinfer import config
from edgeinfer.config import ConfigError, recipe_key
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

COMPONENT = "com.edgeinfer.RuntimeInstaller"
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
# These and DEFAULT_ALLOW_LIST are the only copy of the defaults: the recipe leaves both keys out so
# that its size (nucleus lite's sub-object budget) does not grow with them.
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

    name: str = ""
    os: str = "linux"
    architectures: list[str] = field(default_factory=list)
    accelerators: list[str] = field(default_factory=list)  # "cpu" | "cuda" | "jetson"
    cuda_majors: list[str] = field(default_factory=list)
    min_driver_version: str = ""
    jetson_chips: list[str] = field(default_factory=list)  # /proc/device-tree/compatible
    jetson_models: list[str] = field(default_factory=list)  # substrings of the board model
    l4t_majors: list[str] = field(default_factory=list)

    def check(self) -> list[tuple[str, str]]:
        return [] if self.name else [("name", "every allowList entry needs a name")]

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> AllowRule:
        return config.read(cls, data, component=COMPONENT, path="allowList")

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
            if self.cuda_majors and major not in self.cuda_majors:
                return f"CUDA {major or 'unknown'}"
            driver = info.gpu.driver_version if info.gpu else ""
            if self.min_driver_version and _version_tuple(driver) < _version_tuple(self.min_driver_version):
                return f"driver {driver or 'unknown'} < {self.min_driver_version}"
        if accelerator == "jetson" and info.jetson is not None:
            chip = info.jetson.chip or ""
            if self.jetson_chips and chip not in [c.lower() for c in self.jetson_chips]:
                return f"chip {chip or 'unknown'}"
            model = info.jetson.model.lower()
            if self.jetson_models and not any(m.lower() in model for m in self.jetson_models):
                return f"board {info.jetson.model!r}"
            if self.l4t_majors and info.jetson.l4t_major not in self.l4t_majors:
                return f"L4T {info.jetson.l4t_version or 'unknown'}"
        return None


@dataclass
class InstallerConfig:
    """The component configuration (recipe keys). See recipes/com.edgeinfer.RuntimeInstaller.yaml."""

    allow_list: list[AllowRule] = field(
        default_factory=lambda: [AllowRule.from_mapping(r) for r in DEFAULT_ALLOW_LIST]
    )
    # no GPU build fits, or the allow-list refuses the GPU → CPU plan, with one warning
    allow_cpu_fallback: bool = True
    # TensorRT where the device has it (Jetson: JetPack's) or can get it (x86-64: NVIDIA's wheels)
    enable_tensorrt: bool = field(default=True, metadata=recipe_key("enableTensorRT"))
    pins: dict[str, dict[str, str]] = field(  # Python minor → package → version (DEFAULT_PINS)
        default_factory=lambda: {k: dict(v) for k, v in DEFAULT_PINS.items()}
    )
    packages: list[str] = field(default_factory=lambda: list(DEFAULT_PACKAGES))
    package_versions: dict[str, str] = field(default_factory=dict)  # over pins, any Python
    index_url: str = ""  # empty: pip's own configuration
    extra_index_urls: list[str] = field(default_factory=list)
    jetson_index_url: str = ""  # e.g. a Jetson AI Lab index for your JetPack
    jetson_wheel_url: str = ""  # or one onnxruntime-gpu wheel URL / path
    # The pip requirement for TensorRT where the system has none for the build; empty: the pinned
    # tensorrt-cuNN-libs of the build's CUDA major, from tensorrtIndexUrl.
    tensorrt_package: str = ""
    tensorrt_index_url: str = NVIDIA_INDEX
    allow_source_builds: bool = False  # pip may build sdists: hours on a board, or a failure
    wheelhouse: str = ""  # empty: the shipped wheelhouse.zip, when present (unpacked by the nucleus or by us)
    offline: bool = False  # never contact an index (a wheelhouse is required)
    use_pip_config: bool = False  # honour the machine's pip.conf / PIP_* variables
    existing_venv: str = ""  # verify and link this environment instead of installing
    allow_root: bool = False
    require_providers: bool = False  # fail when an expected GPU provider does not load
    system_site_packages: bool = False  # Jetson: see JetPack's Python packages
    install_project: bool = True  # install the edgeinfer wheel shipped as an artifact
    pip_timeout_seconds: int = 60  # pip's per-connection timeout
    pip_retries: int = 2
    install_timeout_seconds: int = 1500  # whole pip run; keep under the lifecycle Timeout
    keep_venvs: int = 2  # current + previous, so a running runtime keeps its files
    python: str = "python3"  # the interpreter the recipe's Install step runs (and makes the venv from)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> InstallerConfig:
        """Build from the component's configuration (either nucleus's typing, see edgeinfer.config).
        Empty strings, nulls and unresolved `{configuration:...}` variables mean "use the default";
        `pins` given in part override DEFAULT_PINS row by row and package by package."""
        doc = {k: v for k, v in data.items() if not _unset(v)}
        given = read_pins(doc.pop("pins", None))
        cfg = config.read(cls, doc, component=COMPONENT)
        for minor, row in given.items():
            cfg.pins.setdefault(minor, {}).update(row)
        return cfg

    def check(self) -> list[tuple[str, str]]:
        named_ort = [p for p in self.packages if _req_name(p) in ORT_PACKAGES]
        if named_ort:
            reason = (
                f"must not name an ONNX Runtime package ({', '.join(named_ort)}): "
                "the installer picks exactly one for the platform"
            )
            return [("packages", reason)]
        return []


def _unset(value: Any) -> bool:
    return value is None or (
        isinstance(value, str) and (not value.strip() or value.startswith("{configuration:"))
    )


def read_pins(value: Any) -> dict[str, dict[str, str]]:
    """`pins` as given (a null version is an empty one: unpinned, or no build)."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        value = {
            str(minor): {str(k): "" if v is None else v for k, v in row.items()}
            if isinstance(row, Mapping)
            else row
            for minor, row in value.items()
        }
    return config.read(_Pins, {"pins": value}, component=COMPONENT).pins


@dataclass
class _Pins:
    pins: dict[str, dict[str, str]] = field(default_factory=dict)


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
    if info.accelerator != "cpu" and config.allow_cpu_fallback:
        candidates.append("cpu")
    reasons: list[str] = []
    notes: list[str] = []
    for accelerator in candidates:
        for rule in config.allow_list:
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
    allowed = ", ".join(r.name for r in config.allow_list) or "nothing"
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
    merged = {**row, **config.package_versions}
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
    if not config.allow_cpu_fallback:
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
    extra = list(config.extra_index_urls)
    expected = [CPU]
    extras_pkgs: list[str] = []
    optional: list[str] = []
    optional_index: list[str] = []
    package = "onnxruntime"
    ort_req = ""
    builds = _gpu_builds(pins)
    if accelerator == "cuda":
        build = _gpu_build(info, builds, config.enable_tensorrt)
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
            if config.enable_tensorrt:
                expected = [TENSORRT, *expected]
                if not system_stack or info.tensorrt_version is None:
                    name = f"tensorrt-cu{cuda_major}-libs"
                    trt = config.tensorrt_package or _requirement(name, pins.get(name, "") or "<11")
                    optional.append(trt)
                    if config.tensorrt_index_url:
                        optional_index.append(config.tensorrt_index_url)
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
        if config.jetson_wheel_url:
            ort_req = f"onnxruntime-gpu @ {config.jetson_wheel_url}"
        elif config.jetson_index_url:
            ort_req = _requirement("onnxruntime-gpu", pins.get("onnxruntime-gpu-jetson", ""))
            extra.insert(0, config.jetson_index_url)
        elif pypi is not None:
            # JetPack's own CUDA and cuDNN; cuDNN is an optional JetPack component, then from its wheel
            spec = "onnxruntime-gpu" if info.cudnn_version else "onnxruntime-gpu[cudnn]"
            ort_req = f"{spec}=={pypi}"
            details.append(
                f"{board}: PyPI's aarch64 CUDA-13 onnxruntime-gpu {pypi} on JetPack's CUDA "
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
            if config.enable_tensorrt and trt_major == ORT_TENSORRT_MAJOR:
                expected = [TENSORRT, *expected]
            elif config.enable_tensorrt:
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
        index_url=config.index_url,
        extra_index_urls=extra,
        optional=optional,
        optional_index_urls=optional_index,
        only_binary=not config.allow_source_builds,
        system_site_packages=config.system_site_packages,
        notes=notes,
        details=details,
    )
