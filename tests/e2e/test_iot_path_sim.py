"""The path through IoT Core on the simulated core: the runtime's `InferenceServer` on the real
awsiotsdk IPC client (`GreengrassIpcBus`), the simulated nucleus's IoT bridge, a real mosquitto, a real
MQTT 5 client as the cloud, and a cloud router, all but the broker in this process.

- a burst far above the runtime's queue gets exactly one result per request, and a request sent
  afterwards is answered ok;
- a request older than its deadline is answered DEADLINE_EXCEEDED, not computed;
- MQTT 5 request/response: a raw JPEG with its parameters in user properties is answered on its
  response topic with its correlation data;
- a 1080p JPEG sent locally with `offload: always` is answered by the cloud, the offload it caused
  under IoT Core's 128 KB; a 140,000-byte offload that cannot shrink is served on the edge instead of
  being handed to a nucleus that would refuse it.

On nucleus lite (`--sim-nucleus lite`) nothing over 5,000 bytes reaches the device from IoT Core, no
IPC message carries over 10,000 bytes and MQTT 5 properties are dropped: the cat photo as a request is
never answered (the simulator counts it dropped), the burst and the deadline are checked with a
request that fits, the raw-JPEG request loses its properties (BAD_REQUEST, no id, on the default
topic), and a 1080p JPEG cannot be sent locally at all.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from edgeinfer.messages import IOT_CORE_MAX_BYTES, ErrorCode, OffloadRequest, Result, iso_utc
from edgeinfer.model.manifest import Manifest
from edgeinfer.model.samples import cat_image
from edgeinfer.runtime.config import RuntimeConfig
from edgeinfer.runtime.engine import Engine
from edgeinfer.runtime.placement import HybridPlacement, OffloadConfig, OffloadPolicy
from edgeinfer.runtime.server import InferenceServer
from edgeinfer.sim import MosquittoBroker, SimError, Simulator
from edgeinfer.transport import Message, MqttProperties
from edgeinfer.transport.ipc import GreengrassIpcBus
from edgeinfer.transport.mqtt import MqttPubSub
from edgeinfer_cloud.router.backends import OnnxBackend
from edgeinfer_cloud.router.router import Router, RouterConfig
from tests.helpers.images import photo

pytestmark = pytest.mark.e2e

APP = "com.example.Runtime"
THING = "iot-path-e2e"
INFER = f"edgeinfer/{THING}/infer"
RESULT = f"edgeinfer/{THING}/result"
OFFLOAD = f"edgeinfer/{THING}/offload"
QUEUE = 8


@dataclass
class Device:
    sim: Simulator
    server: InferenceServer
    hybrid: HybridPlacement


@pytest.fixture
def store(tmp_path: Path, write_tiny_store: Callable[[Path], Path]) -> Path:
    return write_tiny_store(tmp_path / "store")


@pytest.fixture
def device(simulator: Callable[..., Simulator], store: Path, tmp_path: Path) -> Iterator[Device]:
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    access = {
        "aws.greengrass.ipc.pubsub": {"p": {"operations": ["*"], "resources": ["edgeinfer/*"]}},
        "aws.greengrass.ipc.mqttproxy": {
            "m": {"operations": ["*"], "resources": ["edgeinfer/{iot:thingName}/*"]}
        },
    }
    recipe = {
        "RecipeFormatVersion": "2020-01-25",
        "ComponentName": APP,
        "ComponentVersion": "1.0.0",
        "ComponentConfiguration": {"DefaultConfiguration": {"accessControl": access}},
        "Manifests": [{"Platform": {"os": "*", "runtime": "*"}, "Lifecycle": {}}],
    }
    (recipes / "app.yaml").write_text(yaml.safe_dump(recipe))
    sim = simulator(recipes, thing=THING)
    env = sim.ipc_env(APP)
    bus = GreengrassIpcBus.connect(env["AWS_GG_NUCLEUS_DOMAIN_SOCKET_FILEPATH_FOR_COMPONENT"], env["SVCUID"])
    cfg = RuntimeConfig(max_batch_size=4, max_queue_size=QUEUE)
    engine = Engine.create(Manifest.load(store), cfg, str(tmp_path / "work"))
    engine.warm_up(runs=1)
    server = InferenceServer(bus, engine, cfg, THING)
    policy: OffloadPolicy[Any] = OffloadPolicy(
        OffloadConfig(cloud_timeout_ms=5000), max_batch_size=4, local_models=[engine.manifest.name]
    )
    hybrid = HybridPlacement(bus, THING, policy, image_side=engine.input_size, image_keep=engine.detail)
    server.start()
    server.set_placement(hybrid.start(), hybrid)
    try:
        yield Device(sim, server, hybrid)
    finally:
        server.stop()
        hybrid.stop()
        bus.close()


@pytest.fixture
def router(sim_broker: MosquittoBroker, store: Path) -> Iterator[Router]:
    client = MqttPubSub.connect_tcp(sim_broker.host, sim_broker.port)
    served = Router(client, OnnxBackend.load(store, max_batch_size=4), RouterConfig()).start()
    yield served
    served.stop()
    client.close()


def lite(device: Device) -> bool:
    return device.sim.nucleus.name == "lite"


def request_image(device: Device) -> str:
    """The request's image, base64: the cat photo, or on lite a JPEG whose request fits lite's
    5,000-byte delivery limit (the cat's is dropped there, see the lite test below)."""
    return base64.b64encode(photo((48, 48), seed=3) if lite(device) else cat_image().read_bytes()).decode()


def by_id(messages: list[Message]) -> dict[str, list[Result]]:
    out: dict[str, list[Result]] = {}
    for m in messages:
        result = Result.parse(m.payload)
        out.setdefault(result.id or "", []).append(result)
    return out


def test_a_burst_far_above_the_queue_gets_exactly_one_result_each(
    device: Device, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    server = device.server
    engine = server.engine
    run = engine.run

    def slow_run(*args: Any, **kwargs: Any) -> Any:  # a device with a fraction of the burst's rate
        time.sleep(0.02)
        return run(*args, **kwargs)

    monkeypatch.setattr(engine, "run", slow_run)
    admit = server.batcher.admit
    most = [0]

    def counted_admit() -> bool:
        ok = admit()
        most[0] = max(most[0], server.batcher.outstanding)
        return ok

    monkeypatch.setattr(server.batcher, "admit", counted_admit)
    cloud = device.sim.cloud_client()
    results = cloud.subscribe(RESULT)
    cat = request_image(device)
    n = 40 * QUEUE
    for i in range(n):
        body = json.dumps({"id": f"b{i}", "image": cat, "offload": "never", "deadline_ms": 20_000})
        cloud.pubsub.publish(INFER, body.encode(), qos=1, wait=False)
    got = by_id(results.wait_for(n, timeout=120))
    assert sorted(got) == sorted(f"b{i}" for i in range(n))
    time.sleep(1.0)  # a duplicate, if any, would come now
    got = by_id(results.messages)
    assert all(len(answers) == 1 for answers in got.values())
    codes = [r[0].error.code for r in got.values() if r[0].error is not None]
    assert set(codes) <= {ErrorCode.OVERLOADED, ErrorCode.DEADLINE_EXCEEDED}
    assert ErrorCode.OVERLOADED in codes  # the queue's bound answered the excess ...
    assert sum(r[0].status == "ok" for r in got.values()) >= QUEUE  # ... and the rest were served
    assert most[0] <= QUEUE  # never more admitted than the queue holds
    # Back to normal at once: the next request is served.
    cloud.publish(INFER, json.dumps({"id": "after", "image": cat, "offload": "never"}))
    (after,) = results.wait_for(n + 1, timeout=30)[n:]
    assert Result.parse(after.payload).status == "ok"


def test_a_request_older_than_its_deadline_is_answered_deadline_exceeded(device: Device) -> None:
    cloud = device.sim.cloud_client()
    results = cloud.subscribe(RESULT)
    cat = request_image(device)
    sent = iso_utc(time.time() - 30)  # it waited upstream for half a minute
    cloud.publish(INFER, json.dumps({"id": "stale", "image": cat, "deadline_ms": 500, "sent_at": sent}))
    cloud.publish(
        INFER,
        json.dumps({"id": "fresh", "image": cat, "deadline_ms": 30_000, "sent_at": iso_utc(time.time())}),
    )
    got = {r.id: r for r in (Result.parse(m.payload) for m in results.wait_for(2, timeout=30))}
    assert got["stale"].status == "error"
    assert got["stale"].error is not None
    assert got["stale"].error.code is ErrorCode.DEADLINE_EXCEEDED
    assert got["stale"].batch_size == 0
    assert got["fresh"].status == "ok"


def test_on_lite_a_request_over_5000_bytes_is_never_answered_and_counted_dropped(device: Device) -> None:
    if not lite(device):
        pytest.skip("nucleus lite's delivery limit (classic delivers up to 128 KB: the tests above)")
    cloud = device.sim.cloud_client()
    results = cloud.subscribe(RESULT)
    cat = base64.b64encode(cat_image().read_bytes()).decode()
    cloud.publish(INFER, json.dumps({"id": "cat", "image": cat, "offload": "never"}))
    cloud.publish(INFER, json.dumps({"id": "small", "image": request_image(device), "offload": "never"}))
    got = by_id(results.wait_for(1, timeout=30))
    assert list(got) == ["small"]
    time.sleep(1.0)  # the cat's answer, were it coming, would be here by now
    assert list(by_id(results.messages)) == ["small"]
    assert device.sim.dropped_iot_messages() == 1


def test_mqtt5_raw_jpeg_request_is_answered_on_its_response_topic(device: Device) -> None:
    if lite(device):
        _raw_jpeg_on_lite(device)
        return
    cloud = device.sim.cloud_client()
    reply = f"{RESULT}/mqtt5-client"
    answers = cloud.subscribe(reply)
    props = MqttProperties(
        content_type="image/jpeg",
        correlation_data=b"\x07corr-42",
        response_topic=reply,
        user_properties=(("id", "raw-1"), ("top_k", "2"), ("offload", "never")),
        message_expiry_s=60,
    )
    cloud.publish(INFER, cat_image().read_bytes(), properties=props)
    (msg,) = answers.wait_for(1, timeout=30)
    result = Result.parse(msg.payload)
    assert result.id == "raw-1"
    assert result.status == "ok"
    assert len(result.predictions) == 2
    assert msg.properties is not None
    assert msg.properties.correlation_data == b"\x07corr-42"
    assert msg.properties.content_type == "application/json"


def _raw_jpeg_on_lite(device: Device) -> None:
    """Lite drops the properties that carry the raw request's id, parameters and reply topic: the
    runtime answers BAD_REQUEST without an id on the default topic (as measured on the real lite)."""
    cloud = device.sim.cloud_client()
    reply = f"{RESULT}/mqtt5-client"
    answers, results = cloud.subscribe(reply), cloud.subscribe(RESULT)
    props = MqttProperties(
        content_type="image/jpeg", response_topic=reply, user_properties=(("id", "raw-1"),)
    )
    cloud.publish(INFER, photo((48, 48), seed=3), properties=props)
    (msg,) = results.wait_for(1, timeout=30)
    result = Result.parse(msg.payload)
    assert result.id is None
    assert result.error is not None
    assert result.error.code is ErrorCode.BAD_REQUEST
    assert answers.messages == []


def test_a_1080p_jpeg_offloaded_always_is_answered_by_the_cloud_in_a_message_that_fits(
    device: Device, router: Router
) -> None:
    if lite(device):  # no component can send it: lite closes the sender's IPC connection
        with pytest.raises(SimError, match="closes the sender's whole IPC connection"):
            device.sim.local_client().publish(
                INFER, {"id": "hd", "image": base64.b64encode(photo((1920, 1080), seed=3)).decode()}
            )
        return
    cloud = device.sim.cloud_client()
    offloads = cloud.subscribe(OFFLOAD)
    local = device.sim.local_client()
    results = local.subscribe(RESULT)
    hd = photo((1920, 1080), seed=3)
    assert len(base64.b64encode(hd)) > IOT_CORE_MAX_BYTES
    local.publish(INFER, {"id": "hd", "image": base64.b64encode(hd).decode(), "offload": "always"})
    (msg,) = results.wait_for(1, timeout=60)
    result = Result.parse(msg.payload)
    assert result.status == "ok"
    assert result.placement == "cloud"
    (sent,) = offloads.wait_for(1, timeout=10)
    assert len(sent.payload) < IOT_CORE_MAX_BYTES
    image = OffloadRequest.parse(sent.payload).request.image
    assert image is not None
    assert len(image) < len(hd) / 4

    # 140,000 bytes that are no image: nothing to shrink, over 128 KB as they are. Served on the
    # edge (BAD_IMAGE: it is garbage) and never handed to the nucleus, which would refuse it.
    junk = base64.b64encode(b"\x01" * 140_000).decode()
    local.publish(INFER, {"id": "junk", "image": junk, "offload": "always"})
    (msg,) = results.wait_for(2, timeout=60)[1:]
    result = Result.parse(msg.payload)
    assert result.id == "junk"
    assert result.placement == "edge"
    assert result.error is not None
    assert result.error.code is ErrorCode.BAD_IMAGE
    time.sleep(0.5)
    assert len(offloads.messages) == 1
    # The breaker stayed closed: the next offload goes to the cloud again.
    local.publish(INFER, {"id": "hd2", "image": base64.b64encode(hd).decode(), "offload": "always"})
    (msg,) = results.wait_for(3, timeout=60)[2:]
    assert Result.parse(msg.payload).placement == "cloud"
