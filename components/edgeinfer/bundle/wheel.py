"""The device wheel: a deterministic, dependency-free wheel of the device's side of `edgeinfer`.

What a device gets is cut along packages, not listed module by module: the root package's own modules
(the message contract, codec, configuration, errors, files, /proc, stats) and the device packages
whole (`DEVICE_PACKAGES`: installer, runtime, telemetry, transport). Every other subpackage (the
simulator, the bundle tools, the recipe model) stays on the developer's machine, and so do the root
package's command line (`COMMAND_LINE`) and, of `model/`, everything but the store's manifest reader
(`SPLIT_PACKAGES`: the build pipeline sits beside it). A module added to a device package ships
without touching this file. A test checks that the wheel holds the import closure of the recipes'
entry points, that every module in it imports only what it holds, and nothing of the developer's side.

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

__all__ = [
    "COMMAND_LINE",
    "DEVICE_PACKAGES",
    "SOURCE_ROOT",
    "SPLIT_PACKAGES",
    "WheelError",
    "build_wheel",
    "device_files",
    "project_version",
    "wheel_name",
]

SOURCE_ROOT = "components"  # the source root of the `edgeinfer` import package
PACKAGE = "edgeinfer"
# Subpackages a device gets whole, with their data files.
DEVICE_PACKAGES = ("capture", "installer", "runtime", "telemetry", "transport")
# Subpackages that hold device code beside developer tools: of each, a device gets only these files.
# model/: the runtime and installer read a model store through manifest.py; the rest is the pipeline
# that builds the store (torch, onnx), which only a developer runs.
SPLIT_PACKAGES = {"model": ("__init__.py", "manifest.py")}
# The root package's command line: `edgeinfer` and what only its commands use.
COMMAND_LINE = ("__main__.py", "cli.py", "demo.py", "progress.py")
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


def _shipped(file: Path) -> bool:
    return file.is_file() and file.suffix in _DATA and file.name not in _SKIP_FILES


def device_files(root: Path) -> Iterator[tuple[str, Path]]:
    """(path inside the wheel, source file) for every device module and data file."""
    base = root / SOURCE_ROOT
    package = base / PACKAGE
    if not package.is_dir():
        return
    for file in sorted(package.iterdir()):
        if _shipped(file) and file.name not in COMMAND_LINE:
            yield file.relative_to(base).as_posix(), file
    for name in DEVICE_PACKAGES:
        if not (package / name / "__init__.py").is_file():
            raise WheelError(f"device package {package / name} is missing")
        for file in sorted((package / name).rglob("*")):
            rel = file.relative_to(base)
            if _shipped(file) and not _SKIP_DIRS & set(rel.parts):
                yield rel.as_posix(), file
    for name, files in SPLIT_PACKAGES.items():
        for file in (package / name / f for f in files):
            if not file.is_file():
                raise WheelError(f"device module {file} is missing")
            yield file.relative_to(base).as_posix(), file


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
    files: list[tuple[str, bytes]] = [(arc, src.read_bytes()) for arc, src in device_files(root)]
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
