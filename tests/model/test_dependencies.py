"""The package graph between the model store and the runtime runs one way: the runtime reads a store
through `model.manifest`; the build pipeline never imports the runtime. The math both use (softmax,
top-k, IoU, NMS) is the root package's `edgeinfer.postprocess`."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import PROJECT

PACKAGE = PROJECT / "components" / "edgeinfer"


def _imports(folder: Path) -> dict[str, set[str]]:
    """Every module a package's files import, at any depth (imports inside functions too)."""
    found: dict[str, set[str]] = {}
    for path in sorted(folder.rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names |= {f"{node.module}.{alias.name}" for alias in node.names} | {node.module}
        found[str(path.relative_to(PACKAGE))] = names
    return found


def test_the_model_package_never_imports_the_runtime() -> None:
    reaching = {
        file: sorted(n for n in names if n == "edgeinfer.runtime" or n.startswith("edgeinfer.runtime."))
        for file, names in _imports(PACKAGE / "model").items()
    }
    assert {file: names for file, names in reaching.items() if names} == {}


def test_the_runtime_reads_the_model_package_through_its_manifest_only() -> None:
    reader = "edgeinfer.model.manifest"
    others = {
        name
        for names in _imports(PACKAGE / "runtime").values()
        for name in names
        if name.startswith("edgeinfer.model.") and not (name == reader or name.startswith(reader + "."))
    }
    assert others == set()
