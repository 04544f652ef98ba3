"""Wheels for the installer tests, built offline: tiny hand-made wheels and a wheelhouse repacked
from the distributions installed in the test environment (ONNX Runtime and its dependencies)."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as md
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path


def _closure(name: str) -> tuple[str, ...]:
    """`name` and what it requires, as installed here (ONNX Runtime 1.23 also needs sympy and
    coloredlogs; 1.24+ does not)."""
    seen: dict[str, None] = {}
    todo = [name]
    while todo:
        dist = md.distribution(todo.pop())
        key = dist.metadata["Name"]
        if key in seen:
            continue
        seen[key] = None
        for requirement in dist.requires or []:
            if ";" in requirement and "extra ==" in requirement:
                continue
            dep = re.split(r"[\s\[<>=!~;(]", requirement.strip(), maxsplit=1)[0]
            try:
                md.distribution(dep)
            except md.PackageNotFoundError:
                continue  # a marker that excludes it here
            todo.append(dep)
    return tuple(seen)


ORT_STACK = _closure("onnxruntime")


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def make_wheel(
    folder: Path, name: str, version: str, files: Mapping[str, str], requires: tuple[str, ...] = ()
) -> Path:
    """A pure-Python wheel with the given files (path inside the wheel → text)."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = f"{name.replace('-', '_')}-{version}"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    wheel_meta = "Wheel-Version: 1.0\nGenerator: edgeinfer-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    contents = {**files, f"{dist}.dist-info/METADATA": meta, f"{dist}.dist-info/WHEEL": wheel_meta}
    path = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        record = []
        for arc, text in contents.items():
            data = text.encode()
            zf.writestr(arc, data)
            record.append(_record_line(arc, data))
        record.append(f"{dist}.dist-info/RECORD,,")
        zf.writestr(f"{dist}.dist-info/RECORD", "\n".join(record) + "\n")
    return path


def repack_installed(dist_name: str, folder: Path) -> Path:
    """Rebuild the wheel of an installed distribution from its RECORD (stored, not compressed)."""
    dist = md.distribution(dist_name)
    info_dir = next(
        p for p in (dist.files or []) if p.parts[0].endswith(".dist-info") and p.name == "METADATA"
    ).parts[0]
    wheel_meta = (Path(str(dist.locate_file(info_dir))) / "WHEEL").read_text()
    tags = [
        line.split(":", 1)[1].strip().split("-")
        for line in wheel_meta.splitlines()
        if line.startswith("Tag:")
    ]
    tag = "-".join(".".join(dict.fromkeys(t[i] for t in tags)) for i in range(3))
    stem = info_dir[: -len(".dist-info")]
    path = folder / f"{stem}-{tag}.whl"
    skip = {"INSTALLER", "REQUESTED", "direct_url.json", "RECORD"}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        record = []
        for rel in dist.files or []:
            arc = rel.as_posix()
            if arc.startswith("..") or "__pycache__" in rel.parts:
                continue
            if rel.parts[0] == info_dir and rel.name in skip:
                continue
            data = Path(str(dist.locate_file(rel))).read_bytes()
            zf.writestr(arc, data)
            record.append(_record_line(arc, data))
        record.append(f"{info_dir}/RECORD,,")
        zf.writestr(f"{info_dir}/RECORD", "\n".join(record) + "\n")
    return path
