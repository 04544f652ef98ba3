"""The IoT policy templates: least privilege, scoped by the thing-name policy variable, the topics."""

from __future__ import annotations

import fnmatch
import json
import re
from pathlib import Path
from typing import Any

import pytest

from edgeinfer import cli, messages
from edgeinfer_cloud.policies import TEMPLATES, PolicyError, render, template
from edgeinfer_cloud.router.router import RouterConfig, offload_filter
from tests.helpers import PROJECT

REGION, ACCOUNT = "eu-central-1", "111122223333"
ARN = f"arn:aws:iot:{REGION}:{ACCOUNT}"
THING_VAR = "${iot:Connection.Thing.ThingName}"


def allowed(policy: dict[str, Any], action: str, resource: str, thing: str) -> bool:
    """A small evaluator: Allow statements only, `*`/`?` wildcards, the thing-name variable."""
    for statement in policy["Statement"]:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        resources = (
            statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
        )
        if statement["Effect"] != "Allow" or action not in actions:
            continue
        for raw in resources:
            pattern = raw.replace(THING_VAR, thing).replace("[", "[[]")
            if fnmatch.fnmatchcase(resource, pattern):
                return True
    return False


@pytest.fixture
def device() -> dict[str, Any]:
    return render("core-device", region=REGION, account=ACCOUNT)


@pytest.fixture
def router() -> dict[str, Any]:
    return render("cloud-router", region=REGION, account=ACCOUNT)


def test_templates_hold_no_account_and_use_the_thing_variable() -> None:
    for name, file in TEMPLATES.items():
        text = (PROJECT / "cloud" / "edgeinfer_cloud" / "policies" / file).read_text()
        assert "<ACCOUNT_ID>" in text
        assert not re.search(r"\d{12}", text)
        assert THING_VAR in text, name
        policy = template(name)
        for statement in policy["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            assert all("*" not in a for a in actions), "no action wildcards"
            if statement["Resource"] == "*":
                assert all(a.startswith("greengrass:") for a in actions), "only the data plane needs *"


def test_device_may_use_its_own_edgeinfer_topics(device: dict[str, Any]) -> None:
    thing = "cam-1"
    for topic in (
        messages.result_topic(thing),
        messages.result_topic(thing) + "/client-42",
        messages.offload_topic(thing),
        messages.telemetry_topic(thing),
    ):
        assert allowed(device, "iot:Publish", f"{ARN}:topic/{topic}", thing), topic
    for topic in (messages.infer_topic(thing), messages.offload_result_topic(thing)):
        assert allowed(device, "iot:Subscribe", f"{ARN}:topicfilter/{topic}", thing), topic
        assert allowed(device, "iot:Receive", f"{ARN}:topic/{topic}", thing), topic
    assert allowed(device, "iot:Connect", f"{ARN}:client/{thing}", thing)
    assert allowed(device, "iot:Publish", f"{ARN}:topic/$aws/things/{thing}/greengrassv2/health/json", thing)
    assert allowed(
        device, "iot:AssumeRoleWithCertificate", f"{ARN}:rolealias/GreengrassV2TokenExchangeRoleAlias", thing
    )


def test_device_may_not_touch_another_device_or_play_the_router(device: dict[str, Any]) -> None:
    thing, other = "cam-1", "cam-2"
    assert not allowed(device, "iot:Connect", f"{ARN}:client/{other}", thing)
    assert not allowed(device, "iot:Publish", f"{ARN}:topic/{messages.telemetry_topic(other)}", thing)
    assert not allowed(device, "iot:Subscribe", f"{ARN}:topicfilter/{messages.infer_topic(other)}", thing)
    assert not allowed(device, "iot:Receive", f"{ARN}:topic/{messages.result_topic(other)}", thing)
    assert not allowed(device, "iot:Publish", f"{ARN}:topic/{messages.offload_result_topic(thing)}", thing)
    assert not allowed(device, "iot:Subscribe", f"{ARN}:topicfilter/edgeinfer/+/offload", thing)
    assert not allowed(device, "iot:Publish", f"{ARN}:topic/$aws/things/{other}/shadow/update", thing)
    assert not allowed(device, "iot:Publish", f"{ARN}:topic/{messages.TIMINGS_TOPIC}", thing)  # local only


def test_router_shares_the_offload_stream_and_answers_any_device(router: dict[str, Any]) -> None:
    me = "edgeinfer-router-1"
    group = RouterConfig().group
    assert allowed(router, "iot:Subscribe", f"{ARN}:topicfilter/{offload_filter(group)}", me)
    assert allowed(router, "iot:Receive", f"{ARN}:topic/{messages.offload_topic('cam-1')}", me)
    assert allowed(router, "iot:Publish", f"{ARN}:topic/{messages.offload_result_topic('cam-1')}", me)
    # not a plain subscription (every router would get every request), not the devices' own topics
    assert not allowed(router, "iot:Subscribe", f"{ARN}:topicfilter/edgeinfer/+/offload", me)
    assert not allowed(router, "iot:Subscribe", f"{ARN}:topicfilter/$share/other/edgeinfer/+/offload", me)
    assert not allowed(router, "iot:Publish", f"{ARN}:topic/{messages.result_topic('cam-1')}", me)
    assert not allowed(router, "iot:Publish", f"{ARN}:topic/{messages.infer_topic('cam-1')}", me)
    assert not allowed(router, "iot:Receive", f"{ARN}:topic/{messages.telemetry_topic('cam-1')}", me)


def test_render_fills_every_placeholder() -> None:
    text = json.dumps(render("cloud-router", region="cn-north-1", account=ACCOUNT, router_group="g1"))
    assert "<" not in text
    assert "arn:aws-cn:iot:cn-north-1:" in text
    assert "$share/g1/edgeinfer/+/offload" in text


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"region": "europe", "account": ACCOUNT}, "not an AWS region"),
        ({"region": REGION, "account": "12345"}, "not an AWS account id"),
        ({"region": REGION, "account": ACCOUNT, "router_group": "a/b"}, "group"),
        ({"region": REGION, "account": ACCOUNT, "thing": "cam/1"}, "not an AWS IoT thing name"),
    ],
)
def test_render_refuses_bad_values(kwargs: dict[str, str], match: str) -> None:
    with pytest.raises(PolicyError, match=match):
        render("cloud-router", **kwargs)


def test_a_policy_pinned_to_one_thing_allows_only_that_thing() -> None:
    pinned = render("core-device", region=REGION, account=ACCOUNT, thing="cam-1")
    assert THING_VAR not in json.dumps(pinned)
    assert allowed(pinned, "iot:Connect", f"{ARN}:client/cam-1", "cam-1")
    assert allowed(pinned, "iot:Publish", f"{ARN}:topic/{messages.telemetry_topic('cam-1')}", "cam-1")
    # attached to another thing by mistake, it still grants only cam-1's resources
    assert not allowed(pinned, "iot:Connect", f"{ARN}:client/cam-2", "cam-2")
    assert not allowed(pinned, "iot:Publish", f"{ARN}:topic/{messages.telemetry_topic('cam-2')}", "cam-2")


def test_cli_prints_the_rendered_policy(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = ["cloud", "policy", "core-device", "--region", REGION, "--account", ACCOUNT]
    assert cli.main(argv) == 0
    assert json.loads(capsys.readouterr().out) == render("core-device", region=REGION, account=ACCOUNT)

    argv = ["cloud", "policy", "cloud-router", "--region", "cn-north-1", "--account", ACCOUNT]
    argv += ["--router-group", "g1", "--thing", "router-1", "--out", str(tmp_path / "router.json")]
    assert cli.main(argv) == 0
    assert capsys.readouterr().out == ""
    assert json.loads((tmp_path / "router.json").read_text()) == render(
        "cloud-router", region="cn-north-1", account=ACCOUNT, router_group="g1", thing="router-1"
    )


def test_cli_bad_value_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["cloud", "policy", "core-device", "--region", REGION, "--account", "12345"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "edgeinfer: error: not an AWS account id (12 digits): '12345'\n"


def test_cli_help_names_the_templates_and_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["cloud", "policy", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for name in TEMPLATES:
        assert f"  {name} " in out
    assert "aws iot create-policy" in out
    with pytest.raises(SystemExit):
        cli.main(["cloud", "--help"])
    listed = capsys.readouterr().out
    assert "    router " in listed  # beside the router's own command
    assert "    policy " in listed
