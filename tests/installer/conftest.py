"""Fixtures of the installer tests (helpers in installer_wheels.py)."""

from __future__ import annotations

import importlib.metadata as md
from pathlib import Path

import pytest

from tests.helpers.installer_wheels import ORT_STACK, repack_installed


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "index: asks the package index (pip); skips itself when the index is unreachable"
    )


@pytest.fixture(scope="session")
def ort_wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An offline wheelhouse with ONNX Runtime and its dependencies, repacked from this environment."""
    folder = tmp_path_factory.mktemp("wheelhouse")
    for name in ORT_STACK:
        repack_installed(name, folder)
    return folder


@pytest.fixture(scope="session")
def versions() -> dict[str, str]:
    return {name: md.version(name) for name in ORT_STACK}
