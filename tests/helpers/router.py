"""Helpers shared by the router tests (imported as `router_helpers`; pytest puts this folder on sys.path)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import cv2
import numpy as np

from edgeinfer.messages import ErrorCode, ModelRef, Prediction
from edgeinfer_cloud.router.backends import BackendError, Job, Outcome


def jpeg(seed: int = 0, size: int = 32) -> bytes:
    rng = np.random.default_rng(seed)
    ok, buf = cv2.imencode(".jpg", rng.integers(0, 256, (size, size, 3), dtype=np.uint8))
    assert ok
    return bytes(buf)


class FakeBackend:
    """Answers every job with one prediction after `delay_s`; `fail` makes the backend fail."""

    def __init__(self, name: str = "fake", delay_s: float = 0.0, max_batch_size: int = 4) -> None:
        self.model_ref = ModelRef(name, "1", "fp32")
        self.provider = "cpu"
        self.max_batch_size = max_batch_size
        self.delay_s = delay_s
        self.fail: str | None = None
        self.calls: list[int] = []
        self.entered = 0  # infer() calls begun, counted before they wait on the gate
        self.gate = threading.Event()
        self.gate.set()

    def serves(self, model: str | None) -> bool:
        return model in (None, self.model_ref.name)

    def infer(self, jobs: Sequence[Job]) -> list[Outcome]:
        self.entered += 1
        self.gate.wait(10)
        self.calls.append(len(jobs))
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.fail:
            raise BackendError(self.fail)
        out = []
        for job in jobs:
            if job.image.startswith(b"BAD"):
                out.append(Outcome(code=ErrorCode.BAD_IMAGE, message="not an image"))
            else:
                out.append(Outcome(predictions=[Prediction(7, "cock", 0.75)], inference_ms=1.0))
        return out

    def close(self) -> None:
        pass
