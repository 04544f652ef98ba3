"""Platform probe: OS, architecture, NVIDIA GPU and driver, CUDA, cuDNN, TensorRT, Jetson boards.

Everything the probe learns comes through a `ProbeSource` (run a command, read a file, list the shared
libraries the loader knows), so tests feed recorded outputs of real machines (`RecordedProbe`) and
the decisions are tested without the hardware. Standard library only: the installer runs on the
system Python before the venv exists.
"""

from __future__ import annotations

import glob
import json
import os
import platform
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeinfer.installer.preflight import CANDIDATES

if TYPE_CHECKING or sys.version_info >= (3, 8):
    from typing import Protocol
else:  # Python 3.7 (Amazon Linux 2): the interpreter check refuses it, but the module must import
    Protocol = object

__all__ = [
    "NVIDIA_SMI_QUERY",
    "GpuInfo",
    "JetsonInfo",
    "PlatformInfo",
    "ProbeSource",
    "RecordedProbe",
    "SystemProbe",
    "probe",
]

NVIDIA_SMI_QUERY = (
    "nvidia-smi",
    "--query-gpu=name,driver_version,memory.total",
    "--format=csv,noheader,nounits",
)
NVIDIA_SMI = ("nvidia-smi",)
TEGRA_RELEASE = "/etc/nv_tegra_release"
DEVICE_TREE_MODEL = "/proc/device-tree/model"
# NUL-separated, most specific first, the SoC last: "nvidia,p3701-0005\0nvidia,tegra234\0". The stable
# key of a Jetson board (the model string is free text that vendors' carrier boards change).
DEVICE_TREE_COMPATIBLE = "/proc/device-tree/compatible"
LDD_VERSION = ("ldd", "--version")
OS_RELEASE = "/etc/os-release"
CUDA_VERSION_JSON = "/usr/local/cuda/version.json"
CUDNN_HEADERS = ("/usr/include/cudnn_version.h", "/usr/include/x86_64-linux-gnu/cudnn_version_v9.h")
_LIB_DIRS = (
    "/usr/local/cuda/lib64",
    "/usr/local/cuda/targets/*/lib",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu/tegra",
    "/usr/lib64",
)
_ARCH_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}


class ProbeSource(Protocol):
    """Where the probe's raw facts come from (the live system or a recording)."""

    def system(self) -> str: ...  # platform.system(): "Linux", "Darwin", "Windows"

    def machine(self) -> str: ...  # platform.machine(): "x86_64", "aarch64", "armv7l"

    def python_version(self) -> str: ...

    def run(self, argv: Sequence[str]) -> str | None: ...  # stdout, or None if absent / failed

    def read(self, path: str) -> str | None: ...

    def libraries(self) -> list[str]: ...  # shared-library file names or paths the loader can find


class SystemProbe:
    """The live machine. Commands time out quickly; nothing here needs privileges."""

    def __init__(self, timeout_s: float = 15.0) -> None:
        self.timeout_s = timeout_s

    def system(self) -> str:
        return platform.system()

    def machine(self) -> str:
        return platform.machine()

    def python_version(self) -> str:
        return ".".join(str(p) for p in sys.version_info[:3])

    def run(self, argv: Sequence[str]) -> str | None:
        try:
            proc = subprocess.run(
                list(argv), capture_output=True, text=True, timeout=self.timeout_s, check=False
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return proc.stdout if proc.returncode == 0 else None

    def read(self, path: str) -> str | None:
        try:
            return Path(path).read_bytes().decode("utf-8", "replace")
        except OSError:
            return None

    def libraries(self) -> list[str]:
        found: list[str] = []
        out = self.run(("ldconfig", "-p")) or self.run(("/sbin/ldconfig", "-p")) or ""
        for line in out.splitlines():
            if "=>" in line:
                found.append(line.rsplit("=>", 1)[1].strip())
        for folder in _LIB_DIRS:
            for path in glob.glob(os.path.join(folder, "lib*.so*")):
                found.append(path)
        for var in ("LD_LIBRARY_PATH",):
            for folder in os.environ.get(var, "").split(os.pathsep):
                if folder:
                    found.extend(glob.glob(os.path.join(folder, "lib*.so*")))
        return sorted(set(found))


@dataclass
class RecordedProbe:
    """A recording of a machine: what each command printed, what each file held, which libraries exist.

    JSON shape: `{"system", "machine", "python", "commands": {"nvidia-smi ...": stdout},
    "files": {path: text}, "libraries": [...]}`; a command or file absent from the recording behaves as
    absent on the machine.
    """

    system_name: str = "Linux"
    machine_name: str = "x86_64"
    python: str = "3.11.7"
    commands: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    libs: list[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RecordedProbe:
        return cls(
            system_name=str(data.get("system", "Linux")),
            machine_name=str(data.get("machine", "x86_64")),
            python=str(data.get("python", "3.11.7")),
            commands={str(k): str(v) for k, v in dict(data.get("commands", {})).items()},
            files={str(k): str(v) for k, v in dict(data.get("files", {})).items()},
            libs=[str(x) for x in data.get("libraries", [])],
        )

    @classmethod
    def load(cls, path: Path | str) -> RecordedProbe:
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    def system(self) -> str:
        return self.system_name

    def machine(self) -> str:
        return self.machine_name

    def python_version(self) -> str:
        return self.python

    def run(self, argv: Sequence[str]) -> str | None:
        return self.commands.get(" ".join(argv))

    def read(self, path: str) -> str | None:
        return self.files.get(path)

    def libraries(self) -> list[str]:
        return list(self.libs)


@dataclass
class GpuInfo:
    name: str
    driver_version: str
    memory_mib: int | None = None
    # the newest CUDA the driver supports ("CUDA Version" in nvidia-smi)
    cuda_driver_version: str | None = None


@dataclass
class JetsonInfo:
    model: str  # "NVIDIA Jetson AGX Orin Developer Kit"
    l4t_version: str | None  # "36.4.0" from /etc/nv_tegra_release
    chip: str | None = None  # "tegra234" from the device tree's compatible list

    @property
    def l4t_major(self) -> str:
        return (self.l4t_version or "").split(".")[0]

    @property
    def jetpack(self) -> str:
        """The JetPack release this L4T belongs to, as far as the device's own files tell."""
        parts = [int(p) if p.isdigit() else 0 for p in (self.l4t_version or "0").split(".")]
        major, minor = parts[0], parts[1] if len(parts) > 1 else 0
        if major == 35:
            return "5.1" if minor >= 2 else "5.0"
        if major == 36:
            return "6.1+" if minor >= 4 else "6.0"
        if major == 38:
            return "7.0"
        if major == 39:
            return "7.2"
        return "unknown"


@dataclass
class PlatformInfo:
    """What the probe found. `accelerator` is the best this machine offers: "jetson", "cuda" or "cpu"."""

    os: str
    architecture: str
    python: str
    os_release: str | None = None
    os_id: str | None = None  # os-release ID: "ubuntu", "debian", "amzn", "raspbian"
    os_version: str | None = None  # os-release VERSION_ID: "22.04", "2023"
    glibc: str | None = None  # "2.35": which manylinux wheels this machine runs
    pythons: list[str] = field(default_factory=list)  # python3.1X on PATH that could run the venv
    gpu: GpuInfo | None = None
    jetson: JetsonInfo | None = None
    cuda_version: str | None = None  # CUDA runtime found on the system (toolkit or libcudart)
    cudnn_version: str | None = None
    tensorrt_version: str | None = None

    @property
    def accelerator(self) -> str:
        if self.jetson is not None:
            return "jetson"
        if self.gpu is not None and (self.gpu.cuda_driver_version or self.cuda_version):
            return "cuda"
        return "cpu"

    @property
    def python_minor(self) -> str:
        """ "3.10" of "3.10.12"."""
        return ".".join(self.python.split(".")[:2])

    def platform_tags(self) -> list[str]:
        """The wheel platform tags pip accepts on this machine, most specific first (pip's
        `--platform` takes them one by one: it does not widen manylinux_2_35 to older glibcs)."""
        if self.os != "linux":
            return []
        arch = self.architecture
        tags: list[str] = []
        minor = int(self.glibc.split(".")[1]) if self.glibc and self.glibc.count(".") == 1 else 17
        for m in range(max(minor, 17), 16, -1):
            tags.append(f"manylinux_2_{m}_{arch}")
        tags.append(f"manylinux2014_{arch}")
        if arch == "x86_64":
            if minor >= 12:
                tags.append(f"manylinux2010_{arch}")
            if minor >= 5:
                tags.append(f"manylinux1_{arch}")
        tags.append(f"linux_{arch}")  # wheels built on the device's own kind (Jetson indexes)
        return tags

    @property
    def cuda_major(self) -> str | None:
        """The CUDA major version the machine can run: the driver's, else the runtime's."""
        version = (self.gpu.cuda_driver_version if self.gpu else None) or self.cuda_version
        return version.split(".")[0] if version else None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["accelerator"] = self.accelerator
        return data


# --------------------------------------------------------------------------------------------- parsing


def _lib_version(libs: Sequence[str], stem: str) -> str | None:
    """Highest version in `stem.so.X[.Y[.Z]]` among the library names (e.g. libnvinfer.so.10.3.0)."""
    best: tuple[int, ...] | None = None
    pattern = re.compile(rf"(?:^|/){re.escape(stem)}\.so\.(\d+(?:\.\d+)*)$")
    for lib in libs:
        m = pattern.search(lib)
        if m:
            version = tuple(int(p) for p in m.group(1).split("."))
            if best is None or version > best:
                best = version
    return ".".join(str(p) for p in best) if best is not None else None


def _parse_gpu(query: str | None, smi: str | None) -> GpuInfo | None:
    if not query or not query.strip():
        return None
    first = query.strip().splitlines()[0]
    parts = [p.strip() for p in first.split(",")]
    if len(parts) < 2 or not parts[0]:
        return None
    memory: int | None = None
    if len(parts) > 2:
        try:
            memory = int(float(parts[2]))
        except ValueError:
            memory = None
    cuda = None
    if smi:
        m = re.search(r"CUDA Version:\s*([0-9.]+)", smi)
        cuda = m.group(1) if m else None
    return GpuInfo(name=parts[0], driver_version=parts[1], memory_mib=memory, cuda_driver_version=cuda)


def _parse_tegra_release(text: str | None) -> str | None:
    # "# R36 (release), REVISION: 4.0, GCID: 37537400, BOARD: generic, EABI: aarch64, DATE: ..."
    if not text:
        return None
    m = re.search(r"R(\d+)\s*\(release\),\s*REVISION:\s*([0-9.]+)", text)
    if not m:
        return None
    revision = m.group(2)
    return f"{m.group(1)}.{revision}" if revision.count(".") >= 1 else f"{m.group(1)}.{revision}.0"


def _parse_header_version(text: str | None, prefixes: Sequence[str]) -> str | None:
    if not text:
        return None
    for prefix in prefixes:
        parts = []
        for key in ("MAJOR", "MINOR", "PATCHLEVEL" if prefix == "CUDNN_" else "PATCH"):
            m = re.search(rf"#define\s+{prefix}{key}\s+(\d+)", text)
            if not m:
                break
            parts.append(m.group(1))
        if len(parts) == 3:
            return ".".join(parts)
    return None


def _os_field(text: str | None, key: str) -> str | None:
    if not text:
        return None
    m = re.search(rf'^{key}="?([^"\n]*)"?', text, re.MULTILINE)
    return m.group(1).strip() if m else None


def _os_release(text: str | None) -> str | None:
    return _os_field(text, "PRETTY_NAME")


def _glibc(ldd: str | None) -> str | None:
    # "ldd (Ubuntu GLIBC 2.35-0ubuntu3.8) 2.35"; musl's ldd prints no version to stdout
    first = (ldd or "").strip().splitlines()[:1]
    m = re.search(r"(\d+\.\d+)\s*$", first[0]) if first else None
    return m.group(1) if m and "libc" in first[0].lower() else None


def _tegra_chip(compatible: str | None) -> str | None:
    for entry in (compatible or "").replace("\x00", "\n").splitlines():
        m = re.fullmatch(r"nvidia,(tegra\d+)", entry.strip())
        if m:
            return m.group(1)
    return None


def probe(source: ProbeSource | None = None) -> PlatformInfo:
    """Detect the platform through `source` (the live system by default)."""
    src: ProbeSource = source if source is not None else SystemProbe()
    arch = src.machine().strip().lower()
    arch = _ARCH_ALIASES.get(arch, arch)
    os_release = src.read(OS_RELEASE)
    info = PlatformInfo(
        os=src.system().strip().lower(),
        architecture=arch,
        python=src.python_version(),
        os_release=_os_release(os_release),
        os_id=_os_field(os_release, "ID"),
        os_version=_os_field(os_release, "VERSION_ID"),
    )
    if info.os != "linux":
        return info  # GPU probing below is Linux-only; the allow-list refuses other systems anyway

    info.glibc = _glibc(src.run(LDD_VERSION))
    if info.glibc is None and isinstance(src, SystemProbe):
        libc, version = platform.libc_ver()
        info.glibc = version if libc == "glibc" and version else None
    info.pythons = [name for name in CANDIDATES if src.run((name, "--version")) is not None]
    libs = src.libraries()
    tegra = src.read(TEGRA_RELEASE)
    model = src.read(DEVICE_TREE_MODEL)
    model_name = model.replace("\x00", "").strip() if model else ""
    chip = _tegra_chip(src.read(DEVICE_TREE_COMPATIBLE))
    if tegra is not None or chip is not None or "jetson" in model_name.lower():
        info.jetson = JetsonInfo(
            model=model_name or "NVIDIA Jetson", l4t_version=_parse_tegra_release(tegra), chip=chip
        )

    info.gpu = _parse_gpu(src.run(NVIDIA_SMI_QUERY), src.run(NVIDIA_SMI))

    cuda_json = src.read(CUDA_VERSION_JSON)
    if cuda_json:
        try:
            info.cuda_version = str(json.loads(cuda_json)["cuda"]["version"])
        except (ValueError, KeyError, TypeError):
            info.cuda_version = None
    if info.cuda_version is None:
        info.cuda_version = _lib_version(libs, "libcudart")

    info.cudnn_version = None
    for header in CUDNN_HEADERS:
        info.cudnn_version = _parse_header_version(src.read(header), ("CUDNN_",))
        if info.cudnn_version:
            break
    if info.cudnn_version is None:
        info.cudnn_version = _lib_version(libs, "libcudnn")
    info.tensorrt_version = _lib_version(libs, "libnvinfer")
    return info
