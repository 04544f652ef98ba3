"""Suite-wide fixtures. Each package's own fixtures live in tests/<package>/conftest.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import PROJECT
from tests.helpers.tiny_store import write_tiny_store

ROOT = PROJECT


@pytest.fixture(scope="session")
def model_store() -> Path:
    """The built default model store, `artifacts/com.edgeinfer.ModelStore/<edgeinfer.__version__>/`.

    Built once (about 1–2 minutes on 2 cores) and then reused: the build is keyed by a hash of its
    inputs (options, pipeline code, tool versions), so later runs and sessions skip it. Read it with
    `edgeinfer.model.manifest.Manifest.load(model_store)`."""
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    from edgeinfer.model.build import BuildOptions, build

    manifest = build(BuildOptions(artifacts=ROOT / "artifacts"), quiet=True)
    assert manifest.root is not None
    return manifest.root


@pytest.fixture(scope="session")
def detector_store() -> Path:
    """The built default detector (YOLOv3-tiny), `artifacts/models/yolov3-tiny/<version>/`, cached by
    its inputs like `model_store`. Skipped, saying why, only when its weights cannot be downloaded."""
    pytest.importorskip("onnxruntime")
    from edgeinfer.errors import EdgeinferError
    from edgeinfer.model import darknet
    from edgeinfer.model.build import BuildOptions, build

    try:
        darknet.fetch_yolov3_tiny()
    except EdgeinferError as exc:
        pytest.skip(f"the YOLOv3-tiny weights cannot be downloaded here: {exc}")
    manifest = build(BuildOptions(task="detection", artifacts=ROOT / "artifacts"), quiet=True)
    assert manifest.root is not None
    return manifest.root


@pytest.fixture(scope="session")
def tiny_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_store(tmp_path_factory.mktemp("tiny-store"))
