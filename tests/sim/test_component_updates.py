"""The operations the classic nucleus serves itself: component updates and their deferral, pause and
resume, component metrics, token validation."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from awsiot.greengrasscoreipc.model import InvalidArgumentsError, Metric, ServiceError, UnauthorizedError

from edgeinfer.sim import Simulator
from tests.helpers.sim import Device

pytestmark = pytest.mark.classic_only(
    "nucleus lite serves none of these but ValidateAuthorizationToken (test_nucleus_lite.py)"
)

APP = "com.example.App"
WORKER = "com.example.Worker"


@pytest.fixture
def sim(simulator: Callable[..., Simulator], device: Device) -> Simulator:
    device.add(
        APP,
        config={"model": "v1"},
        access={
            "aws.greengrass.ipc.lifecycle": {
                "p": {
                    "operations": ["aws.greengrass#PauseComponent", "aws.greengrass#ResumeComponent"],
                    "resources": [WORKER],
                }
            }
        },
    )
    device.add(WORKER, lifecycle={"run": "echo started; sleep 60"})
    sim = simulator(device.recipes, device.artifacts)
    sim.wait_for_state(WORKER, "RUNNING")
    return sim


def test_an_update_waits_until_the_component_stops_deferring(sim: Simulator, ipc_clients: Any) -> None:
    app = ipc_clients(sim, APP)
    events: list[Any] = []
    lock = threading.Lock()

    def on_event(event: Any) -> None:
        with lock:
            events.append(event)
            pre = event.pre_update_event
            if pre is None:
                return
            later = sum(1 for e in events if e.pre_update_event) < 3  # busy twice, then ready
            app.defer_component_update_async(
                deployment_id=pre.deployment_id,
                message="requests in flight" if later else "done",
                recheck_after_ms=200 if later else 0,
            )

    app.subscribe_to_component_updates(on_stream_event=on_event)
    t0 = time.monotonic()
    deferrals = sim.update_component(WORKER, merge={"unused": 1})
    waited = time.monotonic() - t0
    assert [(d.component, d.message, d.recheck_after_ms) for d in deferrals] == [
        (APP, "requests in flight", 200),
        (APP, "requests in flight", 200),
    ]
    assert waited >= 0.4
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (
        any(e.post_update_event for e in events) and sim.logs(WORKER).splitlines().count("started") == 2
    ):
        time.sleep(0.02)
    assert sim.logs(WORKER).splitlines().count("started") == 2  # restarted once the deferrals ended
    pre = [e.pre_update_event.deployment_id for e in events if e.pre_update_event]
    post = [e.post_update_event.deployment_id for e in events if e.post_update_event]
    assert len(pre) == 3
    assert post == pre[:1]
    assert sim.configuration(WORKER)["unused"] == 1


def test_defer_without_a_subscription_or_too_late(sim: Simulator, ipc_clients: Any) -> None:
    app = ipc_clients(sim, APP)
    with pytest.raises(InvalidArgumentsError) as unsubscribed:
        app.defer_component_update(deployment_id="d1", recheck_after_ms=0)
    assert unsubscribed.value.message == "Component is not subscribed to component update events"
    app.subscribe_to_component_updates(on_stream_event=lambda _e: None)
    with pytest.raises(ServiceError) as late:
        app.defer_component_update(deployment_id="d1", recheck_after_ms=0)
    assert late.value.message == "Time limit to respond to PreComponentUpdateEvent exceeded"


def test_pause_and_resume(sim: Simulator, ipc_clients: Any) -> None:
    app, worker = ipc_clients(sim, APP), ipc_clients(sim, WORKER)
    app.pause_component(component_name=WORKER)
    with pytest.raises(UnauthorizedError):
        app.resume_component(component_name=APP)  # not granted
    app.resume_component(component_name=WORKER)
    with pytest.raises(InvalidArgumentsError) as again:
        app.resume_component(component_name=WORKER)
    assert again.value.message == f"Component {WORKER} is not paused"
    with pytest.raises(UnauthorizedError):
        worker.pause_component(component_name=APP)


def test_metrics_and_token_validation_are_for_aws_components(sim: Simulator, ipc_clients: Any) -> None:
    app = ipc_clients(sim, APP)
    with pytest.raises(UnauthorizedError):
        app.put_component_metric(metrics=[Metric(name="requests", unit="Count", value=1.0)])
    with pytest.raises(UnauthorizedError) as token:
        app.validate_authorization_token(token=sim.ipc_env(WORKER)["SVCUID"])
    assert (
        token.value.message == f"{APP} is not authorized to perform aws.greengrass#ValidateAuthorizationToken"
    )
