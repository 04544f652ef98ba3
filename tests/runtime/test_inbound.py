"""The runtime's reader: plain message values in, a request with its reply target or a refusal out."""

from __future__ import annotations

import base64
import json
from typing import Any

from edgeinfer.messages import DEFAULT_TOP_K, ErrorCode, iso_utc, result_topic
from edgeinfer.runtime.config import RuntimeConfig
from edgeinfer.runtime.inbound import Inbound, Refusal, ReplyTarget, read_message, reply_allowed
from edgeinfer.transport import Message, MqttProperties

THING = "cam-1"
DEFAULT = result_topic(THING)
IMAGE = base64.b64encode(b"\xff\xd8 not really a jpeg").decode()


def json_msg(doc: dict[str, Any], **kw: Any) -> Message:
    return Message(f"edgeinfer/{THING}/infer", json.dumps(doc).encode(), **kw)


def read(msg: Message, cfg: RuntimeConfig | None = None) -> Inbound | Refusal:
    return read_message(msg, cfg or RuntimeConfig(), THING)


def accepted(msg: Message, cfg: RuntimeConfig | None = None) -> Inbound:
    out = read(msg, cfg)
    assert isinstance(out, Inbound), out
    return out


def refused(msg: Message, cfg: RuntimeConfig | None = None) -> Refusal:
    out = read(msg, cfg)
    assert isinstance(out, Refusal), out
    return out


def test_a_json_request_keeps_its_image_base64_until_it_is_taken_on() -> None:
    got = accepted(json_msg({"id": "r1", "image": IMAGE}))
    assert got.request.id == "r1"
    assert got.request.image is None
    assert got.head is not None
    assert got.reply == ReplyTarget(DEFAULT, "local", None)
    assert got.head.decode().image == base64.b64decode(IMAGE)


def test_the_configured_defaults_fill_only_what_the_request_left_out() -> None:
    cfg = RuntimeConfig(top_k=3, max_detections=7, score_threshold=0.4)
    got = accepted(json_msg({"id": "r", "image": IMAGE}), cfg)
    assert (got.request.top_k, got.request.max_detections, got.request.score_threshold) == (3, 7, 0.4)
    given = {"id": "r", "image": IMAGE, "top_k": DEFAULT_TOP_K, "max_detections": 2, "score_threshold": 0.1}
    got = accepted(json_msg(given), cfg)
    assert (got.request.top_k, got.request.max_detections, got.request.score_threshold) == (
        DEFAULT_TOP_K,
        2,
        0.1,
    )
    assert accepted(json_msg({"id": "r", "image": IMAGE})).request.top_k == DEFAULT_TOP_K


def test_a_malformed_request_is_refused_as_data_with_its_id() -> None:
    got = refused(json_msg({"id": "r9", "image": IMAGE, "top_k": 0}))
    assert (got.code, got.request_id) == (ErrorCode.BAD_REQUEST, "r9")
    assert got.reply == ReplyTarget(DEFAULT, "local", None)
    assert refused(Message("t", b"not json")).request_id is None


def test_reply_to_outside_the_allowed_topics_is_refused_on_the_default_topic() -> None:
    cfg = RuntimeConfig(reply_to_topics=["apps/{thing}/#"])
    assert accepted(json_msg({"id": "a", "image": IMAGE, "reply_to": "apps/cam-1/x"}), cfg).reply.topic == (
        "apps/cam-1/x"
    )
    got = refused(json_msg({"id": "b", "image": IMAGE, "reply_to": "apps/other/x"}), cfg)
    assert got.code is ErrorCode.BAD_REQUEST
    assert "'reply_to' 'apps/other/x'" in got.message
    assert got.reply.topic == DEFAULT
    assert reply_allowed(DEFAULT, RuntimeConfig(reply_to_topics=[]), THING)


def test_mqtt5_response_topic_and_correlation_data() -> None:
    props = MqttProperties(correlation_data=b"c1", response_topic=f"edgeinfer/{THING}/result/app")
    got = accepted(json_msg({"id": "r", "image": IMAGE}, target="iot", properties=props))
    assert got.reply.topic == f"edgeinfer/{THING}/result/app"
    assert got.reply.bus == "iot"
    assert got.request.reply_to == got.reply.topic
    assert got.reply.properties is not None
    assert got.reply.properties.correlation_data == b"c1"
    # A malformed request is still answered on its (allowed) response topic, with its correlation data.
    bad = refused(Message("t", b"{", target="iot", properties=props))
    assert bad.reply.topic == f"edgeinfer/{THING}/result/app"
    assert bad.reply.properties is not None
    # One outside the allowed topics: BAD_REQUEST on the default topic.
    elsewhere = MqttProperties(correlation_data=b"c2", response_topic="elsewhere/x")
    got2 = refused(json_msg({"id": "r2", "image": IMAGE}, target="iot", properties=elsewhere))
    assert got2.message == "response topic 'elsewhere/x' is not a topic this component may publish to"
    assert got2.reply.topic == DEFAULT
    assert got2.request_id == "r2"
    # Properties count on IoT Core only.
    assert accepted(json_msg({"id": "r", "image": IMAGE}, properties=elsewhere)).reply.topic == DEFAULT


def test_a_raw_image_on_iot_core_takes_its_parameters_from_user_properties() -> None:
    props = MqttProperties(content_type="image/jpeg", user_properties=(("id", "raw1"), ("top_k", "2")))
    got = accepted(Message("t", b"\xff\xd8jpeg", target="iot", properties=props), RuntimeConfig(top_k=9))
    assert got.request.image == b"\xff\xd8jpeg"
    assert got.head is None
    assert got.request.top_k == 2
    props = MqttProperties(content_type="image/png", correlation_data=b"corr")
    got = accepted(Message("t", b"png", target="iot", properties=props), RuntimeConfig(top_k=9))
    assert (got.request.id, got.request.top_k) == ("corr", 9)


def test_image_path_is_for_local_pub_sub_only() -> None:
    assert accepted(json_msg({"id": "p", "image_path": "/x.jpg"})).request.image_path == "/x.jpg"
    got = refused(json_msg({"id": "p", "image_path": "/x.jpg"}, target="iot"))
    assert got.reply.bus == "iot"
    assert "only accepted on local" in got.message


def test_the_deadline_is_the_earliest_of_what_the_request_and_its_envelope_say() -> None:
    wall = 1_800_000_000.0
    got = accepted(json_msg({"id": "d", "image": IMAGE, "deadline_ms": 500}))
    assert got.deadline(10.0, wall) == 10.5
    got = accepted(json_msg({"id": "d", "image": IMAGE, "sent_at": iso_utc(wall - 0.2), "deadline_ms": 500}))
    assert abs((got.deadline(10.0, wall) or 0) - 10.3) < 1e-3
    assert accepted(json_msg({"id": "d", "image": IMAGE})).deadline(10.0, wall) is None
    got = accepted(json_msg({"id": "d", "image": IMAGE}), RuntimeConfig(default_deadline_ms=100))
    assert got.deadline(10.0, wall) == 10.1
    props = MqttProperties(message_expiry_s=2)
    got = accepted(json_msg({"id": "d", "image": IMAGE, "deadline_ms": 5000}, target="iot", properties=props))
    assert got.deadline(10.0, wall) == 12.0
