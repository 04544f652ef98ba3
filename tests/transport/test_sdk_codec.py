"""The awsiotsdk's model and RPC layer give the same shapes and bytes with `edgeinfer.codec` installed."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from awsiot.eventstreamrpc import ClientOperation
from awsiot.greengrasscoreipc import model

from edgeinfer.transport import _sdk_codec


@pytest.fixture
def sdk_codec() -> Iterator[None]:
    was = _sdk_codec.installed()
    yield
    (_sdk_codec.install if was else _sdk_codec.uninstall)()


def _shapes() -> list[Any]:
    image = os.urandom(90_000)
    return [
        model.PublishToTopicRequest(
            topic="edgeinfer/t/infer",
            publish_message=model.PublishMessage(binary_message=model.BinaryMessage(message=image)),
        ),
        model.PublishToTopicRequest(
            topic="a/b",
            publish_message=model.PublishMessage(
                json_message=model.JsonMessage(message={"id": "x", "n": [1, 2.5]})
            ),
        ),
        model.SubscriptionResponseMessage(
            binary_message=model.BinaryMessage(message=b"", context=model.MessageContext(topic="a"))
        ),
        model.PublishToIoTCoreRequest(topic_name="t", qos=model.QOS.AT_LEAST_ONCE, payload=image[:1000]),
    ]


def _round_trip(shape: Any) -> tuple[bytes, Any]:
    payload = ClientOperation._json_payload_from_shape(None, shape)  # type: ignore[arg-type]
    return payload, ClientOperation._shape_from_json_payload(None, payload, type(shape))  # type: ignore[arg-type]


@pytest.mark.usefixtures("sdk_codec")
@pytest.mark.parametrize("shape", _shapes(), ids=lambda s: type(s).__name__)
def test_the_sdk_round_trips_the_same_shapes_with_and_without(shape: Any) -> None:
    _sdk_codec.uninstall()
    std_bytes, std_shape = _round_trip(shape)
    _sdk_codec.install()
    assert _sdk_codec.installed()
    fast_bytes, fast_shape = _round_trip(shape)
    assert json.loads(fast_bytes) == json.loads(std_bytes)  # the same JSON (whitespace aside)
    assert fast_shape == std_shape == shape
    # each side reads the other's bytes
    assert ClientOperation._shape_from_json_payload(None, std_bytes, type(shape)) == shape  # type: ignore[arg-type]


@pytest.mark.usefixtures("sdk_codec")
def test_install_is_idempotent_and_uninstall_restores_the_stdlib() -> None:
    import base64

    import awsiot.eventstreamrpc as rpc

    _sdk_codec.install()
    _sdk_codec.install()
    assert _sdk_codec.installed()
    _sdk_codec.uninstall()
    assert rpc.json is json
    assert model.base64 is base64
