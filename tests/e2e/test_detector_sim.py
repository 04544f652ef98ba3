"""The inference runtime serving the default detector (YOLOv3-tiny) on the simulated core: Darknet's
person.jpg over IoT Core (mosquitto) and local pub/sub, boxes against FP32's own, bad input codes, and
a result too large for one IPC message answered TOO_LARGE, the runtime serving on.

The core is the nucleus `--sim-nucleus` names. On nucleus lite the whole photo fits neither an IPC
message (10,000 bytes) nor an IoT Core → device message (5,000): those tests are classic's."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from edgeinfer.messages import IPC_MAX_BYTES, ErrorCode, Result
from edgeinfer.model import infer
from edgeinfer.model.images import DARKNET_DATA
from edgeinfer.model.manifest import Manifest
from edgeinfer.sim import MosquittoBroker, Simulator
from edgeinfer.sim.testing import RUNTIME as COMPONENT
from tests.e2e.conftest import running_device

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
def nucleus(request: pytest.FixtureRequest) -> str:
    return str(request.config.getoption("--sim-nucleus"))


@pytest.fixture(scope="module")
def device(
    detector_store: Path, sim_broker: MosquittoBroker, tmp_path_factory: pytest.TempPathFactory, nucleus: str
) -> Iterator[Simulator]:
    root = tmp_path_factory.mktemp("det-device")
    config = {COMPONENT: {"maxBatchSize": 4, "maxQueueDelayUs": 5000}}
    with running_device(root, detector_store, sim_broker, THING, config, nucleus=nucleus, timeout=240) as sim:
        yield sim


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


def classic_only(device: Simulator) -> None:
    if device.nucleus.name != "classic":
        pytest.skip("the whole photo is over nucleus lite's IPC and IoT Core → device message limits")


def test_person_horse_and_dog_over_iot_core_within_10_px_of_fp32(
    device: Simulator, detector_store: Path, photo: bytes
) -> None:
    classic_only(device)
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
    classic_only(device)
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


def test_a_result_over_the_ipc_message_limit_is_too_large_and_the_runtime_serves_on(
    device: Simulator, photo: bytes
) -> None:
    img = cv2.imdecode(np.frombuffer(photo, dtype=np.uint8), cv2.IMREAD_COLOR)
    assert img is not None
    tile = cv2.resize(img, (100, 66), interpolation=cv2.INTER_AREA)
    ok, buf = cv2.imencode(".jpg", np.vstack([np.hstack([tile] * 2)] * 2), [cv2.IMWRITE_JPEG_QUALITY, 50])
    assert ok
    small = bytes(buf)  # four small copies: many boxes, and a request that fits one IPC message on lite
    local = device.local_client()
    inbox = local.subscribe(RESULT)
    local.publish(INFER, request("all", small, score_threshold=0.001, max_detections=300))
    (msg,) = inbox.wait_for(1, timeout=60)
    got = Result.parse(msg.payload)
    assert got.id == "all"
    assert got.error is not None, f"{len(got.detections or [])} detections fit"
    assert got.error.code is ErrorCode.TOO_LARGE
    assert "ask for fewer (max_detections / top_k)" in got.error.message
    assert len(msg.payload) < IPC_MAX_BYTES
    local.publish(INFER, request("next", small, max_detections=2))  # the connection is still open
    after = Result.parse(inbox.wait_for(2, timeout=60)[1].payload)
    assert after.id == "next"
    assert after.status == "ok", after.error
    assert after.detections is not None
    assert 0 < len(after.detections) <= 2
