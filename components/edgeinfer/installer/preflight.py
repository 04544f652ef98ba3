"""The installer's first check: an interpreter it can make the venv from, said in one line when not.

Greengrass runs the Install step with whatever `python` the configuration names (`python3` by
default), and on the devices users run that is anything from Python 3.7 (Amazon Linux 2) to 3.13
(Raspberry Pi OS trixie). This module is imported before anything else of the installer and keeps to
what Python 3.7 can import and run, so that an old interpreter gets the one line that names what to
set or install instead of a traceback.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence

MIN_PYTHON = (3, 10)
# The interpreters the installer looks for on PATH, newest first (the pins cover 3.10-3.13).
CANDIDATES = ("python3.13", "python3.12", "python3.11", "python3.10")
OS_RELEASE = "/etc/os-release"
COMPONENT = "com.edgeinfer.RuntimeInstaller"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def _os_field(text: str, key: str) -> str | None:
    m = re.search(rf'^{key}="?([^"\n]*)"?', text, re.MULTILINE)
    return m.group(1).strip() if m else None


def install_hint(os_id: str | None, os_version: str | None) -> tuple[str, str]:
    """How this OS gets a Python >= 3.10 with venv (its own package where it has one), and the name
    of that interpreter."""
    osid = (os_id or "").lower()
    ver = _version(os_version or "")
    if osid == "ubuntu":
        if ver and ver < (22, 4):
            return (
                "install one: sudo add-apt-repository ppa:deadsnakes/ppa && "
                "sudo apt install python3.10 python3.10-venv",
                "python3.10",
            )
        own = "python3.12" if ver >= (24, 4) else "python3.10"
        return f"install one: sudo apt install {own} {own}-venv", own
    if osid in ("debian", "raspbian"):
        if ver and ver < (12,):
            return (
                "upgrade to Debian 12 or newer (Python 3.11), or install Python 3.10+ yourself",
                "python3.11",
            )
        return "install one: sudo apt install python3 python3-venv", "python3"
    if osid == "amzn" and ver and ver[0] == 2:
        return (
            "Amazon Linux 2 is out of support: move to Amazon Linux 2023 (dnf install python3.11)",
            "python3.11",
        )
    if osid in ("amzn", "rhel", "centos", "rocky", "almalinux", "fedora", "ol"):
        return "install one: sudo dnf install python3.11", "python3.11"
    return "install Python 3.10, 3.11, 3.12 or 3.13 with its venv module", "python3.11"


def interpreter_refusal(
    python: str,
    *,
    os_id: str | None = None,
    os_version: str | None = None,
    available: Iterable[str] = (),
    executable: str = "",
) -> str | None:
    """None when Python `python` ("3.8.10") can run the installer, else the one line saying why and
    what to set (an interpreter on PATH that can) or install (this OS's package)."""
    version = _version(python)
    if version >= MIN_PYTHON:
        return None
    where = f" ({executable})" if executable else ""
    head = f"Python {python}{where} is too old: the edgeinfer venv needs Python 3.10 to 3.13"
    usable = [name for name in available if _version(name.replace("python", "")) >= MIN_PYTHON]
    if usable:
        return f"{head}; {usable[0]} is installed: set python: {usable[0]} in {COMPONENT}'s configuration"
    hint, name = install_hint(os_id, os_version)
    return f"{head}; {hint}, then set python: {name} in {COMPONENT}'s configuration"


def venv_refusal(
    python: str,
    version: str,
    *,
    os_id: str | None = None,
    run: Callable[[Sequence[str]], bool] | None = None,
) -> str | None:
    """None when interpreter `python` (Python `version`) can make a venv with pip in it, else one
    line naming the package to install. Debian and Ubuntu ship `venv` and `ensurepip` apart from
    python3.X itself (python3.X-venv); without them `python -m venv` fails halfway."""
    if run is None:
        run = _imports
    if run([python, "-c", "import venv, ensurepip"]):
        return None
    minor = ".".join(version.split(".")[:2])
    osid = (os_id or "").lower()
    if osid in ("ubuntu", "debian", "raspbian"):
        fix = f"sudo apt install python{minor}-venv"
    elif osid in ("amzn", "rhel", "centos", "rocky", "almalinux", "fedora", "ol"):
        fix = f"sudo dnf install python{minor}"
    else:
        fix = f"install the venv and ensurepip modules of Python {minor}"
    return f"{python} (Python {minor}) cannot make a venv: it has no venv/ensurepip module; {fix}"


def _imports(argv: Sequence[str]) -> bool:
    if argv[0] == sys.executable:
        return all(importlib.util.find_spec(m) is not None for m in ("venv", "ensurepip"))
    try:
        return subprocess.run(list(argv), capture_output=True, timeout=60, check=False).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _runs(name: str) -> bool:
    """`name` is on PATH and runs (a pyenv shim of a version not selected is on PATH, and fails)."""
    if shutil.which(name) is None:
        return False
    try:
        return (
            subprocess.run([name, "--version"], capture_output=True, timeout=30, check=False).returncode == 0
        )
    except (OSError, subprocess.SubprocessError):
        return False


def check_running_interpreter() -> str | None:
    """The interpreter check of the live machine, for `python -m edgeinfer.installer`."""
    info = sys.version_info
    python = f"{info[0]}.{info[1]}.{info[2]}"
    os_id = os_version = None
    try:
        with open(OS_RELEASE, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        os_id, os_version = _os_field(text, "ID"), _os_field(text, "VERSION_ID")
    except OSError:
        pass
    available = [name for name in CANDIDATES if _runs(name)]
    return interpreter_refusal(
        python, os_id=os_id, os_version=os_version, available=available, executable=sys.executable
    )
