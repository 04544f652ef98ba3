"""Fixtures shared by the end-to-end tests on the simulated core."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def write_tiny_store() -> Callable[[Path], Path]:
    """Writes the runtime unit tests' tiny classifier as a model store into a folder: the whole
    device path in seconds, where a test does not need the real model's predictions."""
    pytest.importorskip("onnx")
    spec = importlib.util.spec_from_file_location("_rt_conftest", ROOT / "tests" / "runtime" / "conftest.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return lambda folder: Path(module.write_tiny_store(folder))
