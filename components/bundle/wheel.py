"""A deterministic, dependency-free wheel of the project (pure Python, `py3-none-any`).

setuptools stamps every file with the build time, so two builds of the same sources differ and a
second publish would look like a conflicting version. This builder follows the same package mapping
as setup.py (`edgeinfer` → components/, `edgeinfer.cloud` → cloud/, packages are folders with an
`__init__.py`, package data by the patterns of pyproject.toml) and writes entries in sorted order
with a fixed timestamp, so the same sources always give the same bytes. Takes well under a second.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import io
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

__all__ = ["ROOTS", "WheelError", "build_wheel", "wheel_name"]

ROOTS = {"edgeinfer": "components", "edgeinfer.cloud": "cloud"}
_EPOCH = (1980, 1, 1, 0, 0, 0)
_SKIP_DIRS = {"__pycache__", "greengrass-build", ".mypy_cache", ".pytest_cache"}
_SKIP_FILES = {"gdk-config.json", "recipe.yaml", "recipe.json"}  # GDK project files, not package data


class WheelError(EdgeinferError):
    """The project cannot be packaged (pyproject.toml missing or malformed)."""


def _project(root: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise WheelError(f"cannot read {root / 'pyproject.toml'}: {exc}") from None
    project = data.get("project")
    if not isinstance(project, dict) or "name" not in project or "version" not in project:
        raise WheelError(f"{root / 'pyproject.toml'} has no [project] name and version")
    return data


def wheel_name(root: Path) -> str:
    project = _project(root)["project"]
    return f"{_norm(project['name'])}-{project['version']}-py3-none-any.whl"


def _norm(name: str) -> str:
    return name.replace("-", "_").replace(".", "_")


def _package_files(root: Path, patterns: list[str]) -> Iterator[tuple[str, Path]]:
    """(path inside the wheel, source file) for every module and data file, like setup.py finds them."""
    for package, folder in ROOTS.items():
        base = root / folder
        if not (base / "__init__.py").is_file():
            continue
        stack = [base]
        while stack:
            current = stack.pop()
            rel_pkg = current.relative_to(base).parts
            arc_dir = "/".join([*package.split("."), *rel_pkg])
            for entry in sorted(current.iterdir()):
                if entry.is_dir():
                    nested_root = package == "edgeinfer" and rel_pkg == () and entry.name == "cloud"
                    if entry.name not in _SKIP_DIRS and (entry / "__init__.py").is_file() and not nested_root:
                        stack.append(entry)
                    continue
                if entry.name in _SKIP_FILES:
                    continue
                if entry.suffix == ".py" or any(fnmatch.fnmatch(entry.name, p) for p in patterns):
                    yield f"{arc_dir}/{entry.name}", entry


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


def _entry_points(data: dict[str, Any]) -> str:
    project = data["project"]
    sections = []
    if project.get("scripts"):
        sections.append(("console_scripts", project["scripts"]))
    for group, entries in project.get("entry-points", {}).items():
        sections.append((group, entries))
    return "".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()) + "\n"
        for group, entries in sections
    )


def _record(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(root: Path) -> tuple[str, bytes]:
    """(file name, bytes) of the project's wheel."""
    data = _project(root)
    project = data["project"]
    patterns = list(data.get("tool", {}).get("setuptools", {}).get("package-data", {}).get("*", ["py.typed"]))
    dist_info = f"{_norm(project['name'])}-{project['version']}.dist-info"
    files: list[tuple[str, bytes]] = [(arc, src.read_bytes()) for arc, src in _package_files(root, patterns)]
    if not files:
        raise WheelError(f"no packages found under {root} ({', '.join(ROOTS.values())})")
    files.sort()
    files.append((f"{dist_info}/METADATA", _metadata(data, root).encode()))
    files.append(
        (
            f"{dist_info}/WHEEL",
            b"Wheel-Version: 1.0\nGenerator: edgeinfer-bundle\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
    )
    entry_points = _entry_points(data)
    if entry_points:
        files.append((f"{dist_info}/entry_points.txt", entry_points.encode()))
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
