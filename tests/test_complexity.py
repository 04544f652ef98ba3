"""Functions a reader holds: ruff's C901 at the project's line (pyproject.toml), with few exceptions.

`make lint` runs ruff with the project's own configuration, so a function over the line fails there
unless it carries `# noqa: C901`. This guard counts those exceptions: a noqa is for a function that is
honestly a table or a parser and says why, not a way around the line.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import PROJECT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the test venv is 3.11
    import tomli as tomllib

ROOTS = ["components", "cloud", "bench"]
MAX_EXCEPTIONS = 5  # functions over the line, each with its noqa and its reason
CEILING = 30  # no function past this, noqa or not
TOO_COMPLEX = re.compile(r"too complex \((\d+) > (\d+)\)")


def _ruff() -> str:
    found = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if found is None:
        pytest.skip("ruff is not installed")
    return found


def _over_the_line() -> list[tuple[str, int]]:
    """Every function over the configured complexity, noqa or not: (place, complexity)."""
    out = subprocess.run(
        [_ruff(), "check", "--select", "C901", "--ignore-noqa", "--output-format", "json", *ROOTS],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        check=False,
    )
    found = []
    for item in json.loads(out.stdout or "[]"):
        match = TOO_COMPLEX.search(item["message"])
        assert match, item["message"]
        place = f"{Path(item['filename']).relative_to(PROJECT)}:{item['location']['row']}"
        found.append((place, int(match.group(1))))
    return found


def test_the_line_is_ruffs_c901_at_18() -> None:
    lint = tomllib.loads((PROJECT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert "C90" in lint["select"]
    assert lint["mccabe"]["max-complexity"] == 18


def test_few_functions_are_over_the_line_and_none_far_over() -> None:
    over = _over_the_line()
    assert len(over) <= MAX_EXCEPTIONS, f"over the line (split them): {over}"
    assert all(n <= CEILING for _, n in over), f"over {CEILING}: {over}"
