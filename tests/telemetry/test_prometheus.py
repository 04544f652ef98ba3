"""The Prometheus text: per-model answers and low confidence beside the window's figures."""

from __future__ import annotations

from edgeinfer.messages import ModelQuality, StageQuantiles, TelemetryWindow, iso_utc
from edgeinfer.telemetry.prometheus import MetricsState


def window(seq: int, *models: ModelQuality) -> TelemetryWindow:
    return TelemetryWindow(
        thing="dev",
        seq=seq,
        window_s=10.0,
        count=sum(m.count for m in models),
        errors={},
        dropped=0,
        offloaded=0,
        throughput_rps=1.0,
        latency_ms={"total": StageQuantiles(1, 2, 3, 4)},
        batch={},
        queue_depth={},
        provider="CPUExecutionProvider",
        system={},
        timestamp=iso_utc(0),
        models=list(models),
    )


def quality(version: str, count: int, low: int) -> ModelQuality:
    return ModelQuality("resnet", version, "int8", "CPUExecutionProvider", count, low)


def test_model_requests_and_low_confidence_per_model_and_version() -> None:
    state = MetricsState()
    assert "edgeinfer_model" not in state.render()  # nothing answered yet: no model families
    state.update(window(0, quality("1.0.0", 10, 2)))
    state.update(window(1, quality("1.0.0", 5, 0), quality("1.1.0", 20, 5)))
    lines = state.render().splitlines()
    assert 'edgeinfer_model_requests_total{model="resnet",version="1.0.0"} 15' in lines
    assert 'edgeinfer_model_requests_total{model="resnet",version="1.1.0"} 20' in lines
    assert 'edgeinfer_model_low_confidence_total{model="resnet",version="1.0.0"} 2' in lines
    assert 'edgeinfer_model_low_confidence_share{thing="dev",model="resnet",version="1.1.0"} 0.25' in lines
    assert (
        'edgeinfer_model_info{thing="dev",model="resnet",version="1.1.0",variant="int8",'
        'provider="CPUExecutionProvider"} 1'
    ) in lines
    assert "# TYPE edgeinfer_model_requests_total counter" in lines
    state.update(window(2, quality("1.1.0", 3, 0)))
    last = [line for line in state.render().splitlines() if line.startswith("edgeinfer_model_info")]
    assert last == [line for line in last if 'version="1.1.0"' in line]  # the last window's models only


def test_capture_counters_add_up_over_windows_by_event() -> None:
    state = MetricsState()
    assert "edgeinfer_capture" not in state.render()  # capture off: no family
    first, second = window(0), window(1)
    first.capture = {"chosen": 3, "spooled": 3, "uploaded": 2}
    second.capture = {"chosen": 1, "dropped_size": 2, "upload_failures": 1}
    state.update(first)
    state.update(second)
    lines = state.render().splitlines()
    assert "# TYPE edgeinfer_capture_total counter" in lines
    assert 'edgeinfer_capture_total{event="chosen"} 4' in lines
    assert 'edgeinfer_capture_total{event="uploaded"} 2' in lines
    assert 'edgeinfer_capture_total{event="dropped_size"} 2' in lines
    assert 'edgeinfer_capture_total{event="upload_failures"} 1' in lines


def test_source_counters_add_up_over_windows_per_source() -> None:
    state = MetricsState()
    assert "edgeinfer_source" not in state.render()  # no frame source: no family
    first, second = window(0), window(1)
    first.sources = {"gate": {"served": 90, "dropped": 10}, "dock": {"served": 50}}
    second.sources = {"gate": {"served": 80, "reconnects": 1, "outage_ms": 10400}}
    state.update(first)
    state.update(second)
    lines = state.render().splitlines()
    assert "# TYPE edgeinfer_source_total counter" in lines
    assert 'edgeinfer_source_total{source="gate",event="served"} 170' in lines
    assert 'edgeinfer_source_total{source="gate",event="outage_ms"} 10400' in lines
    assert 'edgeinfer_source_total{source="dock",event="served"} 50' in lines
