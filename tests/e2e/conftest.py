"""Fixtures shared by the end-to-end tests on the simulated core."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import PROJECT

ROOT = PROJECT


@pytest.fixture(scope="session")
def write_tiny_store() -> Callable[[Path], Path]:
    """Writes the runtime unit tests' tiny classifier as a model store into a folder: the whole
    device path in seconds, where a test does not need the real model's predictions."""
    pytest.importorskip("onnx")
    from tests.helpers.tiny_store import write_tiny_store as write

    return lambda folder: Path(write(folder))
