"""Fixtures for the runtime's unit tests: a tiny ONNX classifier in a real model-store layout, and a bus
whose nucleus refuses some topics."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from edgeinfer.model.manifest import Manifest
from edgeinfer.runtime.config import RuntimeConfig
from edgeinfer.runtime.engine import Engine
from edgeinfer.runtime.providers import PlatformInfo
from edgeinfer.transport import MemoryBus, MqttProperties, Target, UnauthorizedError
from tests.helpers.images import solid_jpeg


class GuardedBus(MemoryBus):
    """A MemoryBus whose nucleus refuses publishes on `forbidden/#` (as accessControl would)."""

    def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        target: Target = "local",
        qos: int = 0,
        properties: MqttProperties | None = None,
    ) -> None:
        if topic.startswith("forbidden/"):
            raise UnauthorizedError(f"not authorized to publish to {topic}")
        super().publish(topic, payload, target=target, qos=qos, properties=properties)


@pytest.fixture
def make_engine(tiny_store: Path, tmp_path: Path) -> Callable[..., Engine]:
    def make(cfg: RuntimeConfig | None = None, warm: bool = True) -> Engine:
        cfg = cfg or RuntimeConfig(max_batch_size=4)
        platform = PlatformInfo.detect()
        engine = Engine.create(Manifest.load(tiny_store), cfg, str(tmp_path / "work"), platform=platform)
        if warm:
            engine.warm_up(runs=1)
        return engine

    return make


@pytest.fixture
def jpeg() -> Callable[..., bytes]:
    return solid_jpeg
