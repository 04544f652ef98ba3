"""edgeinfer_bench.iot.load: each load's label."""

from __future__ import annotations

from edgeinfer_bench.iot.load import load_labels


def test_each_load_has_its_own_label_for_its_request_ids() -> None:
    assert load_labels([100, 200, 100, 0.5], 2000) == [
        ("r100", 100),
        ("r200", 200),
        ("r100-2", 100),
        ("r0.5", 0.5),
        ("flood", 2000),
    ]
    assert load_labels([50], 0) == [("r50", 50)]
