"""The classifier and the detector from artifacts/ served by one runtime on the simulated core (both
nuclei): each its own model component whose install step writes its artifact folder to
`artifacts-path` as the ModelStore's does; a request's `model` picks one, each answer agrees with the
store run by hand on the same photo, and a new version of the detector's component is swapped in
while the classifier's engine stays the same object. The runtime's `Component` runs in this process
on the real awsiotsdk IPC client."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from edgeinfer.messages import Result
from edgeinfer.model import infer
from edgeinfer.model.manifest import Manifest
from edgeinfer.model.samples import cat_image
from edgeinfer.runtime.component import Component
from edgeinfer.sim import Simulator
from edgeinfer.sim.testing import RUNTIME, STORE
from tests.e2e.conftest import model_component, recipe, runtime_config, runtime_in_process
from tests.helpers.wait import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

THING = "models-e2e"
INFER = f"edgeinfer/{THING}/infer"
RESULT = f"edgeinfer/{THING}/result"
DETECTOR = "com.example.Detector"
PHOTO = cat_image().parent / "motorcycle.jpg"


def new_version(store: Path, folder: Path, version: str) -> Path:
    """`store` as another version: its files linked, its manifest rewritten."""
    folder.mkdir(parents=True)
    for path in store.iterdir():
        if path.name != "manifest.json":
            (folder / path.name).symlink_to(path.resolve())
    manifest = json.loads((store / "manifest.json").read_text())
    manifest["version"] = version
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


class Device:
    def __init__(self, sim: Simulator, component: Component) -> None:
        self.sim, self.component = sim, component
        self.results = sim.local_client().subscribe(RESULT)
        self.client = sim.local_client()

    def ask(self, rid: str, photo: Path, **fields: Any) -> Result:
        """By `image_path` (nucleus lite carries at most 10,000 bytes in one IPC message)."""
        self.client.publish(INFER, json.dumps({"id": rid, "image_path": str(photo), **fields}))

        def answers() -> list[Result]:
            return [r for r in (Result.parse(m.payload) for m in self.results.messages) if r.id == rid]

        eventually(lambda: bool(answers()), 60, f"the answer to {rid}")
        return answers()[0]


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
    config = runtime_config(
        THING,
        imageFolders=[str(PHOTO.parent)],
        models=[{"component": STORE}, {"component": DETECTOR, "preload": True}],
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
    with runtime_in_process(sim, THING) as component:
        yield Device(sim, component)


def by_hand_top5(store: Path, variant: str, size: int, detail: int) -> list[int]:
    """The store's own top-5 on the photo decoded as the runtime decodes it (its input size and the
    detail its network looks at), run in a session of this test's."""
    from edgeinfer.runtime.decode import decode_image

    manifest = Manifest.load(store)
    sess, _, _ = infer.open_session(manifest, "CPUExecutionProvider", variant)
    image = decode_image(cat_image().read_bytes(), size, detail=detail)[None]
    (logits,) = sess.run(None, {sess.get_inputs()[0].name: image})
    return [i for i, _, _ in infer.top_k(logits[0], manifest.labels(), 5)]


def by_hand_boxes(store: Path, variant: str) -> dict[str, list[np.ndarray]]:
    manifest = Manifest.load(store)
    sess, _, _ = infer.open_session(manifest, "CPUExecutionProvider", variant)
    labels = manifest.labels()
    found: dict[str, list[np.ndarray]] = {}
    for d in infer.detect(sess, infer.decode(PHOTO), manifest):
        found.setdefault(labels[d.index], []).append(
            np.array([d.box.x_min, d.box.y_min, d.box.x_max, d.box.y_max])
        )
    return found


def test_classifier_and_detector_in_one_runtime_chosen_by_model_then_one_updated(
    device: Device, model_store: Path, detector_store: Path, tmp_path: Path
) -> None:
    classifier, detector = Manifest.load(model_store), Manifest.load(detector_store)
    repo = device.component.server.models
    assert repo.names() == [classifier.name, detector.name]
    cat = cat_image()
    default = device.ask("default", cat)
    named = device.ask("named", cat, model=classifier.name)
    boxes = device.ask("boxes", PHOTO, model=detector.name)
    for res in (default, named, boxes):
        assert res.status == "ok", res.error
        assert res.model is not None
    assert default.model == named.model
    assert default.model is not None
    assert default.model.name == classifier.name
    assert [p.index for p in default.predictions] == [p.index for p in named.predictions]
    # the runtime's answer is the store's own on the same photo (top-5 as run by hand)
    engine = repo.default.engine
    assert engine is not None
    top5 = by_hand_top5(model_store, default.model.variant, engine.input_size, engine.detail)
    assert [p.index for p in default.predictions] == top5
    assert boxes.model is not None
    assert boxes.model.name == detector.name
    assert boxes.detections
    # each object the store finds by hand on the whole photo, found by the runtime within 10 px (the
    # runtime letterboxes a decode of its own; a box scored near the threshold may come and go)
    reference = by_hand_boxes(detector_store, boxes.model.variant)
    assert reference
    for label, wanted in reference.items():
        mine = [
            np.array([d.box.x_min, d.box.y_min, d.box.x_max, d.box.y_max])
            for d in boxes.detections
            if d.label == label
        ]
        assert mine, f"no {label} in {[(d.label, d.score) for d in boxes.detections]}"
        closest = min(np.abs(box - wanted[0]).max() for box in mine)
        assert closest <= 10, f"{label}: {closest:.1f} px from the store's own box"
    # a new version of the detector's component: that model alone swapped in
    cls_slot, det_slot = repo.slots
    cls_engine, det_engine = cls_slot.engine, det_slot.engine
    v2 = new_version(detector_store, tmp_path / "detector-v2", "9.9.9")
    device.sim.update_component(DETECTOR, merge={"folder": str(v2)})
    eventually(lambda: det_slot.engine is not det_engine, 120, "the detector's new engine")
    assert cls_slot.engine is cls_engine  # the classifier's engine untouched
    again = device.ask("again", PHOTO, model=detector.name)
    assert again.model is not None
    assert again.model.version == "9.9.9"
    assert device.ask("still", cat).model == default.model
