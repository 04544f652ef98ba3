"""edgeinfer_bench.iot.local_sender: a flood from a component's process over the real awsiotsdk IPC
client, on the simulated core: what it sent arrives, once each, and what its window could not take
in time is counted, never queued."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import yaml

from edgeinfer.messages import Request
from edgeinfer.sim import Simulator
from edgeinfer.sim.testing import CLIENT, client_recipe
from edgeinfer_bench.iot.local_sender import LocalFlood, LocalSpec
from edgeinfer_bench.requests import Template
from tests.helpers.wait import eventually

TOPIC = "edgeinfer/flood-unit/infer"


def test_every_request_sent_arrives_once_and_the_rest_is_counted_not_sent(
    simulator: Callable[..., Simulator], tmp_path: Path
) -> None:
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / f"{CLIENT}.yaml").write_text(yaml.safe_dump(client_recipe(topics="edgeinfer/#")))
    sim = simulator(recipes, thing="flood-unit")
    inbox = sim.local_client().subscribe(TOPIC)
    env = sim.ipc_env(CLIENT)
    part = Template.from_request(Request("__ID__", image=b"\xff\xd8 not a photo", sent_at=0.0).to_json())
    spec = LocalSpec(
        socket=env["AWS_GG_NUCLEUS_DOMAIN_SOCKET_FILEPATH_FOR_COMPONENT"],
        token=env["SVCUID"],
        topic=TOPIC,
        parts=[part],
        label="u",
        rate=300.0,
        seconds=1.0,
        max_inflight=4,
    )
    flood = LocalFlood(spec)
    try:
        flood.ready()
        flood.go()
        report = flood.report()
    finally:
        flood.close()
    sent = report["sent"]
    assert sent
    assert len(sent) + report["not_sent"] <= report["target"]
    assert report["publish_refused"] == report["publish_unanswered"] == 0
    eventually(lambda: len(inbox) >= len(sent), 30, "every request sent to arrive")
    assert sorted(json.loads(m.payload)["id"] for m in inbox.messages) == sorted(sent)
