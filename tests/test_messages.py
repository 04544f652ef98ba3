"""The message contract: parsing never raises anything but MessageError, and shapes round-trip."""

from __future__ import annotations

import base64
import json
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgeinfer import messages
from edgeinfer.messages import (
    ErrorCode,
    Latency,
    MessageError,
    ModelQuality,
    ModelRef,
    OffloadOrigin,
    OffloadRequest,
    Prediction,
    Request,
    Result,
    StageQuantiles,
    TelemetryWindow,
    TimingBatch,
    TimingRecord,
    error_result,
    infer_topic,
    is_thing_name,
    iso_utc,
    offload_result_topic,
    parse_iso_utc,
    parse_request,
    read_request,
)

# The machines are shared: generation speed is not what these tests check.
_relaxed = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

IMG = base64.b64encode(b"\xff\xd8\xff fake jpeg").decode()


def _code(payload: Any, **kwargs: Any) -> tuple[ErrorCode, str | None]:
    with pytest.raises(MessageError) as info:
        parse_request(payload, **kwargs)
    return info.value.code, info.value.request_id


def test_minimal_request_gets_defaults() -> None:
    req = parse_request(json.dumps({"id": "r1", "image": IMG}).encode())
    assert req.id == "r1"
    assert req.image == base64.b64decode(IMG)
    assert (req.top_k, req.offload, req.result_format, req.deadline_ms) == (5, "auto", "edgeinfer", None)


def test_numeric_id_is_echoed_as_text() -> None:
    assert parse_request({"id": 7, "image": IMG}).id == "7"


@pytest.mark.parametrize(
    ("payload", "code", "rid"),
    [
        (b"{not json", ErrorCode.BAD_REQUEST, None),
        (b"\xff\xfe", ErrorCode.BAD_REQUEST, None),
        (b"[1, 2]", ErrorCode.BAD_REQUEST, None),
        (b'{"image": "aGk="}', ErrorCode.BAD_REQUEST, None),
        (b'{"id": "", "image": "aGk="}', ErrorCode.BAD_REQUEST, None),
        (b'{"id": true, "image": "aGk="}', ErrorCode.BAD_REQUEST, None),
        (b'{"id": "a"}', ErrorCode.BAD_REQUEST, "a"),
        (b'{"id": "a", "image": "***"}', ErrorCode.BAD_IMAGE, "a"),
        (b'{"id": "a", "image": ""}', ErrorCode.BAD_IMAGE, "a"),
        (b'{"id": "a", "image": "aGk=", "image_path": "/x"}', ErrorCode.BAD_REQUEST, "a"),
        (b'{"id": "a", "image": "aGk=", "top_k": 0}', ErrorCode.BAD_REQUEST, "a"),
        (b'{"id": "a", "image": "aGk=", "top_k": true}', ErrorCode.BAD_REQUEST, "a"),
        (b'{"id": "a", "image": "aGk=", "deadline_ms": -1}', ErrorCode.BAD_REQUEST, "a"),
        (b'{"id": "a", "image": "aGk=", "offload": "sometimes"}', ErrorCode.BAD_REQUEST, "a"),
        (b'{"id": "a", "image": "aGk=", "reply_to": "x/+/y"}', ErrorCode.BAD_REQUEST, "a"),
        (b'{"id": "a", "image": "aGk=", "result_format": "xml"}', ErrorCode.BAD_REQUEST, "a"),
        (b'{"id": "a", "image": "aGk=", "model": 3}', ErrorCode.BAD_REQUEST, "a"),
    ],
)
def test_bad_requests_get_a_stable_code_and_keep_the_id(
    payload: bytes, code: ErrorCode, rid: str | None
) -> None:
    assert _code(payload) == (code, rid)


def test_oversized_payload_is_too_large_and_still_echoes_the_id() -> None:
    payload = json.dumps({"id": "big", "image": IMG}).encode()
    assert _code(payload, max_bytes=10) == (ErrorCode.TOO_LARGE, "big")


def test_image_path_is_refused_from_iot_core() -> None:
    assert _code({"id": "p", "image_path": "/tmp/x.jpg"}, allow_image_path=False) == (
        ErrorCode.BAD_REQUEST,
        "p",
    )


@_relaxed
@given(st.binary(max_size=200))
def test_garbage_bytes_only_ever_raise_message_error(payload: bytes) -> None:
    try:
        parse_request(payload)
    except MessageError as exc:
        assert isinstance(exc.code, ErrorCode)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@_relaxed
@given(
    st.fixed_dictionaries(
        {},
        optional={
            "id": _json,
            "image": st.one_of(_json, st.just(IMG)),
            "image_path": _json,
            "top_k": _json,
            "deadline_ms": _json,
            "offload": _json,
            "reply_to": _json,
            "result_format": _json,
            "model": _json,
        },
    )
)
def test_generated_documents_parse_or_fail_with_a_code(doc: dict[str, Any]) -> None:
    try:
        req = parse_request(json.dumps(doc))
    except MessageError as exc:
        assert isinstance(exc.code, ErrorCode)
    else:
        assert req.id
        assert (req.image is None) != (req.image_path is None)


_window_keys = ("thing", "seq", "window_s", "count", "errors", "latency_ms", "batch", "system")
_result_keys = ("id", "status", "predictions", "model", "batch_size", "latency_ms", "error")


@_relaxed
@given(
    st.fixed_dictionaries({}, optional=dict.fromkeys(_window_keys + _result_keys + ("records",), _json))
    | _json
)
def test_generated_results_windows_and_timings_parse_or_raise_message_error(doc: Any) -> None:
    payload = json.dumps(doc)
    for parse in (Result.parse, TimingBatch.parse, lambda p: TelemetryWindow.from_dict(json.loads(p))):
        try:
            parse(payload)
        except MessageError as exc:
            assert exc.code is ErrorCode.BAD_REQUEST


def test_request_round_trips() -> None:
    req = Request(id="r", image=b"abc", reply_to="a/b", deadline_ms=50.0, top_k=3, offload="never")
    assert parse_request(req.to_json()) == req


def test_offload_request_round_trips_and_requires_origin() -> None:
    off = OffloadRequest(Request(id="o", image=b"abc"), OffloadOrigin("dev-1", 42.5))
    back = OffloadRequest.parse(off.to_json())
    assert back.request == off.request
    assert back.origin.thing == "dev-1"
    assert back.origin.deadline_left_ms == 42.5
    with pytest.raises(MessageError) as info:
        OffloadRequest.parse(Request(id="o", image=b"abc").to_json())
    assert info.value.request_id == "o"


def test_result_shape_and_round_trip() -> None:
    result = Result(
        id="r",
        status="ok",
        timestamp=iso_utc(0),
        predictions=[Prediction(281, "tabby", 0.5)],
        model=ModelRef("efficientnet-lite0", "0.1.0", "int8-cpu"),
        provider="CPUExecutionProvider",
        batch_size=4,
        latency_ms=Latency(1, 2, 3, 4, 10),
    )
    doc = json.loads(result.to_json())
    assert doc["predictions"] == [{"index": 281, "label": "tabby", "score": 0.5}]
    assert doc["timestamp"] == "1970-01-01T00:00:00.000Z"
    assert set(doc["latency_ms"]) == {"queue", "decode", "inference", "postprocess", "total"}
    assert "error" not in doc
    assert Result.parse(result.to_json()) == result


def test_error_result_carries_code_and_no_predictions() -> None:
    doc = json.loads(error_result("x", ErrorCode.OVERLOADED, "queue full", timestamp=iso_utc(1)).to_json())
    assert doc["status"] == "error"
    assert doc["error"] == {"code": "OVERLOADED", "message": "queue full"}
    assert "predictions" not in doc


def test_dlr_shape_keeps_aws_field_names() -> None:
    result = Result(id="r", status="ok", timestamp="t", predictions=[Prediction(1, "goldfish", 0.9)])
    dlr = result.to_dlr_dict()
    assert dlr["inference-results"] == [{"Label": "goldfish", "Score": "0.9"}]
    assert dlr["inference-type"] == "image-classification"


def test_timing_batch_round_trips() -> None:
    batch = TimingBatch(
        "dev",
        [TimingRecord("a", "error", Latency(total=5), code=ErrorCode.BAD_IMAGE, offloaded=True, end=2.5)],
        executions=[4, 1],
        timestamp=iso_utc(3),
    )
    back = TimingBatch.parse(batch.to_json())
    assert back.records[0].code is ErrorCode.BAD_IMAGE
    assert back.records[0].offloaded
    assert back.executions == [4, 1]


def test_timing_batch_names_each_model_once_and_its_labels_beside_the_records() -> None:
    v1, v2 = ModelRef("resnet", "1.0.0", "int8"), ModelRef("resnet", "1.1.0", "int8")
    cat, dog = Prediction(281, "tabby cat", 0.91234), Prediction(207, "golden retriever", 0.4)
    records = [
        TimingRecord("a", "ok", Latency(total=5), provider="CPUExecutionProvider", model=v1, top=(cat,)),
        TimingRecord("b", "ok", Latency(total=5), provider="CPUExecutionProvider", model=v1, top=(dog,)),
        TimingRecord("c", "ok", Latency(total=5), provider="CPUExecutionProvider", model=v2, top=(cat,)),
        TimingRecord(
            "d",
            "ok",
            Latency(total=5),
            model=v2,
            top=(cat, dog),
            detector=True,
            provider="CPUExecutionProvider",
        ),
        TimingRecord("e", "error", Latency(total=1), code=ErrorCode.BAD_IMAGE),
    ]
    payload = TimingBatch("dev", records, timestamp=iso_utc(3)).to_json()
    doc = json.loads(payload)
    assert [(m["name"], m["version"], m["provider"]) for m in doc["models"]] == [
        ("resnet", "1.0.0", "CPUExecutionProvider"),
        ("resnet", "1.1.0", "CPUExecutionProvider"),
    ]
    assert doc["models"][0]["labels"] == {"281": "tabby cat", "207": "golden retriever"}
    assert [r.get("m") for r in doc["records"]] == [0, 0, 1, 1, None]
    assert doc["records"][0]["top"] == [281, 0.912]  # the index and the score, never the label
    back = TimingBatch.parse(payload).records
    assert [(r.model, r.detector) for r in back] == [
        (v1, False),
        (v1, False),
        (v2, False),
        (v2, True),
        (None, False),
    ]
    assert back[3].top == (Prediction(281, "tabby cat", 0.912), Prediction(207, "golden retriever", 0.4))
    assert back[4].top == ()


def test_timing_batch_without_a_model_table_reads_as_before_and_bad_entries_are_left_out() -> None:
    old = {
        "thing": "dev",
        "records": [{"id": "a", "status": "ok", "latency_ms": {"total": 2}}],
        "executions": [1],
    }
    (record,) = TimingBatch.parse(json.dumps(old)).records
    assert (record.model, record.top, record.detector) == (None, (), False)
    odd = {
        "thing": "dev",
        "models": [{"name": 3}, {"name": "m", "version": "2", "labels": {"1": "one", "x": "?"}}],
        "records": [
            {"id": "a", "status": "ok", "m": 0, "top": [1, 0.5]},
            {"id": "b", "status": "ok", "m": 1, "top": [1, 0.5, "2", 0.3, 4]},
            {"id": "c", "status": "ok", "m": 7, "top": [1, 0.5]},
            {"id": "d", "status": "ok", "m": 1, "top": "nope"},
        ],
    }
    a, b, c, d = TimingBatch.parse(json.dumps(odd)).records
    assert (a.model, c.model) == (None, None)
    assert b.model == ModelRef("m", "2", "")
    assert b.top == (Prediction(1, "one", 0.5),)
    assert d.model == ModelRef("m", "2", "")
    assert d.top == ()


def test_telemetry_window_round_trips() -> None:
    window = TelemetryWindow(
        thing="dev",
        seq=3,
        window_s=10.0,
        count=5,
        errors={"BAD_IMAGE": 1},
        dropped=0,
        offloaded=1,
        throughput_rps=0.5,
        latency_ms={"total": StageQuantiles(1, 2, 3, 4)},
        batch={"executions": 2, "mean_size": 2.5},
        queue_depth={"mean": 0.5, "max": 2},
        provider="CPUExecutionProvider",
        system={"cpu_percent": 12.0},
        timestamp=iso_utc(0),
    )
    assert TelemetryWindow.from_dict(json.loads(window.to_json())) == window
    assert "models" not in window.to_dict()  # a window without answers reads as an older one
    window.models = [
        ModelQuality(
            "resnet",
            "1.1.0",
            "int8",
            "CPUExecutionProvider",
            10,
            3,
            {"cat": 7, "other": 3},
            [0.0, 0.5, 1.0],
            [3, 7],
        )
    ]
    doc = json.loads(window.to_json())
    assert doc["models"] == [
        {
            "name": "resnet",
            "version": "1.1.0",
            "variant": "int8",
            "provider": "CPUExecutionProvider",
            "count": 10,
            "low_confidence": 3,
            "low_confidence_share": 0.3,
            "classes": {"cat": 7, "other": 3},
            "scores": {"bins": [0.0, 0.5, 1.0], "counts": [3, 7]},
        }
    ]
    assert TelemetryWindow.from_dict(doc) == window


def test_topics_and_timestamps() -> None:
    assert infer_topic("t") == "edgeinfer/t/infer"
    assert offload_result_topic("t") == "edgeinfer/t/offload/result"
    assert is_thing_name("edge-01:cam_2")
    assert is_thing_name("x" * 128)
    assert not any(map(is_thing_name, ["", "a/b", "a+", "#", "a b", "x" * 129]))
    assert parse_iso_utc(iso_utc(1234.5)) == pytest.approx(1234.5)


def test_sent_at_and_deadline_at_round_trip_and_give_the_absolute_deadline() -> None:
    from edgeinfer.messages import iso_utc

    doc = {"id": "t", "image": "AAAA", "deadline_ms": 250, "sent_at": "2026-11-29T14:52:13.000Z"}
    req = parse_request(doc)
    assert req.sent_at is not None
    assert req.expires_at() == pytest.approx(req.sent_at + 0.25)
    again = parse_request(req.to_json())
    assert again.sent_at == pytest.approx(req.sent_at)
    assert again.deadline_at is None
    both = parse_request({**doc, "deadline_at": iso_utc(req.sent_at + 0.1)})
    assert both.expires_at() == pytest.approx(req.sent_at + 0.1)  # the earlier of the two
    assert parse_request({"id": "n", "image": "AAAA", "deadline_ms": 5}).expires_at() is None
    for bad in (12345, "yesterday", ""):
        with pytest.raises(MessageError) as info:
            parse_request({**doc, "sent_at": bad})
        assert info.value.code is ErrorCode.BAD_REQUEST
        assert info.value.request_id == "t"


def test_raw_request_reads_its_parameters_from_user_properties() -> None:
    from edgeinfer.messages import parse_raw_request

    req = parse_raw_request(
        b"\xff\xd8jpeg", {"id": "r1", "top_k": "3", "deadline_ms": "80", "offload": "never"}
    )
    assert (req.id, req.top_k, req.deadline_ms, req.offload, req.image) == (
        "r1",
        3,
        80.0,
        "never",
        b"\xff\xd8jpeg",
    )
    assert parse_raw_request(b"x", {}, correlation_data=b"abc").id == "abc"
    assert parse_raw_request(b"x", {}, correlation_data=b"\x00\xff").id == "00ff"
    with pytest.raises(MessageError) as info:
        parse_raw_request(b"x", {"id": "r2", "top_k": "many"})
    assert info.value.code is ErrorCode.BAD_REQUEST
    assert info.value.request_id == "r2"
    with pytest.raises(MessageError) as info:
        parse_raw_request(b"x" * 100, {"id": "r3"}, max_bytes=10)
    assert info.value.code is ErrorCode.TOO_LARGE
    assert info.value.request_id == "r3"
    with pytest.raises(MessageError) as info:
        parse_raw_request(b"", {"id": "r4"})
    assert info.value.code is ErrorCode.BAD_IMAGE
    with pytest.raises(MessageError):
        parse_raw_request(b"x", {})  # no id and no correlation data


def _outcome(payload: bytes, **kw: Any) -> tuple[object, ...]:
    """What parsing `payload` comes to: the request, or the error's code and id."""
    try:
        return ("ok", parse_request(payload, **kw))
    except MessageError as exc:
        return ("error", exc.code, exc.request_id)


def _whole(payload: bytes, **kw: Any) -> tuple[object, ...]:
    """`_outcome` with the image never cut out: every byte through the JSON parser."""
    with mock.patch.object(messages, "_cut_image", return_value=None):
        return _outcome(payload, **kw)


_TRICKY = [
    b'{"id":"a","image":"' + IMG.encode() + b'","top_k":2}',
    b'{ "image" :\n "' + IMG.encode() + b'" , "id" : 7 }',
    b'{"id":"a","image":"' + IMG.replace("/", "\\/").encode() + b'"}',  # JSON may escape '/'
    b'{"id":"image","image_path":"/x"}',  # "image" as a value, not a key
    b'{"id":"a","meta":{"image":"' + IMG.encode() + b'"},"image_path":"/x"}',  # a nested key
    b'{"id":"a","image":"' + IMG.encode() + b'","image":"AAAA"}',  # the last duplicate wins
    b'{"id":"a","image":"' + IMG.encode() + b'","\\u0069mage":"AAAA"}',  # … however it is spelled
    b'{"id":"a","image":"ab\ncd"}',  # a control character: not JSON, so BAD_REQUEST, not BAD_IMAGE
    b'{"id":"a","image":"\xff\xfe"}',  # not UTF-8
    b'{"id":"a","image":"!!!!"}',  # JSON, not base64
    b'{"id":"a","image":""}',
    b'{"id":"a","image":"' + IMG.encode() + b'"',  # truncated
    b'{"image":"' + IMG.encode() + b'"}',  # no id
    b'{"id":"a","image":"' + IMG.encode() + b'","top_k":0}',
    b'["image", {"id": "a"}]',
]


@pytest.mark.parametrize("payload", _TRICKY)
def test_cutting_the_image_out_never_changes_the_outcome(payload: bytes) -> None:
    assert _outcome(payload) == _whole(payload)
    assert _outcome(payload, max_bytes=40) == _whole(payload, max_bytes=40)


def test_a_request_head_is_checked_but_its_image_decoded_only_on_demand() -> None:
    head = read_request(b'{"id":"a","image":"!!!!","top_k":3,"sent_at":"2026-11-29T14:52:13.123Z"}')
    assert head.request.image is None
    assert head.given == {"id", "image", "top_k", "sent_at"}
    assert head.request.expires_at() is None
    assert head.request.sent_at is not None
    with pytest.raises(MessageError) as bad:
        head.decode()
    assert (bad.value.code, bad.value.request_id) == (ErrorCode.BAD_IMAGE, "a")
    good = read_request(Request("b", image=b"\xff\xd8jpeg").to_json())
    assert good.decode().image == b"\xff\xd8jpeg"
    assert good.decode().image == b"\xff\xd8jpeg"  # a second call decodes nothing


@_relaxed
@given(
    st.fixed_dictionaries(
        {},
        optional={
            "id": _json,
            "image": st.one_of(_json, st.just(IMG), st.just(IMG.replace("/", "\\/"))),
            "image_path": _json,
            "top_k": _json,
            "deadline_ms": _json,
            "meta": st.fixed_dictionaries({"image": st.just(IMG)}),
        },
    ),
    st.sampled_from([(",", ":"), (", ", ": "), (" ,\n", " :\t")]),
    st.booleans(),
)
def test_generated_payloads_cut_or_whole_come_to_the_same(
    doc: dict[str, Any], separators: tuple[str, str], ascii_only: bool
) -> None:
    payload = json.dumps(doc, separators=separators, ensure_ascii=ascii_only).encode()
    assert _outcome(payload) == _whole(payload)
