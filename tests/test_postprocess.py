"""The post steps: the one softmax/top-k, and thresholds + class-aware NMS for detectors."""

from __future__ import annotations

import numpy as np
import pytest

from edgeinfer import postprocess
from edgeinfer.messages import Box, Detection, Result


def test_softmax_is_stable_and_sums_to_one() -> None:
    out = postprocess.softmax(np.array([[1000.0, 1001.0, 999.0], [0.0, 0.0, 0.0]]))
    assert out.dtype == np.float32
    assert np.allclose(out.sum(axis=1), 1.0)
    assert np.allclose(out[1], 1 / 3)
    assert out[0].argmax() == 1


def test_top_k_best_first_ties_in_index_order_and_k_clamped() -> None:
    probs = np.array([0.1, 0.4, 0.1, 0.4])
    assert postprocess.top_k(probs, 3) == [(1, 0.4), (3, 0.4), (0, 0.1)]
    assert len(postprocess.top_k(probs, 99)) == 4
    assert len(postprocess.top_k(probs, 0)) == 1


def test_iou_of_known_boxes() -> None:
    a = np.array([[0, 0, 10, 10]])
    b = np.array([[0, 0, 10, 10], [5, 0, 15, 10], [20, 20, 30, 30], [0, 0, 0, 0]])
    assert np.allclose(postprocess.iou(a, b), [[1.0, 50 / 150, 0.0, 0.0]])


def _scores(rows: list[list[float]]) -> np.ndarray:
    return np.array(rows, dtype=np.float32)


def test_nms_suppresses_overlaps_within_a_class_only() -> None:
    boxes = np.array([[0, 0, 10, 10], [1, 1, 11, 11], [0, 0, 10, 10], [50, 50, 60, 60]], np.float32)
    scores = _scores([[0.9, 0.0], [0.8, 0.0], [0.0, 0.7], [0.3, 0.0]])
    found = postprocess.detections(boxes, scores, score_threshold=0.25, iou_threshold=0.45, max_detections=10)
    assert [(d.index, round(d.score, 2)) for d in found] == [(0, 0.9), (1, 0.7), (0, 0.3)]
    assert found[0].box == postprocess.Box(0.0, 0.0, 10.0, 10.0)


def test_one_anchor_may_answer_two_classes_and_the_threshold_and_limit_hold() -> None:
    boxes = np.array([[0, 0, 10, 10], [40, 40, 50, 50]], np.float32)
    scores = _scores([[0.6, 0.5, 0.1], [0.2, 0.0, 0.95]])
    found = postprocess.detections(boxes, scores, score_threshold=0.25, iou_threshold=0.45, max_detections=10)
    assert [d.index for d in found] == [2, 0, 1]
    top = postprocess.detections(boxes, scores, score_threshold=0.25, iou_threshold=0.45, max_detections=2)
    assert [d.index for d in top] == [2, 0]
    assert (
        postprocess.detections(boxes, scores, score_threshold=0.99, iou_threshold=0.45, max_detections=9)
        == []
    )


def test_the_runtimes_letterbox_is_undone_and_boxes_clipped() -> None:
    # a 200x100 source letterboxed to 100x100: scale 0.5, 25 rows of grey above
    boxes = np.array([[10, 30, 40, 60], [-5, 20, 120, 90]], np.float32)
    scores = _scores([[0.9], [0.8]])
    found = postprocess.detections(
        boxes,
        scores,
        score_threshold=0.25,
        iou_threshold=0.45,
        max_detections=10,
        scale=(0.5, 0.5),
        offset=(0.0, 25.0),
        limit=(200.0, 100.0),
    )
    assert found[0].box == postprocess.Box(20.0, 10.0, 80.0, 70.0)
    assert found[1].box == postprocess.Box(0.0, 0.0, 200.0, 100.0)


def test_many_candidates_stay_vectorised_and_correct() -> None:
    rng = np.random.default_rng(0)
    xy = rng.uniform(0, 400, (2535, 2)).astype(np.float32)
    boxes = np.concatenate([xy, xy + rng.uniform(5, 60, (2535, 2)).astype(np.float32)], axis=1)
    scores = (rng.uniform(0, 1, (2535, 80)) ** 8).astype(np.float32)
    found = postprocess.detections(
        boxes, scores, score_threshold=0.25, iou_threshold=0.45, max_detections=300
    )
    assert 0 < len(found) <= 300
    by_class: dict[int, list[postprocess.Detection]] = {}
    for d in found:
        by_class.setdefault(d.index, []).append(d)
    for dets in by_class.values():
        arr = np.array([[d.box.x_min, d.box.y_min, d.box.x_max, d.box.y_max] for d in dets])
        overlap = postprocess.iou(arr, arr)
        np.fill_diagonal(overlap, 0)
        assert (overlap <= 0.45 + 1e-6).all()
    assert [d.score for d in found] == sorted((d.score for d in found), reverse=True)


def test_a_zero_threshold_looks_at_the_best_candidates_only() -> None:
    rng = np.random.default_rng(1)
    xy = rng.uniform(0, 400, (2535, 2)).astype(np.float32)
    boxes = np.concatenate([xy, xy + 20], axis=1)
    scores = rng.uniform(0.01, 1, (2535, 80)).astype(np.float32)  # 200,000 pairs over 0
    found = postprocess.detections(boxes, scores, score_threshold=0.0, iou_threshold=0.45, max_detections=100)
    assert len(found) == 100
    assert found[0].score == pytest.approx(float(scores.max()))


def test_a_detection_result_on_the_wire_and_in_dlrs_shape() -> None:
    result = Result(
        id="d1",
        status="ok",
        timestamp="2026-12-01T00:00:00.000Z",
        detections=[Detection(16, "dog", 0.91234567, Box(70.26, 268.0, 199.5, 353.0))],
    )
    doc = result.to_dict()
    assert "predictions" not in doc
    assert doc["detections"] == [
        {
            "index": 16,
            "label": "dog",
            "score": 0.912346,
            "box": {"x_min": 70.3, "y_min": 268.0, "x_max": 199.5, "y_max": 353.0},
        }
    ]
    back = Result.parse(result.to_json())
    assert back.detections is not None
    assert back.detections[0].label == "dog"
    dlr = result.to_dlr_dict()
    assert dlr["inference-type"] == "object-detection"
    assert dlr["inference-results"] == [
        {"Label": "dog", "Score": "0.912346", "Boundaries": "[70.26 268 199.5 353]"}
    ]
    empty = Result(id="d2", status="ok", timestamp="t", detections=[])
    assert empty.to_dict()["detections"] == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_detections", 0),
        ("max_detections", 301),
        ("max_detections", 2.5),
        ("score_threshold", 1.0),
        ("score_threshold", -0.1),
        ("score_threshold", "0.5"),
        ("max_detections", True),
    ],
)
def test_bad_detection_parameters_are_bad_requests(field: str, value: object) -> None:
    from edgeinfer.messages import ErrorCode, MessageError, parse_request

    with pytest.raises(MessageError) as err:
        parse_request({"id": "x", "image": "aGVsbG8=", field: value})
    assert err.value.code is ErrorCode.BAD_REQUEST
    assert err.value.request_id == "x"
