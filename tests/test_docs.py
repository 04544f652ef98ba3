"""The documents agree with the tree: docs/configuration.md's tables are the recipes' defaults, every
repository path and relative link the documents name exists, and the README stays a short read.

Regenerate the tables after changing a recipe's DefaultConfiguration:
`.venv/bin/python -m tests.test_docs --write`.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import PROJECT

README = PROJECT / "README.md"
CONFIGURATION = PROJECT / "docs" / "configuration.md"
# Every Markdown page of the repository's own (not the recorded benchmark tables).
DOCUMENTS = sorted(
    str(path.relative_to(PROJECT))
    for pattern in ("*.md", "docs/*.md", "bench/results/README.md")
    for path in PROJECT.glob(pattern)
)
COMPONENTS = [
    "com.edgeinfer.InferenceRuntime",
    "com.edgeinfer.RuntimeInstaller",
    "com.edgeinfer.Telemetry",
]
# Maps whose keys are data (package names, CUDA majors), shown whole rather than one row a key.
_IDENTIFIER = re.compile(r"^[a-z][A-Za-z0-9]*$")
_COMMENT = re.compile(r"^(?P<indent> *)(?P<key>[^#:\s][^:]*?):(?P<rest>.*?)(?:\s+#\s*(?P<note>.*))?$")


def _recipe_comments(text: str) -> dict[str, str]:
    """Trailing `# comments` of the DefaultConfiguration's keys, by dotted key path."""
    notes: dict[str, str] = {}
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "DefaultConfiguration:")
    base = len(lines[start]) - len(lines[start].lstrip()) + 2
    stack: list[tuple[int, str]] = []
    for line in lines[start + 1 :]:
        if not line.strip() or line.lstrip().startswith(("#", "-")):
            continue
        indent = len(line) - len(line.lstrip())
        if indent < base:
            break
        match = _COMMENT.match(line)
        if match is None:
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match["key"].strip().strip("\"'")))
        if match["note"]:
            notes[".".join(key for _, key in stack)] = match["note"].strip()
    return notes


def _value(value: Any) -> str:
    if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
        names = ", ".join(str(item.get("name", "?")) for item in value)
        return f"{len(value)} rules: {names}"
    return "`" + json.dumps(value, separators=(", ", ": ")) + "`"


def _rows(config: dict[str, Any], notes: dict[str, str], prefix: str = "") -> list[str]:
    rows: list[str] = []
    for key, value in config.items():
        path = f"{prefix}{key}"
        if path == "accessControl":
            continue  # Greengrass's IPC authorization, not this component's settings
        if isinstance(value, dict) and value and all(_IDENTIFIER.match(str(k)) for k in value):
            rows.extend(_rows(value, notes, f"{path}."))
            continue
        note = notes.get(path, "").replace("|", "\\|")
        rows.append(f"| `{path}` | {_value(value)} | {note} |")
    return rows


def _installer_shipped() -> list[tuple[str, Any, str]]:
    from edgeinfer.installer.plan import DEFAULT_ALLOW_LIST, DEFAULT_PINS

    return [
        (
            "allowList",
            DEFAULT_ALLOW_LIST,
            "the hardware allow-list: the first rule that admits the best accelerator found wins; "
            "shipped in the installer, not the recipe; a deployment's allowList replaces it",
        ),
        (
            "pins",
            DEFAULT_PINS,
            "versions per Python minor of the venv; shipped in the installer, not the recipe; a "
            'deployment\'s pins override it per minor and package, an empty version lifts a pin ({"pins": '
            '{"3.10": {"numpy": ""}}})',
        ),
    ]


def _runtime_shipped() -> list[tuple[str, Any, str]]:
    from edgeinfer import config
    from edgeinfer.runtime.config import RuntimeConfig

    # The provider option nodes; the runtime's other keys shipped in code are documented where they
    # are used (docs/capture.md, docs/requests.md).
    whole = config.to_recipe(RuntimeConfig())
    note = "shipped in the runtime, not the recipe; a deployment merges the keys it sets"
    return [
        (f"{node}.{key}", value, f"{label}; {note}")
        for node, label in (
            ("tensorrt", "ONNX Runtime's TensorRT provider option"),
            ("cuda", "ONNX Runtime's CUDA provider option"),
        )
        for key, value in whole[node].items()
    ]


# Keys whose defaults ship with the component's code rather than in its recipe (nucleus lite's
# sub-object budget): key, default, note.
SHIPPED_DEFAULTS: dict[str, Callable[[], list[tuple[str, Any, str]]]] = {
    "com.edgeinfer.InferenceRuntime": _runtime_shipped,
    "com.edgeinfer.RuntimeInstaller": _installer_shipped,
}


def config_table(component: str) -> str:
    """The table of one component's keys, their defaults and notes: those its code ships first, then
    the recipe's with the recipe's notes."""
    text = (PROJECT / "recipes" / f"{component}.yaml").read_text()
    config = yaml.safe_load(text)["ComponentConfiguration"]["DefaultConfiguration"]
    shipped = SHIPPED_DEFAULTS.get(component, list)()
    rows = [f"| `{key}` | {_value(value)} | {note} |" for key, value, note in shipped]
    lines = ["| key | default | note |", "|---|---|---|", *rows, *_rows(config, _recipe_comments(text))]
    return "\n".join(lines)


def placement_table() -> str:
    """The table of the runtime's `placement` keys: `OffloadConfig`'s fields and comments."""
    import inspect

    from edgeinfer import config
    from edgeinfer.runtime.placement.config import OffloadConfig

    defaults = config.to_recipe(OffloadConfig())
    defaults["enabled"] = False  # the policy is opt-in: it runs only where the object says `enabled: true`
    comments = {"enabled": "true: the policy decides edge or cloud per request"}
    for line in inspect.getsource(OffloadConfig).splitlines():
        found = re.match(r"\s+(\w+): [^=]+=.*?#\s*(.*)$", line)
        if found:
            comments[config.key_for(OffloadConfig, found[1])] = found[2].replace("|", "\\|")
    rows = [
        f"| `placement.{key}` | {_value(value)} | {comments.get(key, '')} |"
        for key, value in defaults.items()
    ]
    return "\n".join(["| key | default | note |", "|---|---|---|", *rows])


TABLES: dict[str, Callable[[], str]] = {
    **{component: functools.partial(config_table, component) for component in COMPONENTS},
    "placement": placement_table,
}


def _marker(component: str) -> re.Pattern[str]:
    name = re.escape(component)
    return re.compile(rf"(<!-- config {name} -->)(.*?)(<!-- /config {name} -->)", re.S)


def render(document: str) -> str:
    """The document with every configuration table regenerated from its recipe."""
    for name, table in TABLES.items():
        document = _marker(name).sub(_between_markers(table()), document)
    return document


def _between_markers(table: str) -> Callable[[re.Match[str]], str]:
    return lambda found: f"{found[1]}\n{table}\n{found[3]}"


@pytest.mark.parametrize("name", list(TABLES))
def test_configuration_table_is_the_defaults(name: str) -> None:
    found = _marker(name).search(CONFIGURATION.read_text())
    assert found is not None, f"docs/configuration.md has no <!-- config {name} --> table"
    assert found[2] == f"\n{TABLES[name]()}\n", (
        "docs/configuration.md's table differs from the recipe (or OffloadConfig): "
        "run `.venv/bin/python -m tests.test_docs --write`"
    )


# A path the documents name: one of the repository's top-level folders and something below it.
_PATH = re.compile(r"(?<![\w./-])((?:components|cloud|bench|recipes|tests|docs)/[\w./*{}<>-]*[\w*])")


@pytest.mark.parametrize("document", DOCUMENTS)
def test_paths_named_in_documents_exist(document: str) -> None:
    text = (PROJECT / document).read_text()
    missing = []
    for path in sorted(set(_PATH.findall(text))):
        if any(mark in path for mark in "{}<>"):
            continue  # a pattern (artifacts/<Component>/<Version>), not a path
        if not list(PROJECT.glob(path)) and not (PROJECT / path).exists():
            missing.append(path)
    assert not missing, f"{document} names paths that do not exist: {missing}"


# A relative Markdown link: [text](target#anchor), the target a path in the repository (or empty: this page).
_LINK = re.compile(r"\]\((?![a-z]+:)([^)\s#]*)(?:#([^)\s]*))?\)")
_HEADING = re.compile(r"^#+ (.*)$", re.M)


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    return {
        re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        for title in _HEADING.findall(markdown)
    }


@pytest.mark.parametrize("document", DOCUMENTS)
def test_relative_links_in_documents_resolve(document: str) -> None:
    path = PROJECT / document
    broken = []
    for target, anchor in _LINK.findall(path.read_text()):
        linked = path.parent / target if target else path
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked.read_text()):
            broken.append(f"{target}#{anchor}")
    assert not broken, f"{document} links to files or headings that do not exist: {broken}"


def test_readme_is_a_short_read() -> None:
    # A user reads the README in ten minutes; reference belongs in docs/.
    lines = README.read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines: move reference to docs/"
    opening = "\n".join(lines[:30])
    for command in ("make demo", "make test"):
        assert command in opening, f"`{command}` belongs in the README's first 30 lines"


def test_documents_name_no_old_layout() -> None:
    # The mypy symlink tree's folder is joined here so that a grep of the tree for it finds nothing.
    typing_tree = "/".join(("build", "typing"))
    old = ["components/runtime/", "setup.py", typing_tree, "bench/gpu_check.py", "../shared/"]
    for document in DOCUMENTS:
        text = (PROJECT / document).read_text()
        assert not [word for word in old if word in text], document


def test_nothing_points_outside_the_repository() -> None:
    # The design lives in docs/design.md; a checkout on another machine has nothing beside it.
    outside = ("DESIGN.md", "/work/shared", "../shared/")
    found = []
    for root in ("components", "cloud", "bench", "tests", "recipes"):
        for path in sorted((PROJECT / root).rglob("*")):
            if path.suffix in {".py", ".yaml", ".json", ".sh", ".md"} and path != Path(__file__):
                text = path.read_text(errors="replace")
                found += [f"{path.relative_to(PROJECT)}: {word}" for word in outside if word in text]
    assert not found


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m tests.test_docs --write")
    CONFIGURATION.write_text(render(CONFIGURATION.read_text()))
