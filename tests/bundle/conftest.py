"""Fixtures of the bundle tests (the fake model store: tests/model_store_fixtures.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeinfer import __version__
from tests.helpers.model_store import write_model_store


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    folder = tmp_path / "artifacts"
    write_model_store(folder / "com.edgeinfer.ModelStore" / __version__)
    return folder
