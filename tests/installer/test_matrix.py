"""The device matrix: for each device family users run Greengrass on (one recorded probe each), the
plan the installer makes with the default configuration, and — against the package index this
machine reaches — that every wheel of that plan exists for that device's platform and interpreter.

docs/devices.md's "Supported devices" section is generated from MATRIX and checked here:
`.venv/bin/python -m tests.installer.test_matrix --write` rewrites it.

The index checks are pip's own: a full `pip install --dry-run --only-binary=:all: --platform …
--python-version …` of the plan's stack (what pip would install, transitive dependencies included),
and `pip index versions` for the GPU builds of ONNX Runtime, their CUDA/cuDNN wheels and TensorRT's
(hundreds of MB each, so listed rather than fetched). They are marked `index` and skip themselves,
with the reason, when the index does not answer.
"""

from __future__ import annotations

import concurrent.futures
import functools
import re
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from edgeinfer.errors import EdgeinferError
from edgeinfer.installer.install import _pip_env
from edgeinfer.installer.plan import CPU, CUDA, TENSORRT, InstallerConfig, Plan, choose
from edgeinfer.installer.probe import PlatformInfo, RecordedProbe, probe
from tests.helpers import PROJECT

PLATFORMS = Path(__file__).parent / "platforms"
DEVICES_DOC = PROJECT / "docs" / "devices.md"
PYPI = "https://pypi.org/simple/"
TRT, SHORT = TENSORRT, {TENSORRT: "TensorRT", CUDA: "CUDA", CPU: "CPU"}


@dataclass(frozen=True)
class Row:
    probe: str  # tests/installer/platforms/<probe>.json
    device: str
    accelerator: str  # the plan's: "cpu", "cuda", "jetson"; "refused" when the installer refuses
    onnxruntime: str = ""  # the plan's ONNX Runtime requirement
    providers: tuple[str, ...] = ()
    says: str = ""  # in the plan's one warning, or in the refusal: what to set or install
    set_: str = ""  # docs/devices.md: what the user sets for this device


VENV_310 = "nothing (`apt install python3.10-venv` where it is missing)"
VENV_312 = "nothing (`apt install python3.12-venv` where it is missing)"
JETSON_PYPI = "nothing (PyPI's aarch64 build is made for SBSA servers: untested on Jetson)"

MATRIX = [
    Row(
        "rpi_bookworm_arm64",
        "Raspberry Pi OS bookworm 64-bit (Python 3.11)",
        "cpu",
        "onnxruntime==1.32.0",
        (CPU,),
    ),
    Row(
        "rpi_trixie_arm64",
        "Raspberry Pi OS trixie 64-bit (Python 3.13)",
        "cpu",
        "onnxruntime==1.32.0",
        (CPU,),
    ),
    Row(
        "ubuntu2404_x86_64",
        "Ubuntu 24.04 x86-64 (Python 3.12)",
        "cpu",
        "onnxruntime==1.32.0",
        (CPU,),
        set_=VENV_312,
    ),
    Row(
        "ubuntu2404_cuda12",
        "Ubuntu 24.04 x86-64 + NVIDIA, CUDA 12 driver",
        "cuda",
        "onnxruntime-gpu[cuda,cudnn]==1.26.0",
        (TRT, CUDA, CPU),
        set_=VENV_312,
    ),
    Row(
        "ubuntu2404_cuda13",
        "Ubuntu 24.04 x86-64 + NVIDIA, CUDA 13 driver",
        "cuda",
        "onnxruntime-gpu[cuda,cudnn]==1.31.1",
        (TRT, CUDA, CPU),
        set_=VENV_312,
    ),
    Row(
        "ubuntu2204_x86_64",
        "Ubuntu 22.04 x86-64 (Python 3.10)",
        "cpu",
        "onnxruntime==1.23.2",
        (CPU,),
        set_=VENV_310,
    ),
    Row(
        "ubuntu2204_cuda12",
        "Ubuntu 22.04 x86-64 + NVIDIA, CUDA 12 driver",
        "cuda",
        "onnxruntime-gpu[cuda,cudnn]==1.23.2",
        (TRT, CUDA, CPU),
        set_=VENV_310,
    ),
    Row(
        "ubuntu2204_cuda13",
        "Ubuntu 22.04 x86-64 + NVIDIA, CUDA 13 driver",
        "cuda",
        "onnxruntime-gpu[cuda,cudnn]==1.23.2",  # no CUDA 13 build for Python 3.10; the driver runs 12
        (TRT, CUDA, CPU),
        set_=VENV_310,
    ),
    Row(
        "jetson_thor_jp7",
        "Jetson Thor, JetPack 7.0 (L4T 38, Python 3.12)",
        "jetson",
        "onnxruntime-gpu==1.31.1",
        (TRT, CUDA, CPU),
        set_=JETSON_PYPI,
    ),
    Row(
        "jetson_orin_jp72",
        "Jetson Orin, JetPack 7.2 (L4T 39, Python 3.12)",
        "jetson",
        "onnxruntime-gpu==1.31.1",
        (TRT, CUDA, CPU),
        set_=JETSON_PYPI,
    ),
    Row(
        "jetson_orin_jp6",
        "Jetson Orin, JetPack 6.1/6.2 (L4T 36.4, Python 3.10)",
        "cpu",
        "onnxruntime==1.23.2",
        (CPU,),
        says="set jetsonIndexUrl",
        set_="`jetsonIndexUrl` (an index for JetPack 6: Jetson AI Lab's) or `jetsonWheelUrl` → TensorRT",
    ),
    Row(
        "jetson_orin_jp60",
        "Jetson Orin, JetPack 6.0 (L4T 36.3, Python 3.10)",
        "cpu",
        "onnxruntime==1.23.2",
        (CPU,),
        says="set jetsonIndexUrl",
        set_="`jetsonIndexUrl` / `jetsonWheelUrl` (a cuDNN 8 build) → CUDA; TensorRT 8.6 cannot serve ORT",
    ),
    Row(
        "jetson_xavier_jp5",
        "Jetson Xavier, JetPack 5.1 (L4T 35, Python 3.8)",
        "refused",
        says="set python: python3.10",
        set_="`python: python3.10` (deadsnakes) → CPU; no GPU build of ORT for cp310 on JetPack 5",
    ),
    Row(
        "jetson_orin_jp5",
        "Jetson Orin, JetPack 5.1 (L4T 35, Python 3.8)",
        "refused",
        says="set python: python3.10",
        set_="as Xavier on JetPack 5",
    ),
    Row(
        "ubuntu2004_x86_64",
        "Ubuntu 20.04 x86-64 (Python 3.8)",
        "refused",
        says="apt install python3.10 python3.10-venv",
        set_="`python: python3.10` (deadsnakes PPA)",
    ),
    Row(
        "al2023",
        "Amazon Linux 2023 (Python 3.9)",
        "refused",
        says="dnf install python3.11, then set python: python3.11",
        set_="`dnf install python3.11`, `python: python3.11`",
    ),
    Row(
        "al2023_python311_beside",
        "Amazon Linux 2023 with python3.11 installed",
        "refused",
        says="python3.11 is installed: set python: python3.11",
        set_="`python: python3.11`",
    ),
    Row(
        "al2023_python311",
        "Amazon Linux 2023, `python: python3.11`",
        "cpu",
        "onnxruntime==1.32.0",
        (CPU,),
    ),
    Row(
        "al2",
        "Amazon Linux 2 (Python 3.7)",
        "refused",
        says="Amazon Linux 2 is out of support",
        set_="move to Amazon Linux 2023",
    ),
]


def info_of(row: Row) -> PlatformInfo:
    return probe(RecordedProbe.load(PLATFORMS / f"{row.probe}.json"))


def plan_of(row: Row) -> Plan:
    return choose(info_of(row), InstallerConfig())


@pytest.mark.parametrize("row", MATRIX, ids=[r.probe for r in MATRIX])
def test_the_default_plan_of_each_device(row: Row) -> None:
    if row.accelerator == "refused":
        with pytest.raises(EdgeinferError) as err:
            plan_of(row)
        message = str(err.value)
        assert "\n" not in message
        assert row.says in message
        return
    plan = plan_of(row)
    ort = [r for r in plan.requirements if r.startswith("onnxruntime")]
    assert (plan.accelerator, ort, tuple(plan.expected_providers)) == (
        row.accelerator,
        [row.onnxruntime],
        row.providers,
    )
    if row.says:
        assert len(plan.notes) == 1  # one loud warning, naming the setting
        assert row.says in plan.notes[0]
    else:
        assert plan.notes == []


# ------------------------------------------------------------------------------------ the index


def _pip(args: list[str], timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    # The machine's pip configuration (local mirrors, find-links) is ignored, as the installer does.
    env = _pip_env()
    return subprocess.run(
        [sys.executable, "-m", "pip", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        check=False,
    )


def _target(info: PlatformInfo) -> list[str]:
    args = ["--only-binary=:all:", "--implementation", "cp", "--python-version", info.python_minor]
    for tag in info.platform_tags():
        args += ["--platform", tag]
    return args


def _version_of(requirement: str) -> str:
    m = re.search(r"==\s*([^\s;,]+)", requirement)
    return m.group(1) if m else ""


def _name_of(requirement: str) -> str:
    return re.split(r"[\[=<>!~ ;@]", requirement, maxsplit=1)[0]


@functools.cache
def _reachable(url: str) -> str:
    """'' when `url` answers, else why not."""
    try:
        with urllib.request.urlopen(url, timeout=10):
            return ""
    except urllib.error.HTTPError:
        return ""
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return str(getattr(exc, "reason", exc))


@dataclass(frozen=True)
class Query:
    """One pip question: `install` (a dry run of these requirements with their dependencies) or
    `versions` (the versions of one name with a wheel for the target)."""

    kind: str
    requirements: tuple[str, ...]
    target: tuple[str, ...]
    index: str = ""
    constraints: tuple[str, ...] = ()


def _ask(query: Query) -> tuple[bool, str]:
    index = ["--index-url", query.index] if query.index else []
    if query.kind == "install":
        with tempfile.TemporaryDirectory(prefix="edgeinfer-matrix-") as tmp:
            constraints = Path(tmp) / "constraints.txt"
            constraints.write_text("".join(f"{c}\n" for c in query.constraints))
            args = ["install", "--dry-run", "--ignore-installed", "--quiet", "--target", f"{tmp}/t", *index]
            proc = _pip([*args, *query.target, "-c", str(constraints), *query.requirements])
        lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith("ERROR")]
        return proc.returncode == 0, "; ".join(lines)[-400:]
    name = _name_of(query.requirements[0])
    proc = _pip(["index", "versions", name, *index, *query.target])
    m = re.search(r"Available versions: (.*)", proc.stdout)
    return proc.returncode == 0 and m is not None, m.group(1) if m else (proc.stdout + proc.stderr)[-300:]


# The CUDA and cuDNN wheels that `onnxruntime-gpu[cuda,cudnn]` brings (its metadata's extras).
_GPU_EXTRAS = {
    "12": ("nvidia-cuda-runtime-cu12", "nvidia-cudnn-cu12", "nvidia-cufft-cu12", "nvidia-curand-cu12"),
    "13": ("nvidia-cuda-runtime", "nvidia-cudnn-cu13", "nvidia-cufft", "nvidia-curand"),
}


def queries_of(row: Row) -> list[tuple[str, Query]]:
    """(what it proves, the pip question) for every wheel of this row's plan."""
    info, plan = info_of(row), plan_of(row)
    target = tuple(_target(info))
    constraints = tuple(f"{k}=={v}" for k, v in plan.constraints.items())
    stack = tuple(r for r in plan.requirements if not r.startswith("onnxruntime-gpu"))
    out = [("the stack installs", Query("install", stack, target, constraints=constraints))]
    for requirement in plan.requirements:
        if requirement.startswith("onnxruntime-gpu"):
            out.append((requirement, Query("versions", (requirement,), target)))
            if "[cuda,cudnn]" in requirement:
                version = tuple(int(p) for p in _version_of(requirement).split("."))
                cuda = "13" if version >= (1, 27) else "12"  # PyPI's CUDA 13 builds start at 1.27
                out += [(name, Query("versions", (name,), target)) for name in _GPU_EXTRAS[cuda]]
    for requirement in plan.optional:
        out.append((requirement, Query("versions", (requirement,), target, plan.optional_index_urls[0])))
        # PyPI's own entry (a stub that fetches the wheel from NVIDIA's index when built): the pin
        # names a release NVIDIA published, whether or not NVIDIA's index answers from here.
        out.append((f"{requirement} on PyPI", Query("versions", (requirement,), ())))
    return out


@pytest.fixture(scope="module")
def answers() -> dict[Query, tuple[bool, str]]:
    """Every row's pip questions, asked once each, four at a time."""
    why = _reachable(PYPI)
    if why:
        pytest.skip(f"the package index {PYPI} is unreachable ({why})")
    queries = {q for row in MATRIX if row.accelerator != "refused" for _, q in queries_of(row)}
    asked = [q for q in queries if not q.index or not _reachable(q.index)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(asked, pool.map(_ask, asked), strict=True))


@pytest.mark.index
@pytest.mark.parametrize("row", [r for r in MATRIX if r.accelerator != "refused"], ids=lambda r: r.probe)
def test_every_wheel_of_the_plan_exists_for_the_device(
    row: Row, answers: dict[Query, tuple[bool, str]], record_property: Callable[[str, object], None]
) -> None:
    missing, unasked = [], []
    for what, query in queries_of(row):
        if query not in answers:
            unasked.append(f"{what} ({query.index} is unreachable: {_reachable(query.index)})")
            continue
        ok, said = answers[query]
        version = _version_of(query.requirements[0]) if query.kind == "versions" else ""
        if not ok or (version and version not in [v.strip() for v in said.split(",")]):
            missing.append(f"{what}: {said}")
    record_property("not_asked", unasked)
    assert not missing, f"{row.device}: {missing}"


# ------------------------------------------------------------------------------ docs/devices.md


def _providers(row: Row) -> str:
    return " → ".join(SHORT[p] for p in row.providers)


def devices_section() -> str:
    lines = [
        "## Supported devices",
        "",
        "What the installer does with its default configuration on each device family (recorded probes",
        "in `tests/installer/platforms/`; `tests/installer/test_matrix.py` makes each plan and asks the",
        "package index that every wheel in it exists for that platform and Python). The runtime runs on",
        "the first provider that loads; the installer's provider check on the device records which do in",
        "`platform.json` (TensorRT counts only once it built an engine). TensorRT comes from JetPack on",
        "Jetson and from NVIDIA's `tensorrt-cuNN-libs` wheels on x86-64; where those do not install,",
        "CUDA runs.",
        "",
        "| device | what installs | providers expected, in order | what to set |",
        "|---|---|---|---|",
    ]
    for row in MATRIX:
        if row.accelerator == "refused":
            installs, runs = "nothing: the Install step fails at once with one line", "–"
        else:
            plan = plan_of(row)
            installs = f"`{row.onnxruntime}`, NumPy {plan.constraints.get('numpy', '?')}"
            if plan.optional:
                installs += f", `{plan.optional[0]}`"
            runs = _providers(row)
        lines.append(f"| {row.device} | {installs} | {runs} | {row.set_ or 'nothing'} |")
    lines += [
        "",
        "Pins are per Python minor (`pins` in the installer's configuration): NumPy ≥ 2.3 and ONNX Runtime",
        "≥ 1.24 need Python 3.11, so Python 3.10 gets NumPy 2.2.6 and ONNX Runtime 1.23.2. A GPU the",
        "allow-list refuses, or one no pinned build runs on, gets the CPU build with one warning",
        "(`allowCpuFallback`).",
    ]
    return "\n".join(lines)


_SECTION = re.compile(r"(<!-- devices -->\n)(.*?)(\n<!-- /devices -->)", re.S)


def test_readme_supported_devices_is_the_matrix() -> None:
    found = _SECTION.search(DEVICES_DOC.read_text())
    assert found is not None, "docs/devices.md has no <!-- devices --> section"
    assert found[2] == devices_section(), "run `.venv/bin/python -m tests.installer.test_matrix --write`"


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m tests.installer.test_matrix --write")
    text = DEVICES_DOC.read_text()
    DEVICES_DOC.write_text(_SECTION.sub(lambda m: m[1] + devices_section() + m[3], text))
