"""The device wheel holds exactly what the recipes' Install and Run steps import, and nothing else."""

from __future__ import annotations

import ast
import io
import re
import zipfile
from pathlib import Path

from edgeinfer.bundle.wheel import SOURCE_ROOT, build_wheel, project_version, wheel_name
from tests.helpers import PROJECT

_ENTRY = re.compile(r"-m\s+(edgeinfer(?:\.\w+)*)")


def _module_file(module: str) -> Path | None:
    path = PROJECT / SOURCE_ROOT / Path(*module.split("."))
    for candidate in (path / "__init__.py", path.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _imports(module: str, file: Path) -> set[str]:
    package = module if file.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return {name for name in found if name.split(".")[0] == "edgeinfer" and _module_file(name)}


def _recipe_entry_points() -> set[str]:
    entries: set[str] = set()
    for recipe in (PROJECT / "recipes").glob("*.yaml"):
        entries |= set(_ENTRY.findall(recipe.read_text(encoding="utf-8")))
    return entries


def device_closure() -> set[str]:
    """Files (under the source root) of every module the recipes' entry points import, at any depth
    (imports inside functions too: a device may reach them), with their packages' `__init__`."""
    todo = [
        f"{entry}.__main__" if _module_file(f"{entry}.__main__") else entry
        for entry in _recipe_entry_points()
    ]
    seen: set[str] = set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        file = _module_file(module)
        assert file is not None, module
        todo += sorted(_imports(module, file))
    return {str(_module_file(m).relative_to(PROJECT / SOURCE_ROOT).as_posix()) for m in seen}  # type: ignore[union-attr]


def test_recipes_name_the_three_code_components() -> None:
    assert _recipe_entry_points() == {"edgeinfer.runtime", "edgeinfer.telemetry", "edgeinfer.installer"}


def test_device_wheel_is_the_import_closure_of_the_recipes() -> None:
    name, data = build_wheel(PROJECT)
    assert name == wheel_name(PROJECT) == f"edgeinfer-{project_version(PROJECT)}-py3-none-any.whl"
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        names = zf.namelist()
    modules = {n for n in names if n.endswith(".py")}
    assert modules == device_closure()
    assert not [n for n in names if n.startswith(("edgeinfer/sim/", "edgeinfer/bundle/", "edgeinfer_"))]
    assert "edgeinfer/model/build.py" not in names
    assert not [
        n for n in names if n.endswith((".jpg", "gdk-config.json", "recipe.yaml")) or "__pycache__" in n
    ]


def test_device_wheel_is_deterministic() -> None:
    assert build_wheel(PROJECT)[1] == build_wheel(PROJECT)[1]
