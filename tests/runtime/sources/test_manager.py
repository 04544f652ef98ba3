"""Sources added, removed or changed apply live, by name; the runtime serves each on its model."""

from __future__ import annotations

import argparse
import threading
from pathlib import Path

import numpy as np

from edgeinfer.messages import Result
from edgeinfer.runtime.component import Component
from edgeinfer.runtime.config import SourceConfig, default_recipe_configuration
from edgeinfer.runtime.sources import FrameFormat, FrameReader, SourceManager, SourceRunner
from edgeinfer.transport import MemoryBus
from tests.helpers.images import solid_png
from tests.helpers.wait import eventually

THING = "c1"


class Sink:
    """Answers every frame at once; every model's input is 16 pixels square."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.models: set[str] = set()
        self.lock = threading.Lock()

    def submit_frame(self, frame_id: str, image: np.ndarray, **kw: object) -> bool:
        assert image.shape == (16, 16, 3)
        with self.lock:
            self.ids.append(frame_id)
            self.models.add(str(kw["model"]))
        on_done = kw.get("on_done")
        if callable(on_done):
            on_done()
        return True

    def frame_format(self, model: str) -> FrameFormat | None:
        return (16, False)

    def seen(self, name: str) -> int:
        with self.lock:
            return sum(1 for i in self.ids if i.startswith(f"{name}-"))


def folder(tmp_path: Path, name: str) -> str:
    path = tmp_path / name
    path.mkdir()
    (path / "a.png").write_bytes(solid_png((200, 0, 0)))
    return str(path)


def test_apply_starts_stops_and_restarts_by_name(tmp_path: Path) -> None:
    sink = Sink()
    manager = SourceManager(sink, THING)  # type: ignore[arg-type]
    a = SourceConfig(kind="folder", uri=folder(tmp_path, "a"), rate_hz=50, loop=True, name="a")
    b = SourceConfig(kind="folder", uri=folder(tmp_path, "b"), rate_hz=50, loop=True, name="b", model="m2")
    try:
        manager.apply([a, b])
        eventually(lambda: sink.seen("a") > 2 and sink.seen("b") > 2, what="frames of a and b")
        first_a = manager.get("a")
        b2 = SourceConfig(**{**b.__dict__, "rate_hz": 100.0})
        manager.apply([a, b2])
        assert manager.get("a") is first_a  # untouched
        runner_b = manager.get("b")
        assert runner_b is not None
        assert runner_b.cfg.rate_hz == 100.0
        manager.apply([b2])
        assert manager.get("a") is None
        assert first_a is not None
        assert first_a.finished.wait(10)  # its thread ended
        assert [c.name for c in manager.counters()] == ["b"]
        assert sink.models == {"", "m2"}
        bad = SourceConfig(kind="folder", uri=str(tmp_path / "missing"), name="bad")
        manager.apply([b2, bad])  # a folder that is not there: logged, not kept, nothing else stops
        assert manager.get("bad") is None
        assert manager.get("b") is runner_b
    finally:
        manager.stop()
    assert manager.runners == {}


def test_a_configuration_update_adds_changes_and_removes_sources_without_a_restart(
    tiny_store: Path, tmp_path: Path
) -> None:
    config = default_recipe_configuration()
    config.update({"maxBatchSize": 4, "executionProviders": ["cpu"]})
    config["source"] = {**config["source"], "kind": "folder", "uri": folder(tmp_path, "one"), "loop": True}
    config["source"]["rateHz"] = 20
    bus = MemoryBus(config=config)
    args = argparse.Namespace(model_dir=str(tiny_store), work_dir=str(tmp_path), thing=THING, option=[])
    comp = Component(bus, args)
    comp.start()
    results = f"edgeinfer/{THING}/result"

    def ids(topic: str) -> list[str]:
        return [str(Result.parse(m.payload).id) for m in bus.messages_on(topic)]

    try:
        eventually(lambda: len(ids(results)) >= 2, what="the one source's results")
        assert ids(results)[0] == "folder-1"
        engine = comp.server.engine
        sources = comp.sources
        assert sources is not None
        extra = {"kind": "folder", "uri": folder(tmp_path, "two"), "loop": True, "rateHz": 20}
        extra.update(name="two", resultTopic=f"{results}/two")
        bus.update_configuration(["sources"], [extra])
        eventually(lambda: len(ids(f"{results}/two")) >= 2, what="the added source's results")
        assert ids(f"{results}/two")[0] == "two-1"
        folder_runner = sources.get("folder")
        bus.update_configuration(["sources"], [{**extra, "topK": 1}])  # changed: restarted
        eventually(lambda: any(c.top_k == 1 for c in _cfgs(comp)), what="the changed source")
        assert sources.get("folder") is folder_runner  # the other one ran on
        bus.update_configuration(["sources"], [])
        eventually(lambda: sources.get("two") is None, what="the removed source stopped")
        assert comp.server.engine is engine  # no restart, no new engine
        assert comp.sources is sources
    finally:
        comp.stop()


def _cfgs(comp: Component) -> list[SourceConfig]:
    assert comp.sources is not None
    return [r.cfg for r in comp.sources.runners.values()]


class Gate(FrameReader):
    """A stream whose read waits until the test opens it (`reading`: a read is under way)."""

    def __init__(self) -> None:
        self.reading = threading.Event()
        self.open = threading.Event()

    def read(self) -> np.ndarray | None:
        self.reading.set()
        self.open.wait(60)
        return np.zeros((16, 16, 3), dtype=np.uint8)


class Gated(SourceRunner):
    def __init__(self, gate: Gate, **kw: object) -> None:
        self.gate = gate
        super().__init__(**kw)  # type: ignore[arg-type]

    def open(self) -> FrameReader:
        return self.gate


def test_a_source_is_stopped_without_holding_what_its_thread_needs_and_offers_nothing_after() -> None:
    sink = Sink()
    manager = SourceManager(sink, THING)  # type: ignore[arg-type]
    gate = Gate()
    cfg = SourceConfig(kind="stream", uri="rtsp://cam/1", name="gate")
    runner = Gated(gate, cfg=cfg, sink=manager.mux, thing=THING, size=16)
    runner.stop_wait_s = 60.0  # only the thread's end ends the stop here
    runner.start()
    manager.runners["gate"] = runner
    applied = threading.Event()

    def apply() -> None:
        manager.apply([])
        applied.set()

    try:
        eventually(gate.reading.is_set, what="the source's first read")
        threading.Thread(target=apply, daemon=True).start()
        eventually(runner._stop.is_set, what="the stop asked")
        # on its way to the server the runner's thread asks who sends to its model: not blocked meanwhile
        answered = threading.Event()
        threading.Thread(target=lambda: (manager.sending_to(""), answered.set()), daemon=True).start()
        eventually(answered.is_set, what="sending_to answered while a stop waits")
        assert not applied.is_set()  # the stop still waits for the thread, in its read
    finally:
        gate.open.set()
    eventually(applied.is_set, what="the stop done")
    assert runner.finished.is_set()
    assert sink.seen("gate") == 0  # the frame read as it was stopped is not offered
    assert runner.stats.read == 0
    assert manager.runners == {}
