"""Pipelines: a detector's boxes cropped and classified, answered as one result. Pure rules on plain
detections, then the runtime with real ONNX Runtime on tiny stores (the tiny detector finds four
boxes on a bright image, anchors alternating `square` and `round`; the tiny classifier answers an
image's mean colour)."""

from __future__ import annotations

import argparse
import base64
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from edgeinfer.messages import Box, Detection, ErrorCode, Prediction, Result
from edgeinfer.model.manifest import Manifest
from edgeinfer.runtime.component import Component
from edgeinfer.runtime.config import PipelineEntry, RuntimeConfig, default_recipe_configuration
from edgeinfer.runtime.decode import to_model_input
from edgeinfer.runtime.pipeline import Pipeline, unknown_model
from edgeinfer.transport import MemoryBus
from tests.helpers.tiny_store import write_tiny_store
from tests.helpers.wait import eventually

THING = "p1"
INFER = f"edgeinfer/{THING}/infer"
RESULT = f"edgeinfer/{THING}/result"
CFG = {"maxBatchSize": 4, "executionProviders": ["cpu"], "lanes": 1, "subscribeIot": False}
# Where the tiny detector's four boxes fall in a 64×64 image (its 32-pixel input, doubled)
QUADRANTS = [(8, 8), (40, 8), (8, 40), (40, 40)]  # top-left corners of 16×16 squares
COLOURS = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 0, 0)]  # RGB: red, green, blue, red


def det(label: str, score: float, box: tuple[float, float, float, float], index: int = 0) -> Detection:
    return Detection(index, label, score, Box(*box))


# ------------------------------------------------------------------------------------------ rules


def test_chosen_by_class_score_and_shorter_side() -> None:
    pipe = Pipeline("p", PipelineEntry("d", "c", classes=["dog", "cat"], min_score=0.5, min_box_size=10))
    found = [
        det("dog", 0.9, (0, 0, 20, 20)),
        det("car", 0.9, (0, 0, 20, 20)),  # not a class it crops
        det("cat", 0.4, (0, 0, 20, 20)),  # scored too low
        det("cat", 0.6, (0, 0, 30, 9.5)),  # too thin
        det("cat", 0.5, (5, 5, 15, 15)),  # at both limits: taken
    ]
    assert pipe.chosen(found) == [0, 4]
    assert Pipeline("all", PipelineEntry("d", "c")).chosen(found) == [0, 1, 2, 3, 4]
    # the best of a crowded frame, in the detector's order
    assert Pipeline("two", PipelineEntry("d", "c", max_crops=2)).chosen(found) == [0, 1]
    assert Pipeline("two", PipelineEntry("d", "c", max_crops=2)).chosen(found[2:]) == [1, 2]


def test_a_crop_is_the_box_as_answered_widened_by_padding_in_whole_pixels_within_the_image() -> None:
    plain = Pipeline("p", PipelineEntry("d", "c"))
    assert plain.crop_box(det("a", 1, (10.24, 20.26, 30.5, 40.0)), 100, 100) == (10, 20, 31, 40)
    padded = Pipeline("p", PipelineEntry("d", "c", padding=0.5))
    assert padded.crop_box(det("a", 1, (10, 10, 30, 20)), 100, 100) == (0, 5, 40, 25)
    assert padded.crop_box(det("a", 1, (90, 90, 100, 100)), 100, 100) == (85, 85, 100, 100)
    assert plain.crop_box(det("a", 1, (100, 50, 100, 50)), 100, 100) == (99, 50, 100, 51)  # never empty


def test_crops_are_cut_from_the_full_image_and_sized_as_the_classifier_takes_an_image() -> None:
    frame = np.zeros((60, 80, 3), np.uint8)
    frame[10:30, 20:40] = (0, 0, 255)  # BGR red
    pipe = Pipeline("p", PipelineEntry("d", "c", classes=["a"]))
    chosen, images = pipe.crops(frame, [det("b", 1, (0, 0, 80, 60)), det("a", 1, (20, 10, 40, 30))], 16)
    assert chosen == [1]
    assert images[0].shape == (16, 16, 3)
    assert (images[0] == (255, 0, 0)).all()  # RGB


def test_an_unknown_name_lists_the_models_and_the_pipelines_and_reads_as_before_without_pipelines() -> None:
    assert unknown_model("x", ["a", "b"], ["p"]) == (
        "unknown model 'x': this runtime serves 'a', 'b' and the pipelines 'p'"
    )
    assert unknown_model("x", ["a"], []) == "unknown model 'x': this runtime serves 'a'"


def test_a_detection_without_classification_is_on_the_wire_as_before_and_one_with_it_round_trips() -> None:
    plain = Detection(1, "dog", 0.5, Box(1, 2, 3, 4))
    assert list(plain.to_dict()) == ["index", "label", "score", "box"]
    classified = Detection(1, "dog", 0.5, Box(1, 2, 3, 4), (Prediction(7, "terrier", 0.75),))
    doc = Result("r", "ok", "", detections=[plain, classified]).to_json()
    back = Result.parse(doc)
    assert back.detections == [plain, classified]


def test_pipelines_are_read_from_configuration_and_refused_with_every_reason() -> None:
    cfg = RuntimeConfig.from_recipe(
        {"pipelines": {"p": {"detector": "d", "classifier": "c", "minScore": "0.3"}}}
    )
    assert cfg.pipelines == {"p": PipelineEntry("d", "c", min_score=0.3)}
    assert "pipelines" not in default_recipe_configuration()  # shipped in code: the recipe stays small
    from edgeinfer.config import ConfigError

    with pytest.raises(ConfigError) as err:
        RuntimeConfig.from_recipe({"pipelines": {"p": {"detector": "d", "padding": 2, "minBoxSize": -1}}})
    assert err.value.reasons == (
        "pipelines.p.classifier: must name a model this runtime serves; pipelines.p.minBoxSize: must be 0 "
        "or more; pipelines.p.padding: must be from 0 to 1"
    )


# ---------------------------------------------------------------------------------------- runtime


def squares_png() -> bytes:
    """64×64, white, with a coloured 16×16 square where each of the tiny detector's boxes falls."""
    img = np.full((64, 64, 3), 255, np.uint8)
    for (x, y), rgb in zip(QUADRANTS, COLOURS, strict=True):
        img[y : y + 16, x : x + 16] = rgb
    ok, buf = cv2.imencode(".png", cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
    assert ok
    return bytes(buf)


def decoded(image: bytes) -> np.ndarray:
    frame = cv2.imdecode(np.frombuffer(image, np.uint8), cv2.IMREAD_COLOR)
    assert frame is not None
    return frame


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.helpers.tiny_detector import build_tiny_detector_store

    root = tmp_path_factory.mktemp("stores")
    out = {}
    for name in ("colours", "shades"):
        folder = write_tiny_store(root / name)
        manifest = Manifest.load(folder)
        manifest.name = name
        manifest.save(folder)
        out[name] = folder
    out["detector"] = build_tiny_detector_store(root / "detector")
    return out


class Device:
    def __init__(self, tmp_path: Path, stores: dict[str, Path], **config: Any) -> None:
        doc = default_recipe_configuration()
        models = [{"dir": str(stores["colours"])}, {"dir": str(stores["detector"]), "preload": True}]
        doc.update({**CFG, "models": models, **config})
        self.bus = MemoryBus(config=doc)
        work = tmp_path / "work" / "com.edgeinfer.InferenceRuntime"
        work.mkdir(parents=True, exist_ok=True)
        args = argparse.Namespace(model_dir="", work_dir=str(work), thing=THING, option=[])
        self.component = Component(self.bus, args)
        self.component.start()
        self.detector = Manifest.load(stores["detector"]).name
        repo = self.component.server.models
        eventually(lambda: all(s.engine is not None for s in repo.slots[:2]), what="both models loaded")

    def send(self, rid: str, image: bytes, **fields: Any) -> None:
        doc = {"id": rid, "image": base64.b64encode(image).decode(), **fields}
        self.bus.publish(INFER, json.dumps(doc).encode())

    def answers(self, rid: str) -> list[Result]:
        return [r for r in (Result.parse(m.payload) for m in self.bus.messages_on(RESULT)) if r.id == rid]

    def ask(self, rid: str, image: bytes, **fields: Any) -> Result:
        self.send(rid, image, **fields)
        eventually(lambda: bool(self.answers(rid)), 30, f"the answer to {rid}")
        return self.answers(rid)[0]


@pytest.fixture
def devices(tmp_path: Path, stores: dict[str, Path]) -> Iterator[list[Device]]:
    made: list[Device] = []
    yield made
    for device in made:
        device.component.stop()


def pipelines(detector: str, **entry: Any) -> dict[str, Any]:
    return {"pipelines": {"shapes": {"detector": detector, "classifier": "colours", **entry}}}


@pytest.mark.devtool  # the tiny detector is built by the model build pipeline
def test_a_pipeline_answers_once_each_chosen_detection_classified_as_the_classifier_alone_classifies_it(
    tmp_path: Path, stores: dict[str, Path], devices: list[Device]
) -> None:
    detector = Manifest.load(stores["detector"]).name
    # a long queue delay: the crops of a frame go as one batch however slowly they are queued
    device = Device(tmp_path, stores, maxQueueDelayUs=500_000, **pipelines(detector, classes=["square"]))
    devices.append(device)
    image = squares_png()
    alone = device.ask("alone", image, model=detector)
    classifier = device.component.server.models.default.engine
    assert classifier is not None
    runs = classifier.executions
    res = device.ask("piped", image, model="shapes", top_k=3)
    assert classifier.executions == runs + 1  # both crops in one batch
    assert res.status == "ok", res.error
    assert res.model is not None
    assert res.model.name == "shapes"
    assert alone.detections is not None
    assert res.detections is not None
    # the detector's own answer, each detection of the class it crops classified
    assert [(d.label, d.box) for d in res.detections] == [(d.label, d.box) for d in alone.detections]
    squares = [d for d in res.detections if d.label == "square"]
    assert len(squares) == 2
    assert all(d.classification is None for d in res.detections if d.label != "square")
    # each crop classified as the classifier alone classifies it: cut by hand from the same box
    engine = device.component.server.models.default.engine
    assert engine is not None
    frame = decoded(image)
    for d in squares:
        assert d.classification is not None
        assert len(d.classification) == 3
        x0, y0 = int(np.floor(d.box.x_min)), int(np.floor(d.box.y_min))
        x1, y1 = int(np.ceil(d.box.x_max)), int(np.ceil(d.box.y_max))
        crop = to_model_input(frame[y0:y1, x0:x1], engine.input_size, bgr=True)
        wanted = engine.top_k(engine.run(crop[None])[0], 3)
        assert [p.label for p in d.classification] == [p.label for p in wanted]
        assert [p.score for p in d.classification] == pytest.approx([p.score for p in wanted], abs=1e-4)
    assert {d.classification[0].label for d in squares if d.classification} == {"red", "blue"}
    assert len(device.answers("piped")) == 1
    slot = device.component.server.models.default
    eventually(lambda: slot.leases == 0, what="the classifier's lease given back with the answer")
    eventually(lambda: device.component.server.inflight.count == 0, what="every request counted out")


@pytest.mark.devtool
def test_crops_of_concurrent_frames_batch_together_on_the_classifier(
    tmp_path: Path, stores: dict[str, Path], devices: list[Device]
) -> None:
    detector = Manifest.load(stores["detector"]).name
    device = Device(tmp_path, stores, maxQueueDelayUs=500_000, **pipelines(detector))
    devices.append(device)
    classifier = device.component.server.models.default.engine
    assert classifier is not None
    runs = classifier.executions
    for i in range(3):
        device.send(f"f{i}", squares_png(), model="shapes")
    for i in range(3):
        rid = f"f{i}"
        eventually(lambda: bool(device.answers(rid)), 30, f"the answer to {rid}")  # noqa: B023
        (res,) = device.answers(rid)
        assert res.status == "ok", res.error
        assert res.detections is not None
        assert all(d.classification for d in res.detections)
    # four crops a frame, batched up to maxBatchSize (4): never one by one
    assert classifier.executions - runs <= 3


@pytest.mark.devtool
def test_errors_in_a_pipeline_are_one_answer_each_with_a_stable_code(
    tmp_path: Path, stores: dict[str, Path], devices: list[Device], caplog: pytest.LogCaptureFixture
) -> None:
    detector = Manifest.load(stores["detector"]).name
    config = {
        "maxBatchSize": 2,
        "maxQueueSize": 2,  # four crops of a frame: two of them find the classifier's queue full
        "pipelines": {
            "full": {"detector": detector, "classifier": "colours"},
            "nowhere": {"detector": detector, "classifier": "missing"},
            "backwards": {"detector": "colours", "classifier": detector},
        },
    }
    with caplog.at_level(logging.WARNING, logger="edgeinfer.runtime.server"):
        device = Device(tmp_path, stores, **config)
    devices.append(device)
    # said at the start, not only to each request
    assert "pipeline 'nowhere': its classifier 'missing' is not served here" in caplog.text
    image = squares_png()
    cases = {
        "full": (ErrorCode.OVERLOADED, "pipeline 'full': a crop on model 'colours': the queue is full"),
        "nowhere": (ErrorCode.INTERNAL, "pipeline 'nowhere': its classifier 'missing' is not served here"),
        "backwards": (ErrorCode.INTERNAL, "pipeline 'backwards': its detector 'colours' is not a detector"),
    }
    for name, (code, why) in cases.items():
        res = device.ask(name, image, model=name)
        assert res.error is not None, name
        assert res.error.code == code, res.error
        assert res.error.message.startswith(why), res.error.message
    unknown = device.ask("x", image, model="nope")
    assert unknown.error is not None
    assert unknown.error.code == ErrorCode.BAD_REQUEST
    assert unknown.error.message == (
        f"unknown model 'nope': this runtime serves 'colours', '{detector}' and the pipelines 'full', "
        "'nowhere', 'backwards'"
    )
    assert device.ask("fine", image).status == "ok"  # the classifier alone serves on
    for rid in (*cases, "x", "fine"):
        assert len(device.answers(rid)) == 1
    eventually(lambda: device.component.server.inflight.count == 0, what="every request counted out")
    assert device.component.server.models.default.leases == 0


@pytest.mark.devtool
def test_a_pipeline_whose_classifier_is_not_loaded_waits_for_its_load_and_is_served(
    tmp_path: Path, stores: dict[str, Path], devices: list[Device]
) -> None:
    detector = Manifest.load(stores["detector"]).name
    models = [
        {"dir": str(stores["colours"])},
        {"dir": str(stores["detector"]), "preload": True},
        {"dir": str(stores["shades"])},
    ]
    pipe = {"pipelines": {"p": {"detector": detector, "classifier": "shades"}}}
    device = Device(tmp_path, stores, models=models, maxLoadedModels=3, **pipe)
    devices.append(device)
    shades = device.component.server.models.slots[2]
    assert shades.engine is None
    res = device.ask("p", squares_png(), model="p", deadline_ms=30_000)
    assert res.status == "ok", res.error
    assert res.detections is not None
    assert all(d.classification for d in res.detections)
    assert shades.engine is not None
    eventually(lambda: shades.leases == 0, what="the classifier's lease given back")


@pytest.mark.devtool
def test_a_pipeline_change_applies_live(
    tmp_path: Path, stores: dict[str, Path], devices: list[Device]
) -> None:
    detector = Manifest.load(stores["detector"]).name
    device = Device(tmp_path, stores)
    devices.append(device)
    before = device.ask("before", squares_png(), model="shapes")
    assert before.error is not None
    assert before.error.code == ErrorCode.BAD_REQUEST
    device.bus.update_configuration(["pipelines"], pipelines(detector)["pipelines"])
    eventually(lambda: "shapes" in device.component.server.pipelines, what="the pipeline served")
    assert device.ask("after", squares_png(), model="shapes").status == "ok"


@pytest.mark.devtool
def test_a_sources_frame_for_a_pipeline_is_served_on_its_detector_and_cropped_from_the_frame(
    tmp_path: Path, stores: dict[str, Path], devices: list[Device]
) -> None:
    import threading

    from edgeinfer.runtime.decode import letterbox

    detector = Manifest.load(stores["detector"]).name
    device = Device(tmp_path, stores, **pipelines(detector, classes=["square"]))
    devices.append(device)
    server = device.component.server
    slot = server.frame_slot("shapes")
    assert slot is not None
    assert slot.name == detector  # a source makes its frames for the pipeline's detector
    assert slot.engine is not None
    frame = decoded(squares_png())
    canvas, geometry = letterbox(frame, slot.engine.input_size, bgr=True)
    done = threading.Event()
    ok = server.submit_frame(
        "cam-1",
        canvas,
        source="cam",
        topic=RESULT,
        target="local",
        top_k=1,
        on_done=done.set,
        geometry=geometry,
        model="shapes",
    )
    assert ok
    eventually(lambda: bool(device.answers("cam-1")), 30, "the frame's answer")
    (res,) = device.answers("cam-1")
    assert res.status == "ok", res.error
    assert res.detections is not None
    squares = [d for d in res.detections if d.label == "square"]
    assert sorted(d.classification[0].label for d in squares if d.classification) == ["blue", "red"]
    assert done.is_set()
    eventually(lambda: server.models.default.leases == 0, what="the classifier's lease given back")


@pytest.mark.devtool
def test_the_deadline_covers_the_classifier_stage_too(
    tmp_path: Path, stores: dict[str, Path], devices: list[Device]
) -> None:
    import time

    detector = Manifest.load(stores["detector"]).name
    device = Device(tmp_path, stores, **pipelines(detector))
    devices.append(device)
    classifier = device.component.server.models.default
    with classifier.engine_lock:  # the classifier's batches wait here: its crops cannot run yet
        sent = time.monotonic()
        device.send("late", squares_png(), model="shapes", deadline_ms=1000)
        eventually(lambda: not classifier.batcher.idle, what="the crops on the classifier")
        eventually(lambda: time.monotonic() - sent > 1.5, 10, "the deadline passed")
        assert not device.answers("late")  # the detector's answer alone is not the pipeline's
    eventually(lambda: bool(device.answers("late")), 30, "the answer")
    (res,) = device.answers("late")
    assert res.error is not None
    assert res.error.code == ErrorCode.DEADLINE_EXCEEDED
    assert res.model is not None
    assert res.model.name == "shapes"
    assert device.ask("next", squares_png(), model="shapes").status == "ok"


@pytest.mark.devtool
def test_crops_that_find_the_classifier_closed_at_stop_are_answered_the_runtime_is_stopping(
    tmp_path: Path, stores: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    detector = Manifest.load(stores["detector"]).name
    # Run on the detector's engine thread (not the arrival's), so that stop() waits for its batch.
    device = Device(tmp_path, stores, runInlineWhenIdle=False, **pipelines(detector))
    server = device.component.server
    classifier, detecting = server.models.slots[0], server.models.slots[1]
    engine = detecting.engine
    assert engine is not None
    run, entered, go = engine.run, threading.Event(), threading.Event()

    def held_run(batch: np.ndarray, *, lane: bool = False) -> np.ndarray:
        entered.set()
        go.wait(30)
        return run(batch, lane=lane)

    monkeypatch.setattr(engine, "run", held_run)
    device.send("last", squares_png(), model="shapes")
    assert entered.wait(30)
    stopping = threading.Thread(target=device.component.stop)
    stopping.start()
    try:
        # The classifier's batcher is closed first (it is the first model): then the crops arrive.
        eventually(lambda: classifier.batcher.closed, 30, "the classifier's batcher closed")
    finally:
        go.set()
        stopping.join(60)
    assert not stopping.is_alive()
    (res,) = device.answers("last")
    assert res.error is not None
    assert (res.error.code, res.error.message) == (
        ErrorCode.INTERNAL,
        "pipeline 'shapes': a crop on model 'colours': the runtime is stopping",
    )
