"""Real component processes on the simulated core: lifecycle, environment, IPC from the component."""

from __future__ import annotations

import json

from edgeinfer.sim import Simulator
from tests.helpers.sim import PYTHON, Device

HELLO = """
import json, os, sys, time
from awsiot.greengrasscoreipc.clientv2 import GreengrassCoreIPCClientV2
from awsiot.greengrasscoreipc.model import BinaryMessage, PublishMessage

env = {k: os.environ.get(k) for k in ("AWS_IOT_THING_NAME", "AWS_REGION", "GGC_VERSION", "SVCUID",
       "AWS_GG_NUCLEUS_DOMAIN_SOCKET_FILEPATH_FOR_COMPONENT")}
print("ENV", json.dumps(env), flush=True)
ipc = GreengrassCoreIPCClientV2()
thing = os.environ["AWS_IOT_THING_NAME"]
greeting = ipc.get_configuration(key_path=["greeting"]).value["greeting"]

def local(event):
    msg = event.json_message or event.binary_message
    body = msg.message if event.json_message else msg.message.decode()
    ipc.publish_to_topic(topic="echo/" + msg.context.topic, publish_message=PublishMessage(
        binary_message=BinaryMessage(message=json.dumps({"greeting": greeting, "got": body}).encode())))

def cloud(event):
    ipc.publish_to_iot_core(topic_name=f"hello/{thing}/reply", qos="1",
                            payload=b"re:" + event.message.payload)

ipc.subscribe_to_topic(topic="in/+/x", on_stream_event=local)
ipc.subscribe_to_topic(topic="deep/#", on_stream_event=local)
ipc.subscribe_to_iot_core(topic_name=f"hello/{thing}/cmd", qos="1", on_stream_event=cloud)
ipc.publish_to_topic(topic="ready/hello", publish_message=PublishMessage(
    binary_message=BinaryMessage(message=b"ready")))
while True:
    time.sleep(1)
"""


def add_hello(device: Device) -> None:
    device.add(
        "com.example.Hello",
        lifecycle={"run": f"{PYTHON} -u {{artifacts:path}}/hello.py"},
        config={"greeting": "hi"},
        access={
            "aws.greengrass.ipc.pubsub": {
                "p": {
                    "operations": ["aws.greengrass#PublishToTopic", "aws.greengrass#SubscribeToTopic"],
                    "resources": ["in/+/x", "deep/#", "echo/*", "ready/hello"],
                }
            },
            "aws.greengrass.ipc.mqttproxy": {
                "m": {"operations": ["*"], "resources": ["hello/{iot:thingName}/*"]}
            },
        },
        files={"hello.py": HELLO},
    )


def test_hello_component_runs_with_the_nucleus_environment_and_talks_ipc(simulator, device: Device) -> None:
    add_hello(device)
    sim: Simulator = simulator(device.recipes, device.artifacts, thing="t-hello")
    local = sim.local_client()
    ready = local.subscribe("ready/#")
    echoes = local.subscribe("echo/#")
    cloud = sim.cloud_client()
    replies = cloud.subscribe("hello/t-hello/reply")

    assert sim.wait_for_state("com.example.Hello", "RUNNING", timeout=30) == "RUNNING"
    ready.wait_for(1, timeout=30)
    env_line = next(line for line in sim.logs("com.example.Hello").splitlines() if line.startswith("ENV "))
    env = json.loads(env_line[4:])
    assert env["AWS_IOT_THING_NAME"] == "t-hello"
    assert env["AWS_REGION"] == "us-east-1"
    assert env["GGC_VERSION"]
    assert env["AWS_GG_NUCLEUS_DOMAIN_SOCKET_FILEPATH_FOR_COMPONENT"] == sim.socket_path
    assert len(sim.socket_path) < 108

    # local pub/sub both ways, + and # wildcards, JSON and binary messages
    local.publish("in/a/x", {"n": 1})
    local.publish("deep/a/b/c", b"raw")
    local.publish("in/a/b/x", b"not matched by in/+/x")
    got = echoes.wait_for(2, timeout=15)
    bodies = {m.topic: json.loads(m.payload) for m in got}
    assert bodies["echo/in/a/x"] == {"greeting": "hi", "got": {"n": 1}}
    assert bodies["echo/deep/a/b/c"] == {"greeting": "hi", "got": "raw"}

    # IoT Core both ways through mosquitto
    cloud.publish("hello/t-hello/cmd", b"ping", qos=1)
    assert replies.wait_for(1, timeout=15)[0].payload == b"re:ping"
    assert "echo/in/a/b/x" not in {m.topic for m in echoes.messages}

    sim.stop()
    assert sim.state("com.example.Hello") == "FINISHED"
