"""`edgeinfer deploy --canary`: every greengrassv2 call through botocore's Stubber (parameters checked
against the service model); recorded telemetry windows, injected or played on a real mosquitto."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from botocore.stub import Stubber

from edgeinfer import __version__, cli
from edgeinfer.bundle.build import dependency_order, load_recipes
from edgeinfer.messages import telemetry_topic
from edgeinfer.sim.broker import MosquittoBroker
from edgeinfer_cloud import aws_cli
from edgeinfer_cloud.canary.flow import CanaryPlan, resolve_canary, run_canary
from edgeinfer_cloud.canary.windows import RecordedWindows
from edgeinfer_cloud.deploy import DeployError, component_spec, parse_target
from tests.cloud.aws_fixtures import (
    NOW,
    ROOT,
    Capture,
    expect_core_devices,
    expect_create_deployment,
    expect_effective,
)
from tests.helpers.canary import fleet_windows

TARGET_ARN = "arn:aws:iot:eu-central-1:111122223333:thinggroup/factory-a"
CANARY_ARN = "arn:aws:iot:eu-central-1:111122223333:thinggroup/factory-a-canary"
CANARY_DEPLOYMENT = "c0ffee00-5678-90ab-cdef-EXAMPLE22222"
CANARY = (CANARY_DEPLOYMENT, "edgeinfer-factory-a-canary", CANARY_ARN)  # as ListEffectiveDeployments names it
CANARIES = ["cam-c1", "cam-c2"]
FLEET = ["cam-1", "cam-2", "cam-3"]
COMPONENTS = {
    "com.edgeinfer.ModelStore": __version__,
    "com.edgeinfer.InferenceRuntime": __version__,
}
PREVIOUS = {
    "com.edgeinfer.ModelStore": {"componentVersion": "0.0.9"},
    "com.edgeinfer.InferenceRuntime": {
        "componentVersion": "0.0.9",
        "configurationUpdate": {"merge": '{"maxBatchSize":4}'},
    },
}


def expect_previous(stub: Stubber, previous: dict[str, Any] | None = PREVIOUS) -> None:
    deployments = []
    if previous is not None:
        deployments = [
            {
                "targetArn": CANARY_ARN,
                "deploymentId": "before-1",
                "deploymentName": "edgeinfer-factory-a-canary",
                "creationTimestamp": NOW,
                "deploymentStatus": "ACTIVE",
                "isLatestForTarget": True,
            }
        ]
    stub.add_response(
        "list_deployments",
        {"deployments": deployments},
        expected_params={"targetArn": CANARY_ARN, "historyFilter": "LATEST_ONLY"},
    )
    if previous is not None:
        stub.add_response(
            "get_deployment",
            {"deploymentId": "before-1", "targetArn": CANARY_ARN, "components": previous},
            expected_params={"deploymentId": "before-1"},
        )


def expect_canary_succeeds(stub: Stubber, components: Any) -> Capture:
    job = expect_create_deployment(stub, CANARY_ARN, components, CANARY_DEPLOYMENT)
    expect_core_devices(stub, CANARY_ARN, CANARIES)
    for name in CANARIES:
        expect_effective(stub, name, "SUCCEEDED", deployment=CANARY)
    return job


def healthy() -> list[bytes]:
    return fleet_windows(FLEET, 3, errors={"INTERNAL": 1}) + fleet_windows(
        CANARIES, 3, errors={"INTERNAL": 1}, p99_ms=190.0
    )


def slow() -> list[bytes]:
    return fleet_windows(FLEET, 3) + fleet_windows(CANARIES, 3, p99_ms=412.0)


def failing() -> list[bytes]:
    return fleet_windows(FLEET, 3) + fleet_windows(CANARIES, 3, errors={"INTERNAL": 6})


def plan(**kwargs: Any) -> CanaryPlan:
    return CanaryPlan(parse_target(CANARY_ARN), minutes=0.5, windows_per_thing=3, **kwargs)


def test_a_healthy_canary_is_promoted_to_the_target(gg: tuple[Any, Stubber]) -> None:
    client, stub = gg
    bundle = component_spec(COMPONENTS)
    expect_previous(stub)
    canary_job = expect_canary_succeeds(stub, bundle)
    expect_create_deployment(stub, TARGET_ARN, bundle, "promoted-1")
    lines: list[str] = []
    outcome = run_canary(
        client, RecordedWindows(healthy()), parse_target(TARGET_ARN), plan(), COMPONENTS, say=lines.append
    )
    assert outcome.promoted
    assert outcome.then.deployment_id == "promoted-1"
    assert outcome.canary.statuses == dict.fromkeys(CANARIES, "SUCCEEDED")
    assert canary_job.values[0]["abortConfig"]["criteriaList"][0]["failureType"] == "ALL"
    text = "\n".join(lines)
    assert (
        "runs deployment before-1 (com.edgeinfer.InferenceRuntime 0.0.9, com.edgeinfer.ModelStore 0.0.9)"
        in text
    )
    assert "6 canary and 9 fleet windows" in text
    assert "p99 190 ms against the fleet's 180 ms" in text
    assert "promoting to thinggroup factory-a" in text


def test_a_slow_canary_is_rolled_back_to_what_it_ran(gg: tuple[Any, Stubber]) -> None:
    client, stub = gg
    expect_previous(stub)
    expect_canary_succeeds(stub, component_spec(COMPONENTS))
    expect_create_deployment(stub, CANARY_ARN, PREVIOUS, "rollback-1")  # merges and all, as it was
    lines: list[str] = []
    outcome = run_canary(
        client, RecordedWindows(slow()), parse_target(TARGET_ARN), plan(), COMPONENTS, say=lines.append
    )
    assert not outcome.promoted
    assert outcome.then.deployment_id == "rollback-1"
    assert outcome.verdict.reasons == ("p99 412 ms is 2.3x the fleet's 180 ms",)
    assert "rolling factory-a-canary back to com.edgeinfer.InferenceRuntime 0.0.9" in "\n".join(lines)


def test_a_canary_group_that_ran_nothing_is_rolled_back_to_nothing(gg: tuple[Any, Stubber]) -> None:
    client, stub = gg
    expect_previous(stub, None)
    expect_canary_succeeds(stub, component_spec(COMPONENTS))
    expect_create_deployment(stub, CANARY_ARN, {}, "rollback-2")
    outcome = run_canary(client, RecordedWindows(failing()), parse_target(TARGET_ARN), plan(), COMPONENTS)
    assert not outcome.promoted
    assert outcome.verdict.reasons == ("error share 15.0% is above the fleet's 0.0%",)


def test_silent_canaries_are_not_promoted(gg: tuple[Any, Stubber]) -> None:
    client, stub = gg
    expect_previous(stub)
    expect_canary_succeeds(stub, component_spec(COMPONENTS))
    expect_create_deployment(stub, CANARY_ARN, PREVIOUS, "rollback-3")
    quiet = CanaryPlan(parse_target(CANARY_ARN), minutes=0.001)
    outcome = run_canary(
        client, RecordedWindows(fleet_windows(FLEET)), parse_target(TARGET_ARN), quiet, COMPONENTS
    )
    assert outcome.verdict.reasons[0].startswith("too little to judge: 0 requests from the canary")


def test_a_canary_that_fails_to_install_is_not_promoted(gg: tuple[Any, Stubber]) -> None:
    client, stub = gg
    expect_previous(stub)
    expect_create_deployment(stub, CANARY_ARN, Capture(), CANARY_DEPLOYMENT)
    stub.add_response("list_core_devices", {"coreDevices": []}, expected_params={"thingGroupArn": CANARY_ARN})
    expect_create_deployment(stub, CANARY_ARN, PREVIOUS, "rollback-4")
    with pytest.raises(DeployError, match=r"^canary: thing group factory-a-canary has no .*; not promoted$"):
        run_canary(client, RecordedWindows([]), parse_target(TARGET_ARN), plan(), COMPONENTS)


def test_a_canary_that_fails_on_a_device_is_rolled_back_before_it_is_reported(
    gg: tuple[Any, Stubber],
) -> None:
    client, stub = gg
    expect_previous(stub)
    expect_create_deployment(stub, CANARY_ARN, component_spec(COMPONENTS), CANARY_DEPLOYMENT)
    expect_core_devices(stub, CANARY_ARN, ["cam-c1"], "UNHEALTHY")
    expect_effective(stub, "cam-c1", "FAILED", deployment=CANARY, reason="the runtime did not start")
    expect_create_deployment(stub, CANARY_ARN, PREVIOUS, "rollback-5")  # what the group ran, merges and all
    lines: list[str] = []
    with pytest.raises(DeployError, match=r"did not succeed.*; rolled back \(rollback-5\); not promoted$"):
        run_canary(
            client, RecordedWindows([]), parse_target(TARGET_ARN), plan(), COMPONENTS, say=lines.append
        )
    assert "rolling factory-a-canary back to com.edgeinfer.InferenceRuntime 0.0.9" in "\n".join(lines)


def test_resolve_canary_takes_a_name_in_the_targets_account() -> None:
    target = parse_target(TARGET_ARN)
    assert resolve_canary("factory-a-canary", target).arn == CANARY_ARN
    assert resolve_canary(CANARY_ARN, target).name == "factory-a-canary"
    with pytest.raises(DeployError, match="the --target itself"):
        resolve_canary("factory-a", target)
    with pytest.raises(DeployError, match="one region"):
        resolve_canary("arn:aws:iot:us-east-1:111122223333:thinggroup/c", target)
    with pytest.raises(DeployError, match="thing group name or ARN"):
        resolve_canary("no/slashes", target)


# ------------------------------------------------------------------- on a real broker, through the CLI


def play_on_broker(
    sim_broker: MosquittoBroker, monkeypatch: pytest.MonkeyPatch, payloads: list[bytes], argv: list[str]
) -> int:
    """Run `argv` while the payloads are published once the canary's subscription is acknowledged."""
    from edgeinfer.transport.mqtt import MqttPubSub

    subscribed = threading.Event()
    real_subscribe = MqttPubSub.subscribe

    def subscribe(self: MqttPubSub, topic: str, *args: Any, **kwargs: Any) -> Any:
        sub = real_subscribe(self, topic, *args, **kwargs)
        if topic == telemetry_topic("+"):
            subscribed.set()
        return sub

    monkeypatch.setattr(MqttPubSub, "subscribe", subscribe)
    host, port = sim_broker.address
    codes: list[int] = []
    runner = threading.Thread(target=lambda: codes.append(cli.main([*argv, "--broker", f"{host}:{port}"])))
    runner.start()
    try:
        assert subscribed.wait(30)
        with MqttPubSub.connect_tcp(host, port) as pub:
            for payload in payloads:
                pub.publish(telemetry_topic("x"), b"garbage", qos=1)
                pub.publish(telemetry_topic(_thing(payload)), payload, qos=1)
    finally:
        runner.join(60)
    assert not runner.is_alive()
    return codes[0]


def _thing(payload: bytes) -> str:
    return str(json.loads(payload)["thing"])


@pytest.fixture
def cli_gg(gg: tuple[Any, Stubber], monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Stubber]:
    client, _ = gg

    class Session:
        def client(self, name: str) -> Any:
            assert name == "greengrassv2"
            return client

    monkeypatch.setattr(aws_cli, "_session", lambda profile, region: Session())
    return gg


ARGV = ["deploy", "--target", TARGET_ARN, "--project", str(ROOT), "--canary", "factory-a-canary"]
ARGV += ["--canary-minutes", "1", "--canary-windows", "3"]


def bundle_spec() -> dict[str, Any]:
    recipes = load_recipes(ROOT)
    return component_spec({name: recipes[name].version for name in dependency_order(recipes)})


def test_cli_promotes_a_healthy_canary_on_windows_from_the_broker(
    cli_gg: tuple[Any, Stubber],
    sim_broker: MosquittoBroker,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, stub = cli_gg
    expect_previous(stub)
    expect_canary_succeeds(stub, bundle_spec())
    expect_create_deployment(stub, TARGET_ARN, bundle_spec(), "promoted-1")
    assert play_on_broker(sim_broker, monkeypatch, healthy(), ARGV) == 0
    captured = capsys.readouterr()
    assert "6 canary and 9 fleet windows" in captured.err
    assert "p99 190 ms against the fleet's 180 ms" in captured.err
    assert captured.out == "canary factory-a-canary promoted: deployment promoted-1 to factory-a\n"


@pytest.mark.parametrize(
    "case",
    [
        (slow, "p99 412 ms is 2.3x the fleet's 180 ms"),
        (failing, "error share 15.0% is above the fleet's 0.0%"),
    ],
)
def test_cli_rolls_back_a_degraded_canary_saying_why(
    cli_gg: tuple[Any, Stubber],
    sim_broker: MosquittoBroker,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    case: tuple[Callable[[], list[bytes]], str],
) -> None:
    windows, reason = case
    _, stub = cli_gg
    expect_previous(stub)
    expect_canary_succeeds(stub, bundle_spec())
    expect_create_deployment(stub, CANARY_ARN, PREVIOUS, "rollback-1")
    assert play_on_broker(sim_broker, monkeypatch, windows(), ARGV) == 1
    captured = capsys.readouterr()
    assert "6 canary and 9 fleet windows" in captured.err
    assert captured.out == f"canary factory-a-canary rolled back (rollback-1): {reason}\n"


def test_cli_canary_needs_a_broker_or_endpoint(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(ARGV) == 2
    assert "--canary watches telemetry: give --broker" in capsys.readouterr().err
