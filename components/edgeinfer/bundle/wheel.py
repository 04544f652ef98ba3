"""The device wheel: a deterministic, dependency-free wheel of what the device components import.

The wheel that `edgeinfer build` ships to every device holds only the modules the four components'
Install and Run steps import (`DEVICE_MODULES`: the message contract, codec, transport, runtime,
telemetry, installer and the model manifest reader); the simulator, the model build pipeline, the
bundle tools, benchmarks and the cloud side stay on the developer's machine. A test checks the list
against the import closure of the recipes' entry points.

setuptools stamps every file with the build time, so two builds of the same sources differ and a
second publish would look like a conflicting version. This builder writes entries in sorted order
with a fixed timestamp, so the same sources always give the same bytes. Takes well under a second.
"""

from __future__ import annotations

import base64
import hashlib
import io
import re
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from edgeinfer.errors import EdgeinferError

__all__ = ["DEVICE_MODULES", "SOURCE_ROOT", "WheelError", "build_wheel", "project_version", "wheel_name"]

SOURCE_ROOT = "components"  # the source root of the `edgeinfer` import package
# Paths under SOURCE_ROOT; a folder stands for every module and data file below it.
DEVICE_MODULES = (
    "edgeinfer/__init__.py",
    "edgeinfer/py.typed",
    "edgeinfer/codec.py",
    "edgeinfer/config.py",
    "edgeinfer/errors.py",
    "edgeinfer/files.py",
    "edgeinfer/messages.py",
    "edgeinfer/procfs.py",
    "edgeinfer/stats.py",
    "edgeinfer/installer/",
    "edgeinfer/model/__init__.py",
    "edgeinfer/model/manifest.py",
    "edgeinfer/runtime/",
    "edgeinfer/telemetry/__init__.py",
    "edgeinfer/telemetry/__main__.py",
    "edgeinfer/telemetry/component.py",
    "edgeinfer/telemetry/histogram.py",
    "edgeinfer/telemetry/prometheus.py",
    "edgeinfer/telemetry/spool.py",
    "edgeinfer/telemetry/system.py",
    "edgeinfer/telemetry/window.py",
    "edgeinfer/transport/__init__.py",
    "edgeinfer/transport/_sdk_codec.py",
    "edgeinfer/transport/base.py",
    "edgeinfer/transport/ipc.py",
    "edgeinfer/transport/ipc_config.py",
    "edgeinfer/transport/memory.py",
)
_EPOCH = (1980, 1, 1, 0, 0, 0)
_SKIP_DIRS = {"__pycache__"}
_SKIP_FILES = {"gdk-config.json", "recipe.yaml", "recipe.json"}  # GDK project files, not package data
_DATA = (".py", ".json", ".typed")
_VERSION = re.compile(r"""^__version__\s*=\s*["']([^"']+)["']""", re.M)


class WheelError(EdgeinferError):
    """The project cannot be packaged (pyproject.toml missing or malformed)."""


def _project(root: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise WheelError(f"cannot read {root / 'pyproject.toml'}: {exc}") from None
    project = data.get("project")
    if not isinstance(project, dict) or "name" not in project:
        raise WheelError(f"{root / 'pyproject.toml'} has no [project] name")
    project["version"] = project_version(root)
    return data


def project_version(root: Path) -> str:
    """The version, written once: `__version__` in the `edgeinfer` package."""
    init = root / SOURCE_ROOT / "edgeinfer" / "__init__.py"
    try:
        match = _VERSION.search(init.read_text(encoding="utf-8"))
    except OSError as exc:
        raise WheelError(f"cannot read {init}: {exc}") from None
    if not match:
        raise WheelError(f"{init} sets no __version__")
    return match.group(1)


def wheel_name(root: Path) -> str:
    return f"{_norm(_project(root)['project']['name'])}-{project_version(root)}-py3-none-any.whl"


def _norm(name: str) -> str:
    return name.replace("-", "_").replace(".", "_")


def _package_files(root: Path) -> Iterator[tuple[str, Path]]:
    """(path inside the wheel, source file) for every device module and data file."""
    base = root / SOURCE_ROOT
    for entry in DEVICE_MODULES:
        path = base / entry
        if entry.endswith("/"):
            for file in sorted(path.rglob("*")):
                rel = file.relative_to(base)
                skip = _SKIP_DIRS & set(rel.parts) or file.name in _SKIP_FILES
                if file.is_file() and file.suffix in _DATA and not skip:
                    yield rel.as_posix(), file
        elif path.is_file():
            yield entry, path
        elif (base / "edgeinfer").is_dir():
            raise WheelError(f"device module {path} is missing")


def _metadata(data: dict[str, Any], root: Path) -> str:
    project = data["project"]
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {project['name']}",
        f"Version: {project['version']}",
    ]
    if project.get("description"):
        lines.append(f"Summary: {project['description']}")
    if project.get("requires-python"):
        lines.append(f"Requires-Python: {project['requires-python']}")
    license_ = project.get("license")
    if isinstance(license_, str) and license_:
        # An SPDX expression; `License:` keeps Metadata-Version 2.1 readable by older pips on devices.
        lines.append(f"License: {license_}")
    elif isinstance(license_, dict) and license_.get("text"):
        lines.append(f"License: {license_['text']}")
    lines += [f"Requires-Dist: {dep}" for dep in project.get("dependencies", [])]
    for extra, deps in project.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {dep}; extra == "{extra}"' for dep in deps]
    readme = root / str(project.get("readme", "README.md"))
    body = readme.read_text(encoding="utf-8") if readme.is_file() else ""
    if body:
        lines.append("Description-Content-Type: text/markdown")
    return "\n".join(lines) + "\n\n" + body


def _record(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(root: Path) -> tuple[str, bytes]:
    """(file name, bytes) of the project's wheel."""
    data = _project(root)
    project = data["project"]
    dist_info = f"{_norm(project['name'])}-{project['version']}.dist-info"
    files: list[tuple[str, bytes]] = [(arc, src.read_bytes()) for arc, src in _package_files(root)]
    if not files:
        raise WheelError(f"no edgeinfer package under {root / SOURCE_ROOT}")
    files.sort()
    files.append((f"{dist_info}/METADATA", _metadata(data, root).encode()))
    files.append(
        (
            f"{dist_info}/WHEEL",
            b"Wheel-Version: 1.0\nGenerator: edgeinfer-bundle\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
    )
    files.append((f"{dist_info}/top_level.txt", b"edgeinfer\n"))
    record = "\n".join(_record(n, b) for n, b in files) + f"\n{dist_info}/RECORD,,\n"
    files.append((f"{dist_info}/RECORD", record.encode()))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, payload in files:
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, payload)
    return wheel_name(root), buffer.getvalue()
