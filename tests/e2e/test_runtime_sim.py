"""The inference runtime on the simulated core with the real model: real recipe, real IPC, mosquitto
as IoT Core. One simulated device per module (starting one costs seconds); the tests that change its
configuration run last."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from edgeinfer import procfs
from edgeinfer.messages import ErrorCode, Result
from edgeinfer.model.manifest import Manifest
from edgeinfer.model.samples import cat_image
from edgeinfer.sim import MosquittoBroker, SimError, Simulator
from edgeinfer.sim.testing import RUNTIME as COMPONENT
from tests.e2e.conftest import running_device
from tests.helpers.wait import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

THING = "rt-e2e"
INFER = f"edgeinfer/{THING}/infer"
RESULT = f"edgeinfer/{THING}/result"
CAT_CLASSES = range(281, 286)


@pytest.fixture(scope="module")
def store(model_store: Path) -> Path:
    """The real default model store (built once per suite by the `model_store` fixture)."""
    return model_store


@pytest.fixture(scope="module")
def device(
    store: Path, sim_broker: MosquittoBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Simulator]:
    root = tmp_path_factory.mktemp("rt-device")
    config = {"maxBatchSize": 8, "maxQueueDelayUs": 5000, "imageFolders": [str(root)]}
    with running_device(root, store, sim_broker, THING, {COMPONENT: config}) as sim:
        yield sim


def request(rid: str, image: bytes, **kw: Any) -> dict[str, Any]:
    return {"id": rid, "image": base64.b64encode(image).decode(), **kw}


def results(messages: list[Any]) -> list[Result]:
    return [Result.parse(m.payload) for m in messages]


def test_local_and_iot_requests_answered(device: Simulator, store: Path) -> None:
    cat = cat_image().read_bytes()
    local = device.local_client()
    local_inbox = local.subscribe(RESULT)
    cloud = device.cloud_client()
    iot_inbox = cloud.subscribe(RESULT)
    local.publish(INFER, request("local-cat", cat, top_k=3))
    cloud.publish(INFER, json.dumps(request("iot-cat", cat)).encode(), qos=1)
    (got_local,) = results(local_inbox.wait_for(1, timeout=30))
    (got_iot,) = results(iot_inbox.wait_for(1, timeout=30))
    assert got_local.id == "local-cat"
    assert got_iot.id == "iot-cat"
    for res in (got_local, got_iot):
        assert res.status == "ok", res.error
        assert res.provider == "CPUExecutionProvider"
        assert res.model is not None
        # the runtime's choice for this host: FP32 where U8S8 saturates (x86-64 without VNNI)
        chosen = Manifest.load(store).variant_for("CPUExecutionProvider", procfs.saturating_int8_here())
        assert res.model.variant == chosen.name
        assert res.predictions[0].index in CAT_CLASSES, res.predictions
    assert len(got_local.predictions) == 3
    assert len(got_iot.predictions) == 5


def test_bad_requests_answered_with_codes_over_both_buses(device: Simulator) -> None:
    local = device.local_client()
    inbox = local.subscribe(RESULT)
    cloud = device.cloud_client()
    iot_inbox = cloud.subscribe(RESULT)
    local.publish(INFER, b"{oops")
    local.publish(INFER, request("trunc", cat_image().read_bytes()[:5000]))
    local.publish(INFER, request("where", cat_image().read_bytes(), reply_to="not/ours"))
    cloud.publish(INFER, json.dumps({"id": "p", "image_path": "/etc/passwd"}).encode(), qos=1)
    got = {r.id: r for r in results(inbox.wait_for(3, timeout=30))}
    unreadable = got[None].error
    assert unreadable is not None
    assert unreadable.code == ErrorCode.BAD_REQUEST
    assert got["trunc"].error is not None
    assert got["trunc"].error.code == ErrorCode.BAD_IMAGE
    assert got["where"].error is not None
    assert got["where"].error.code == ErrorCode.BAD_REQUEST
    (iot,) = results(iot_inbox.wait_for(1, timeout=30))
    assert iot.id == "p"
    assert iot.error is not None
    assert iot.error.code == ErrorCode.BAD_REQUEST


def burst(device: Simulator, n: int, prefix: str) -> list[Result]:
    cat = cat_image().read_bytes()
    local = device.local_client()
    inbox = local.subscribe(RESULT)
    for i in range(n):
        local.publish(INFER, request(f"{prefix}{i}", cat))
    got = [r for r in results(inbox.wait_for(n, timeout=60)) if (r.id or "").startswith(prefix)]
    inbox.close()
    assert sorted(r.id or "" for r in got) == sorted(f"{prefix}{i}" for i in range(n))
    return got


def test_batching_under_concurrent_load(device: Simulator) -> None:
    got = burst(device, 24, "load-")
    assert all(r.status == "ok" for r in got)
    assert max(r.batch_size for r in got) > 1
    assert all(r.predictions[0].index in CAT_CLASSES for r in got)


def test_live_configuration_change_takes_effect(device: Simulator) -> None:
    with pytest.raises(SimError, match="maxBatchSize: must be from 1 to 256"):
        device.update_configuration(COMPONENT, merge={"maxBatchSize": 0})
    device.update_configuration(COMPONENT, merge={"maxBatchSize": 2, "topK": 3})
    # The new engine's warm-up is logged before it is swapped in: wait for an answer made under the
    # new configuration instead. The runtime swaps the engine (and with it the batch cap) before it
    # applies topK, so three predictions say both are in place.
    probes = iter(range(1_000_000))
    eventually(
        lambda: len(burst(device, 1, f"probe-{next(probes)}-")[0].predictions) == 3,
        30,
        "an answer with the new topK",
    )
    got = burst(device, 16, "small-")
    assert all(r.status == "ok" for r in got)
    assert max(r.batch_size for r in got) <= 2


def write_video(path: Path, frames: int = 30, fps: float = 15.0) -> None:
    img = cv2.imread(str(cat_image()))
    assert img is not None
    img = cv2.resize(img, (320, 240))
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), fps, (320, 240))
    assert writer.isOpened()
    for i in range(frames):
        writer.write(np.roll(img, i, axis=1))
    writer.release()
    assert path.stat().st_size > 0


def test_video_file_source_produces_results(device: Simulator, tmp_path: Path) -> None:
    video = tmp_path / "cat.avi"
    write_video(video)
    local = device.local_client()
    inbox = local.subscribe(f"{RESULT}/video")
    device.update_configuration(
        COMPONENT,
        merge={
            "source": {
                "kind": "video",
                "uri": str(video),
                "rateHz": 5.0,
                "loop": True,
                "resultTopic": f"{RESULT}/video",
            }
        },
    )
    got = results(inbox.wait_for(3, timeout=60))
    assert all((r.id or "").startswith("video-") for r in got)
    assert all(r.status == "ok" for r in got)
    assert got[0].predictions[0].index in CAT_CLASSES
    device.update_configuration(COMPONENT, merge={"source": {"kind": "none"}})
