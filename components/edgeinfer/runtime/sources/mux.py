"""Frames of several sources on one model, gathered into one batch (DeepStream's stream muxer).

Streams rarely send their frames at the same instant: with a fast engine each frame would find it idle
and run alone, and four streams would cost four runs where one batch does. `FrameMux` holds a
source's frame up to `window_s` for a frame of every other connected source on the same model, then
hands them to the server together, so they reach the model's batcher back to back and run as one
batch. A source that is lost (or not there yet) is not waited for; a model that one source uses is
not held at all. The submitting source's thread waits for its round (it reads no frame meanwhile,
and the latest frame wins after it as before).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeinfer.runtime.sources.runner import FrameSink

log = logging.getLogger(__name__)


@dataclass
class _Frame:
    frame_id: str
    image: np.ndarray
    kw: dict[str, Any]
    ok: bool = False
    done: bool = False


@dataclass
class _Round:
    deadline: float
    frames: list[_Frame] = field(default_factory=list)


class FrameMux:
    """A `FrameSink` in front of the server. `members(model)`: the sources now sending to `model`."""

    def __init__(
        self,
        sink: FrameSink,
        members: Callable[[str], int],
        window_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sink = sink
        self.members = members
        self.window_s = window_s
        self.clock = clock
        self.rounds = 0  # rounds handed on, and …
        self.gathered = 0  # … the frames in them (a mean above 1: frames went together)
        self._cond = threading.Condition()
        self._open: dict[str, _Round] = {}

    def submit_frame(self, frame_id: str, image: np.ndarray, *, model: str = "", **kw: Any) -> bool:
        expected = self.members(model)
        if self.window_s <= 0 or expected <= 1:
            return self.sink.submit_frame(frame_id, image, model=model, **kw)
        frame = _Frame(frame_id, image, {**kw, "model": model})
        with self._cond:
            current = self._open.get(model)
            if current is None:
                current = self._open[model] = _Round(self.clock() + self.window_s)
            current.frames.append(frame)
            if len(current.frames) >= expected:
                self._flush(model, current)
            while not frame.done:
                left = current.deadline - self.clock()
                if left <= 0:
                    self._flush(model, current)
                else:
                    self._cond.wait(left)
            return frame.ok

    def _flush(self, model: str, current: _Round) -> None:
        """Hand a round's frames on, back to back (under the lock: each is a quick enqueue)."""
        if self._open.get(model) is not current:
            return
        del self._open[model]
        for frame in current.frames:
            try:
                frame.ok = self.sink.submit_frame(frame.frame_id, frame.image, **frame.kw)
            except Exception:  # not taken; and the frames after it still go on, each answered
                log.exception("frame %s: not submitted", frame.frame_id)
            finally:
                frame.done = True
        self.rounds += 1
        self.gathered += len(current.frames)
        self._cond.notify_all()
