"""FrameMux: frames of the sources on one model go on together; a lone source is never held."""

from __future__ import annotations

import threading

import numpy as np

from edgeinfer.runtime.sources import FrameMux
from tests.helpers.wait import eventually


class Sink:
    def __init__(self) -> None:
        self.batches: list[list[str]] = [[]]
        self.lock = threading.Lock()

    def submit_frame(self, frame_id: str, image: np.ndarray, **kw: object) -> bool:
        with self.lock:
            self.batches[-1].append(f"{kw['model']}:{frame_id}")
        return frame_id != "refused"

    def cut(self) -> None:
        with self.lock:
            self.batches.append([])


def submit(mux: FrameMux, frame_id: str, model: str, out: dict[str, bool]) -> threading.Thread:
    def run() -> None:
        out[frame_id] = mux.submit_frame(frame_id, np.zeros((2, 2, 3), np.uint8), model=model, source="s")

    thread = threading.Thread(target=run, daemon=True)  # a round never ended leaves it spinning
    thread.start()
    return thread


def test_a_round_goes_on_once_every_source_sent_and_each_gets_its_answer() -> None:
    sink, out = Sink(), dict[str, bool]()
    mux = FrameMux(sink, lambda model: 3, window_s=60.0)  # only a full round ends this test
    threads = [submit(mux, i, "m", out) for i in ("a", "refused", "c")]
    for t in threads:
        t.join(60)
    assert sorted(sink.batches[0]) == ["m:a", "m:c", "m:refused"]
    assert out == {"a": True, "refused": False, "c": True}
    assert (mux.rounds, mux.gathered) == (1, 3)


def test_a_round_not_full_goes_on_at_its_window() -> None:
    sink, out = Sink(), dict[str, bool]()
    mux = FrameMux(sink, lambda model: 4, window_s=0.05)
    submit(mux, "a", "m", out).join(60)
    assert out == {"a": True}
    assert sink.batches == [["m:a"]]


def test_a_lone_source_or_a_zero_window_goes_straight_on() -> None:
    sink, out = Sink(), dict[str, bool]()
    FrameMux(sink, lambda model: 1, window_s=60.0).submit_frame("a", np.zeros(1), model="m")
    FrameMux(sink, lambda model: 4, window_s=0.0).submit_frame("b", np.zeros(1), model="m")
    assert sink.batches == [["m:a", "m:b"]]
    assert not out


def test_a_frame_the_server_raises_on_is_not_taken_and_its_round_still_ends() -> None:
    class Raising(Sink):
        def submit_frame(self, frame_id: str, image: np.ndarray, **kw: object) -> bool:
            if frame_id == "boom":
                raise RuntimeError("the server failed")
            return super().submit_frame(frame_id, image, **kw)

    sink, out = Raising(), dict[str, bool]()
    mux = FrameMux(sink, lambda model: 3, window_s=60.0)  # only a full round ends this test
    threads = [submit(mux, "boom", "m", out)]
    # the failing frame first in its round: the frames after it must still be answered
    eventually(lambda: "m" in mux._open and len(mux._open["m"].frames) == 1, what="the first frame held")
    threads += [submit(mux, i, "m", out) for i in ("b", "c")]
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert out == {"boom": False, "b": True, "c": True}
    assert sorted(sink.batches[0]) == ["m:b", "m:c"]
    assert (mux.rounds, mux.gathered) == (1, 3)
