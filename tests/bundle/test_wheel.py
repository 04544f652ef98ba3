"""The device wheel, cut along packages: it holds what the recipes' Install and Run steps import, every
module in it imports only what it holds, and nothing of the developer's side ships."""

from __future__ import annotations

import ast
import io
import re
import zipfile
from pathlib import Path

import pytest

from edgeinfer.bundle.wheel import (
    COMMAND_LINE,
    SOURCE_ROOT,
    WheelError,
    build_wheel,
    device_files,
    project_version,
    wheel_name,
)
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


def _wheel_names() -> list[str]:
    name, data = build_wheel(PROJECT)
    assert name == wheel_name(PROJECT) == f"edgeinfer-{project_version(PROJECT)}-py3-none-any.whl"
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return zf.namelist()


def _module_name(path: str) -> str:
    parts = path.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_device_wheel_holds_the_import_closure_of_the_recipes() -> None:
    modules = {n for n in _wheel_names() if n.endswith(".py")}
    assert device_closure() <= modules


def test_every_module_in_the_device_wheel_imports_only_what_the_wheel_holds() -> None:
    modules = {n for n in _wheel_names() if n.endswith(".py")}
    missing = {
        f"{path} imports {name}"
        for path in modules
        for name in _imports(_module_name(path), PROJECT / SOURCE_ROOT / path)
        if str(_module_file(name).relative_to(PROJECT / SOURCE_ROOT).as_posix()) not in modules  # type: ignore[union-attr]
    }
    assert missing == set()


def test_nothing_of_the_developer_side_ships() -> None:
    names = _wheel_names()
    developer = ("edgeinfer/sim/", "edgeinfer/bundle/", "edgeinfer/greengrass/", "edgeinfer_")
    assert not [n for n in names if n.startswith(developer)]
    assert "edgeinfer/model/build.py" not in names
    assert {n for n in names if n.startswith("edgeinfer/model/")} == {
        "edgeinfer/model/__init__.py",
        "edgeinfer/model/manifest.py",
    }
    assert not {f"edgeinfer/{name}" for name in COMMAND_LINE} & set(names)
    assert not [
        n for n in names if n.endswith((".jpg", "gdk-config.json", "recipe.yaml")) or "__pycache__" in n
    ]


def _tree(root: Path, files: list[str]) -> Path:
    (root / "pyproject.toml").write_text('[project]\nname = "edgeinfer"\n', encoding="utf-8")
    for rel in files:
        path = root / SOURCE_ROOT / "edgeinfer" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text('__version__ = "1.0.0"\n' if rel == "__init__.py" else "", encoding="utf-8")
    return root


_DEVICE_TREE = [
    "__init__.py",
    "py.typed",
    "messages.py",
    "capture/__init__.py",
    "installer/__init__.py",
    "runtime/__init__.py",
    "runtime/placement/__init__.py",
    "telemetry/__init__.py",
    "transport/__init__.py",
    "model/__init__.py",
    "model/manifest.py",
]


def test_a_module_added_to_a_device_package_ships_and_one_elsewhere_does_not(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        [
            *_DEVICE_TREE,
            "newcodec.py",
            "runtime/placement/new_rule.py",
            "telemetry/gdk-config.json",
            "model/build.py",
            "sim/__init__.py",
            "newtool/__init__.py",
            "cli.py",
            "demo.py",
        ],
    )
    shipped = {arc for arc, _ in device_files(root)}
    assert shipped == {
        f"edgeinfer/{rel}" for rel in [*_DEVICE_TREE, "newcodec.py", "runtime/placement/new_rule.py"]
    }


@pytest.mark.parametrize("gone", ["runtime/__init__.py", "model/manifest.py"])
def test_a_missing_device_package_or_module_is_an_error(tmp_path: Path, gone: str) -> None:
    root = _tree(tmp_path, [rel for rel in _DEVICE_TREE if rel != gone])
    with pytest.raises(WheelError, match="is missing"):
        build_wheel(root)


def test_device_wheel_is_deterministic() -> None:
    assert build_wheel(PROJECT)[1] == build_wheel(PROJECT)[1]
