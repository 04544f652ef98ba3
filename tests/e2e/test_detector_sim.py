"""The inference runtime serving the default detector (YOLOv3-tiny) on the simulated core: Darknet's
person.jpg over IoT Core (mosquitto) and local pub/sub, boxes against FP32's own, bad input codes."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgeinfer.messages import ErrorCode, Result
from edgeinfer.model import infer
from edgeinfer.model.images import DARKNET_DATA
from edgeinfer.model.manifest import Manifest
from edgeinfer.sim import MosquittoBroker, Simulator
from edgeinfer.sim.testing import RUNTIME as COMPONENT
from edgeinfer.sim.testing import prepare_device, wait_ready

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

THING = "det-e2e"
INFER = f"edgeinfer/{THING}/infer"
RESULT = f"edgeinfer/{THING}/result"
PERSON = DARKNET_DATA / "person.jpg"


@pytest.fixture(scope="module")
def photo() -> bytes:
    if not PERSON.is_file():
        pytest.skip(f"Darknet's test photos are not installed ({PERSON}; apt-get install darknet)")
    return PERSON.read_bytes()


@pytest.fixture(scope="module")
def device(
    detector_store: Path, sim_broker: MosquittoBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Simulator]:
    root = tmp_path_factory.mktemp("det-device")
    recipes, artifacts = prepare_device(root / "device", detector_store)
    sim = Simulator(
        recipes,
        artifacts,
        thing=THING,
        work_dir=root / "core",
        broker=sim_broker.address,
        restart_delay=0.1,
        config_merge={COMPONENT: {"maxBatchSize": 4, "maxQueueDelayUs": 5000}},
    )
    sim.start()
    try:
        wait_ready(sim, timeout=240)
        yield sim
    finally:
        sim.stop()


def request(rid: str, image: bytes, **kw: Any) -> dict[str, Any]:
    return {"id": rid, "image": base64.b64encode(image).decode(), **kw}


def fp32_boxes(store: Path) -> dict[str, list[float]]:
    """FP32's best box per class on person.jpg, run here on the whole photo (the graph letterboxes)."""
    manifest = Manifest.load(store)
    sess, _, _ = infer.open_session(manifest, "CPUExecutionProvider", "fp32")
    labels = manifest.labels()
    best: dict[str, list[float]] = {}
    for d in infer.detect(sess, infer.decode(PERSON), manifest):
        best.setdefault(labels[d.index], [d.box.x_min, d.box.y_min, d.box.x_max, d.box.y_max])
    return best


def test_person_horse_and_dog_over_iot_core_within_10_px_of_fp32(
    device: Simulator, detector_store: Path, photo: bytes
) -> None:
    reference = fp32_boxes(detector_store)
    assert {"person", "horse", "dog"} <= set(reference)
    cloud = device.cloud_client()
    inbox = cloud.subscribe(RESULT)
    cloud.publish(INFER, json.dumps(request("person", photo)).encode(), qos=1)
    (got,) = [Result.parse(m.payload) for m in inbox.wait_for(1, timeout=60)]
    assert got.status == "ok", got.error
    assert got.model is not None
    assert got.model.name == "yolov3-tiny"
    assert got.detections is not None
    for label in ("person", "horse", "dog"):
        want = np.array(reference[label])
        mine = [
            np.array([d.box.x_min, d.box.y_min, d.box.x_max, d.box.y_max])
            for d in got.detections
            if d.label == label
        ]
        assert mine, f"no {label} in {[(d.label, d.score) for d in got.detections]}"
        closest = min(np.abs(box - want).max() for box in mine)
        assert closest <= 10, f"{label}: {closest:.1f} px from FP32's box {want.tolist()}"


def test_detections_per_request_settings_dlr_and_bad_input(device: Simulator, photo: bytes) -> None:
    local = device.local_client()
    inbox = local.subscribe(RESULT)
    local.publish(INFER, request("two", photo, max_detections=2))
    local.publish(INFER, request("dlr", photo, result_format="dlr"))
    local.publish(INFER, request("trunc", photo[:5000]))
    local.publish(INFER, b"{oops")
    local.publish(INFER, request("k", photo, score_threshold=2))
    got = {json.loads(m.payload).get("id"): json.loads(m.payload) for m in inbox.wait_for(5, timeout=60)}
    assert len(got["two"]["detections"]) == 2
    assert got["dlr"]["inference-type"] == "object-detection"
    assert {r["Label"] for r in got["dlr"]["inference-results"]} >= {"person", "horse", "dog"}
    assert got["trunc"]["error"]["code"] == ErrorCode.BAD_IMAGE.value
    assert got[None]["error"]["code"] == ErrorCode.BAD_REQUEST.value
    assert got["k"]["error"]["code"] == ErrorCode.BAD_REQUEST.value
