"""The runtime, the telemetry component and a cloud router together on the simulated core.

The runtime runs with `placement.enabled`; the router (this process, the real awsiotsdk MQTT 5 client)
serves offloads from the sim's broker with the same tiny model. Offloaded requests come back with
`placement: "cloud"` and the telemetry windows count them; with the router stopped the runtime serves
them itself, none lost; with it back, offloading resumes.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edgeinfer.messages import Result, TelemetryWindow
from edgeinfer.model.samples import cat_image
from edgeinfer.sim import MosquittoBroker, Simulator
from edgeinfer.sim.testing import RUNTIME
from edgeinfer.transport.mqtt import MqttPubSub
from edgeinfer_cloud.router.backends import OnnxBackend
from edgeinfer_cloud.router.router import Router, RouterConfig
from tests.e2e.conftest import running_device

pytestmark = pytest.mark.e2e

TELEMETRY = "com.edgeinfer.Telemetry"
THING = "offload-e2e"
INFER = f"edgeinfer/{THING}/infer"
RESULT = f"edgeinfer/{THING}/result"


class CloudRouter:
    def __init__(self, broker: MosquittoBroker, store: Path) -> None:
        self.client = MqttPubSub.connect_tcp(broker.host, broker.port)
        self.router = Router(self.client, OnnxBackend.load(store), RouterConfig()).start()

    def stop(self) -> None:
        self.router.stop()
        self.client.close()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, write_tiny_store: Callable[[Path], Path]) -> Path:
    return write_tiny_store(tmp_path_factory.mktemp("offload-store"))


@pytest.fixture(scope="module")
def device(
    sim_broker: MosquittoBroker, store: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Simulator]:
    root = tmp_path_factory.mktemp("offload-e2e")
    config = {
        RUNTIME: {
            "placement": {
                "enabled": True,
                "cloudTimeoutMs": 500,
                "breakerFailures": 2,
                "breakerCooldownS": 0.5,
                "breakerMaxCooldownS": 1.0,
                # the bursts below are 6 at once; the nucleus's window of 5 has its own tests
                "maxInflightPublishes": 8,
            }
        },
        TELEMETRY: {"windowSeconds": 2.0},
    }
    with running_device(root, store, sim_broker, THING, config, telemetry=True) as sim:
        yield sim


def test_offload_router_stop_and_back_with_telemetry(
    device: Simulator, sim_broker: MosquittoBroker, store: Path
) -> None:
    cat = base64.b64encode(cat_image().read_bytes()).decode()
    local = device.local_client()
    results = local.subscribe(RESULT)
    tele = device.cloud_client().subscribe(f"edgeinfer/{THING}/telemetry")

    def ask(prefix: str, n: int, gap: float = 0.0) -> dict[str, Result]:
        before = len(results.messages)
        for i in range(n):
            local.publish(INFER, {"id": f"{prefix}{i}", "image": cat, "offload": "always"})
            time.sleep(gap)
        got = [Result.parse(m.payload) for m in results.wait_for(before + n, timeout=60)[before:]]
        return {r.id or "": r for r in got}

    cloud = CloudRouter(sim_broker, store)
    try:
        up = ask("up", 6)
        assert sorted(up) == [f"up{i}" for i in range(6)]
        assert {r.placement for r in up.values()} == {"cloud"}
        assert all(r.status == "ok" and r.predictions for r in up.values())

        cloud.stop()  # the router goes away mid-run: served on the edge, none lost
        down = ask("down", 6, gap=0.1)
        assert sorted(down) == [f"down{i}" for i in range(6)]
        assert {r.placement for r in down.values()} == {"edge"}

        cloud = CloudRouter(sim_broker, store)  # back: after the breaker's cooldown it is used again
        deadline = time.monotonic() + 30
        k = 0
        while time.monotonic() < deadline:
            got = ask(f"back{k}-", 1)
            k += 1
            if next(iter(got.values())).placement == "cloud":
                break
            time.sleep(0.2)
        else:
            pytest.fail("offloading did not resume after the router came back")
        again = ask("again", 4)
        assert {r.placement for r in again.values()} == {"cloud"}

        # exactly one result each, and the telemetry windows saw the offloads
        time.sleep(0.5)
        ids = [json.loads(m.payload)["id"] for m in results.messages]
        assert len(ids) == len(set(ids)) == 6 + 6 + k + 4
        offloaded = 0
        end = time.monotonic() + 10
        while time.monotonic() < end and offloaded < 6 + 1 + 4:
            time.sleep(0.5)
            offloaded = sum(TelemetryWindow.from_dict(json.loads(m.payload)).offloaded for m in tele.messages)
        assert offloaded >= 6 + 1 + 4
        assert device.state(RUNTIME) == "RUNNING"
    finally:
        cloud.stop()
