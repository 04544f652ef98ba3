"""A detect → crop → classify pipeline beside the classifier and the detector from artifacts/, all
served by one runtime on the simulated core (both nuclei) and chosen by `model`: the pipeline's
answer is the detector's own, each detection of a class it crops carrying its crop's classification,
which is the classifier store's own on that crop cut by hand from the same box. The runtime's
`Component` runs in this process on the real awsiotsdk IPC client."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import yaml

from edgeinfer.messages import Result
from edgeinfer.model import infer
from edgeinfer.model.manifest import Manifest
from edgeinfer.model.samples import cat_image
from edgeinfer.runtime.component import Component
from edgeinfer.runtime.config import default_recipe_configuration
from edgeinfer.runtime.decode import to_model_input
from edgeinfer.sim import Simulator
from edgeinfer.sim.testing import RUNTIME, STORE
from edgeinfer.transport.ipc import GreengrassIpcBus
from tests.e2e.test_models_sim import model_component, recipe
from tests.helpers.wait import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

THING = "pipeline-e2e"
INFER = f"edgeinfer/{THING}/infer"
RESULT = f"edgeinfer/{THING}/result"
DETECTOR = "com.example.Detector"
PIPELINE = "objects"
CLASSES = ["motorbike", "cup"]


def read(path: Path) -> np.ndarray:
    frame = cv2.imread(str(path))
    assert frame is not None, path
    return frame


def two_photos(folder: Path) -> Path:
    """The motorcycle and the coffee samples side by side on white: the detector finds a motorbike
    and cups, so one frame has several crops."""
    samples = cat_image().parent
    left, right = (read(samples / name) for name in ("motorcycle.jpg", "coffee.jpg"))
    height = max(left.shape[0], right.shape[0])
    canvas = np.full((height, left.shape[1] + right.shape[1], 3), 255, np.uint8)
    canvas[: left.shape[0], : left.shape[1]] = left
    canvas[: right.shape[0], left.shape[1] :] = right
    path = folder / "pair.jpg"
    assert cv2.imwrite(str(path), canvas, [cv2.IMWRITE_JPEG_QUALITY, 92])
    return path


class Device:
    def __init__(self, sim: Simulator, component: Component) -> None:
        self.sim, self.component = sim, component
        self.results = sim.local_client().subscribe(RESULT)
        self.client = sim.local_client()

    def answers(self, rid: str) -> list[Result]:
        return [r for r in (Result.parse(m.payload) for m in self.results.messages) if r.id == rid]

    def ask(self, rid: str, photo: Path, **fields: Any) -> Result:
        """By `image_path` (nucleus lite carries at most 10,000 bytes in one IPC message)."""
        self.client.publish(INFER, json.dumps({"id": rid, "image_path": str(photo), **fields}))
        eventually(lambda: bool(self.answers(rid)), 60, f"the answer to {rid}")
        return self.answers(rid)[0]


@pytest.fixture(params=["classic", "lite"])
def device(
    request: pytest.FixtureRequest,
    simulator: Callable[..., Simulator],
    model_store: Path,
    detector_store: Path,
    tmp_path: Path,
) -> Iterator[Device]:
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    photos = tmp_path / "photos"
    photos.mkdir()
    access = {
        "aws.greengrass.ipc.pubsub": {
            "p": {"operations": ["*"], "resources": [f"edgeinfer/{THING}/*", "edgeinfer/local/*"]}
        }
    }
    detector = Manifest.load(detector_store).name
    classifier = Manifest.load(model_store).name
    config = default_recipe_configuration()
    config.update(
        {
            "executionProviders": ["CPUExecutionProvider"],
            "maxBatchSize": 4,
            "subscribeIot": False,
            "imageFolders": [str(photos)],
            "accessControl": access,
            "models": [{"component": STORE}, {"component": DETECTOR, "preload": True}],
            "pipelines": {
                PIPELINE: {
                    "detector": detector,
                    "classifier": classifier,
                    "classes": CLASSES,
                    "minScore": 0.5,
                },
            },
        }
    )
    docs = [
        model_component(STORE, model_store),
        model_component(DETECTOR, detector_store),
        recipe(RUNTIME, {"install": "true"}, config),  # the process is this test's
    ]
    for doc in docs:
        (recipes / f"{doc['ComponentName']}.yaml").write_text(yaml.safe_dump(doc))
    sim = simulator(recipes, thing=THING, nucleus=request.param)
    sim.wait_for_state(STORE, "FINISHED")
    sim.wait_for_state(DETECTOR, "FINISHED")
    env = sim.ipc_env(RUNTIME)
    bus = GreengrassIpcBus.connect(env["AWS_GG_NUCLEUS_DOMAIN_SOCKET_FILEPATH_FOR_COMPONENT"], env["SVCUID"])
    args = argparse.Namespace(model_dir="", work_dir=str(sim.root / "work" / RUNTIME), thing=THING, option=[])
    component = Component(bus, args)
    component.start()
    try:
        two_photos(photos)
        models = component.server.models
        eventually(lambda: all(s.engine is not None for s in models.slots), 300, "the detector preloaded")
        yield Device(sim, component)
    finally:
        component.stop()
        bus.close()


def by_hand(store: Path, variant: str, photo: Path, box: tuple[int, int, int, int], size: int) -> list[Any]:
    """The classifier store's own top-5 on `box` cut from `photo`, sized as the runtime sizes an
    image for it, run in a session of this test's."""
    manifest = Manifest.load(store)
    sess, _, _ = infer.open_session(manifest, "CPUExecutionProvider", variant)
    frame = read(photo)
    x0, y0, x1, y1 = box
    image = to_model_input(frame[y0:y1, x0:x1], size, bgr=True)[None]
    (logits,) = sess.run(None, {sess.get_inputs()[0].name: image})
    return infer.top_k(logits[0], manifest.labels(), 5)


def test_classifier_detector_and_pipeline_in_one_runtime_each_crop_classified_as_the_classifier_alone(
    device: Device, model_store: Path, detector_store: Path, tmp_path: Path
) -> None:
    classifier, detector = Manifest.load(model_store), Manifest.load(detector_store)
    photo = tmp_path / "photos" / "pair.jpg"
    plain = device.ask("classified", photo)
    boxes = device.ask("detected", photo, model=detector.name)
    piped = device.ask("piped", photo, model=PIPELINE)
    for res in (plain, boxes, piped):
        assert res.status == "ok", res.error
        assert res.model is not None
    assert plain.model is not None
    assert plain.model.name == classifier.name
    assert boxes.model is not None
    assert boxes.model.name == detector.name
    assert piped.model is not None
    assert piped.model.name == PIPELINE
    assert boxes.detections is not None
    assert piped.detections is not None
    # the pipeline's detections are the detector's own on the same photo
    assert [(d.label, d.box) for d in piped.detections] == [(d.label, d.box) for d in boxes.detections]
    chosen = [d for d in piped.detections if d.label in CLASSES and d.score >= 0.5]
    assert {d.label for d in chosen} == set(CLASSES), [(d.label, d.score) for d in piped.detections]
    assert all(d.classification is None for d in piped.detections if d not in chosen)
    # each crop classified as the classifier store alone classifies that crop, cut by hand
    variant = piped.model.variant.split("+")[1]
    assert variant == plain.model.variant
    engine = device.component.server.models.default.engine
    assert engine is not None
    for d in chosen:
        assert d.classification is not None
        box = (
            int(np.floor(d.box.x_min)),
            int(np.floor(d.box.y_min)),
            int(np.ceil(d.box.x_max)),
            int(np.ceil(d.box.y_max)),
        )
        wanted = by_hand(model_store, variant, photo, box, engine.input_size)
        assert d.classification[0].index == wanted[0][0], (d.label, d.classification, wanted)
        got = [p.score for p in d.classification]
        assert got == pytest.approx([score for _, _, score in wanted], abs=2e-3)
    assert len(device.answers("piped")) == 1
    assert device.ask("again", photo).predictions == plain.predictions  # the classifier alone, as before
