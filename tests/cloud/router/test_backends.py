"""Router backends: ONNX Runtime on a real (tiny) model store, SageMaker and CloudWatch via Stubber."""

from __future__ import annotations

import datetime as dt
import io
import json
from pathlib import Path

import boto3
import cv2
import numpy as np
import pytest
from botocore.response import StreamingBody
from botocore.stub import ANY, Stubber

from edgeinfer.messages import ErrorCode
from edgeinfer_cloud.router.backends import BackendError, Job, OnnxBackend, SageMakerBackend
from edgeinfer_cloud.router.metrics import CloudWatchMetrics
from tests.helpers.router import jpeg


def solid(bgr: tuple[int, int, int]) -> bytes:
    img = np.zeros((40, 60, 3), dtype=np.uint8)
    img[:] = bgr
    ok, buf = cv2.imencode(".png", img)
    assert ok
    return bytes(buf)


# -------------------------------------------------------------------------------------------- ONNX


def test_onnx_backend_runs_the_store_in_one_batch(tiny_store: Path) -> None:
    backend = OnnxBackend.load(tiny_store, max_batch_size=4)
    assert backend.model_ref.name == "tiny"
    assert backend.provider == "cpu"
    assert backend.serves(None)
    assert backend.serves("tiny")
    assert not backend.serves("lite2")
    out = backend.infer(
        [Job(solid((0, 0, 255)), top_k=2), Job(b"not an image"), Job(solid((255, 0, 0)), top_k=1)]
    )
    assert out[0].ok
    assert out[0].predictions[0].label == "red"  # BGR (0,0,255) is red once decoded to RGB
    assert len(out[0].predictions) == 2
    assert out[1].code is ErrorCode.BAD_IMAGE
    assert out[2].predictions[0].label == "blue"
    assert abs(sum(p.score for p in backend.infer([Job(jpeg(), top_k=4)])[0].predictions) - 1) < 1e-4


def test_onnx_backend_missing_store_is_a_backend_error(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match="no model store"):
        OnnxBackend.load(tmp_path / "nothing")


def test_onnx_backend_survives_hostile_images(tiny_store: Path) -> None:
    backend = OnnxBackend.load(tiny_store, warm_up=False)
    hostile = [
        b"\xff\xd8\xff" + b"\x00" * 50,  # JPEG magic, no frame
        b"\x89PNG\r\n\x1a\n" + b"\x00" * 8 + b"IHDR" + (50000).to_bytes(4, "big") * 2,  # bomb header
        solid((1, 2, 3))[:-20],  # truncated PNG
        b"",
    ]
    for outcome in backend.infer([Job(h) for h in hostile]):
        assert outcome.code is ErrorCode.BAD_IMAGE


# --------------------------------------------------------------------------------------- SageMaker


def _sagemaker() -> tuple[SageMakerBackend, Stubber]:
    client = boto3.client("sagemaker-runtime", region_name="eu-west-1")
    stub = Stubber(client)
    return SageMakerBackend("lite2-endpoint", client=client, labels=["a", "b", "c"]), stub


def _body(doc: object) -> StreamingBody:
    raw = json.dumps(doc).encode()
    return StreamingBody(io.BytesIO(raw), len(raw))


def test_sagemaker_backend_parses_probabilities_and_ranked_predictions() -> None:
    backend, stub = _sagemaker()
    expected = {
        "EndpointName": "lite2-endpoint",
        "ContentType": "application/x-image",
        "Accept": "application/json",
        "Body": ANY,
    }
    stub.add_response("invoke_endpoint", {"Body": _body([0.1, 0.7, 0.2])}, expected)
    stub.add_response(
        "invoke_endpoint",
        {
            "Body": _body(
                {"predictions": [{"index": 2, "label": "c", "score": 0.4}, {"index": 0, "score": 0.6}]}
            )
        },
        expected,
    )
    stub.add_response("invoke_endpoint", {"Body": _body({"probabilities": [[0.5, 0.25, 0.25]]})}, expected)
    with stub:
        out = backend.infer([Job(b"img", top_k=2), Job(b"img", top_k=5), Job(b"img", top_k=1)])
    assert [(p.label, p.score) for p in out[0].predictions] == [("b", 0.7), ("c", 0.2)]
    assert [(p.index, p.label) for p in out[1].predictions] == [(0, "a"), (2, "c")]
    assert [p.label for p in out[2].predictions] == ["a"]
    stub.assert_no_pending_responses()


def test_sagemaker_backend_maps_errors_to_stable_codes() -> None:
    backend, stub = _sagemaker()
    stub.add_client_error(
        "invoke_endpoint", "ModelError", "cannot read image", 424, response_meta={}
    )  # 424 from SageMaker wrapping the container's answer
    stub.add_client_error("invoke_endpoint", "ThrottlingException", "slow down", 400)
    stub.add_client_error("invoke_endpoint", "ValidationError", "Endpoint not found", 400)
    stub.add_response("invoke_endpoint", {"Body": _body({"weird": 1})})
    with stub:
        out = backend.infer([Job(b"x") for _ in range(4)])
    assert [o.code for o in out] == [
        ErrorCode.BAD_IMAGE,
        ErrorCode.OVERLOADED,
        ErrorCode.INTERNAL,
        ErrorCode.INTERNAL,
    ]
    assert "unknown shape" in out[3].message


# -------------------------------------------------------------------------------------- CloudWatch


def test_cloudwatch_metrics_aggregate_per_thing() -> None:
    client = boto3.client("cloudwatch", region_name="eu-west-1")
    stamp = dt.datetime(2026, 11, 29, tzinfo=dt.timezone.utc)
    metrics = CloudWatchMetrics(client, namespace="edgeinfer/test", router="r1", now=lambda: stamp)
    metrics.record("dev-1", ok=True, code=None, latency_ms=10)
    metrics.record("dev-1", ok=True, code=None, latency_ms=30)
    metrics.record("dev-1", ok=False, code="BAD_IMAGE", latency_ms=1)

    def dims(**extra: str) -> list[dict[str, str]]:
        return [{"Name": "Router", "Value": "r1"}, {"Name": "Thing", "Value": "dev-1"}] + [
            {"Name": k, "Value": v} for k, v in extra.items()
        ]

    expected = [
        {"MetricName": "Requests", "Dimensions": dims(), "Timestamp": stamp, "Value": 3, "Unit": "Count"},
        {"MetricName": "Errors", "Dimensions": dims(), "Timestamp": stamp, "Value": 1, "Unit": "Count"},
        {
            "MetricName": "Errors",
            "Dimensions": dims(Code="BAD_IMAGE"),
            "Timestamp": stamp,
            "Value": 1,
            "Unit": "Count",
        },
        {
            "MetricName": "Latency",
            "Dimensions": dims(),
            "Timestamp": stamp,
            "StatisticValues": {"SampleCount": 2, "Sum": 40.0, "Minimum": 10.0, "Maximum": 30.0},
            "Unit": "Milliseconds",
        },
    ]
    with Stubber(client) as stub:
        stub.add_response("put_metric_data", {}, {"Namespace": "edgeinfer/test", "MetricData": expected})
        assert metrics.flush() == 4
        stub.add_client_error("put_metric_data", "Throttling", "slow down", 400)
        metrics.record("dev-1", ok=True, code=None, latency_ms=1)
        assert metrics.flush() == 0  # logged and dropped, never raised
        stub.assert_no_pending_responses()
    assert metrics.failed_flushes == 1
    assert metrics.flush() == 0  # nothing recorded since: no API call


def test_onnx_backend_serves_a_detector_with_boxes_in_the_images_pixels(tmp_path: Path) -> None:
    from tests.helpers.images import solid_jpeg
    from tests.helpers.tiny_detector import build_tiny_detector_store, expected_boxes

    backend = OnnxBackend.load(build_tiny_detector_store(tmp_path / "det"), max_batch_size=2)
    white = solid_jpeg((255, 255, 255), size=(120, 60))
    outcomes = backend.infer([Job(white), Job(white, max_detections=1), Job(b"not an image")])
    assert outcomes[0].ok
    assert outcomes[0].predictions == []
    assert outcomes[0].detections is not None
    assert len(outcomes[0].detections) == 4
    want = expected_boxes(120, 60)
    for d in outcomes[0].detections:
        box = [d.box.x_min, d.box.y_min, d.box.x_max, d.box.y_max]
        assert min(max(abs(a - b) for a, b in zip(box, row, strict=True)) for row in want) <= 5
    assert outcomes[1].detections is not None
    assert len(outcomes[1].detections) == 1
    assert outcomes[2].code == ErrorCode.BAD_IMAGE
