"""The component on a MemoryBus: timings in, windows out on IoT Core, RUNNING, config on both nuclei,
Prometheus."""

from __future__ import annotations

import json
import random
import socket
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from edgeinfer.messages import (
    TIMINGS_TOPIC,
    Latency,
    ModelRef,
    Prediction,
    TelemetryWindow,
    TimingBatch,
    TimingRecord,
    telemetry_topic,
)
from edgeinfer.telemetry.component import ConfigError, TelemetryComponent, TelemetryConfig
from edgeinfer.transport import MemoryBus
from tests.helpers import PROJECT
from tests.helpers.clock import FakeClock
from tests.helpers.config import lite_typed
from tests.helpers.telemetry import make_record
from tests.helpers.wait import eventually

COMPONENT = "com.edgeinfer.Telemetry"


def windows(bus: MemoryBus, thing: str = "dev") -> list[TelemetryWindow]:
    return [
        TelemetryWindow.from_dict(json.loads(m.payload))
        for m in bus.messages_on(telemetry_topic(thing), "iot")
    ]


def make(
    tmp_path: Path, clock: FakeClock, *, lite: bool = False, **config: object
) -> tuple[MemoryBus, TelemetryComponent]:
    """`lite`: the configuration typed and the validation subscription answered as nucleus lite does."""
    bus = MemoryBus(config=lite_typed(config) if lite else dict(config), validation=not lite)
    cfg = TelemetryConfig.from_dict(bus.config)
    comp = TelemetryComponent(
        bus, "dev", cfg, clock=clock, system=lambda: {"cpu_percent": 3.5}, work=tmp_path
    )
    comp.start()
    return bus, comp


def test_timings_in_windows_out(tmp_path: Path, clock: FakeClock) -> None:
    bus, comp = make(tmp_path, clock, windowSeconds=5)
    assert bus.states == ["RUNNING"]
    rng = random.Random(1)
    for _ in range(10):
        bus.publish(TIMINGS_TOPIC, TimingBatch("dev", [make_record(rng) for _ in range(4)], [4]).to_json())
        clock.advance(1)
        comp.tick()
    bus.publish(TIMINGS_TOPIC, b"garbage")  # never raises on the transport thread
    comp.close()
    sent = windows(bus)
    assert [w.seq for w in sent] == [0, 1, 2]
    assert [w.count for w in sent] == [20, 20, 0]
    assert sent[0].batch["mean_size"] == 4
    assert sent[0].system["cpu_percent"] == 3.5
    assert sent[0].system["spool"] == {"pending": 0, "dropped": 0}
    assert comp.aggregator.bad_messages == 1


def test_outage_then_restart_keeps_seq(tmp_path: Path, clock: FakeClock) -> None:
    bus, comp = make(tmp_path, clock, windowSeconds=1)
    clock.advance(1)
    comp.tick()
    bus.fail_publish = True
    for _ in range(3):
        clock.advance(1)
        comp.tick()
    comp.close()  # the last window is spooled too
    assert len(comp.spool) == 4

    bus2, comp2 = make(tmp_path, clock, windowSeconds=1)
    clock.advance(1)
    comp2.tick()
    assert [w.seq for w in windows(bus)] == [0]
    assert [w.seq for w in windows(bus2)] == [1, 2, 3, 4, 5]


def test_configuration_validation_and_live_update(tmp_path: Path, clock: FakeClock) -> None:
    bus, comp = make(tmp_path, clock, windowSeconds=10)
    assert bus.propose_configuration({"windowSeconds": -1}) is not None
    assert bus.propose_configuration({"windowSeconds": "2", "spoolMaxWindows": 5}) is None
    assert comp.spool.max_windows == 5
    clock.advance(10)
    assert comp.tick()[0].window_s == 10
    clock.advance(2)
    assert comp.tick()[0].window_s == 2


def test_low_confidence_ships_in_the_code_and_follows_updates(tmp_path: Path, clock: FakeClock) -> None:
    assert TelemetryConfig().low_confidence == 0.5
    assert "lowConfidence" not in TelemetryConfig().to_dict()  # not in the recipe: lite caps its size
    bus, comp = make(tmp_path, clock, windowSeconds=1, lowConfidence="0.3")
    assert comp.aggregator.low_confidence == 0.3
    assert bus.propose_configuration({"lowConfidence": 1.5}) is not None
    assert bus.propose_configuration({"lowConfidence": 0.7}) is None
    assert comp.aggregator.low_confidence == 0.7
    model = ModelRef("m", "2", "int8")
    record = TimingRecord("a", "ok", Latency(total=1), model=model, top=(Prediction(1, "cat", 0.6),))
    bus.publish(TIMINGS_TOPIC, TimingBatch("dev", [record]).to_json())
    clock.advance(1)
    comp.tick()
    (window,) = windows(bus)
    assert [(m.name, m.version, m.count, m.low_confidence) for m in window.models] == [("m", "2", 1, 1)]


def test_without_live_validation_updates_apply_and_bad_ones_are_logged(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    bus, comp = make(tmp_path, clock, lite=True, windowSeconds=10)
    assert bus.states == ["RUNNING"]
    off = [r.getMessage() for r in caplog.records if "live configuration validation is off" in r.getMessage()]
    assert len(off) == 1
    assert off[0].startswith("com.edgeinfer.Telemetry: ")
    assert bus.propose_configuration({"windowSeconds": "-1"}) is None  # nothing validates it …
    assert "windowSeconds: must be between 0.05 and 3600" in caplog.text  # … the component refuses it
    assert comp.config.window_seconds == 10
    assert bus.propose_configuration({"windowSeconds": "2", "spoolMaxWindows": "5"}) is None
    assert (comp.config.window_seconds, comp.spool.max_windows) == (2, 5)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"windowSeconds": "soon"}, "windowSeconds: must be a number, got 'soon'"),
        ({"qos": 2}, "qos: must be 0 or 1"),
        ({"prometheusPort": 70000}, "prometheusPort: must be 0"),
        ({"systemMetrics": "yes"}, "systemMetrics: must be true or false"),
        ({"spoolMaxWindows": 1.5}, "spoolMaxWindows: must be an integer"),
        ({"spoolMaxWindows": "inf"}, "spoolMaxWindows: must be an integer"),
    ],
)
def test_bad_configuration_is_one_clear_line(doc: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        TelemetryConfig.from_dict(doc)
    assert str(err.value).startswith("configuration of com.edgeinfer.Telemetry: ")
    assert "\n" not in str(err.value)


def test_configuration_defaults_and_coercion() -> None:
    cfg = TelemetryConfig.from_dict({"accessControl": {}, "prometheusPort": "9464", "gpuMetrics": "false"})
    assert cfg.prometheus_port == 9464
    assert cfg.gpu_metrics is False
    assert cfg.window_seconds == 10
    assert cfg.prometheus_bind == "127.0.0.1"


def test_classic_and_lite_typing_give_the_same_config() -> None:
    doc = dict(TelemetryConfig().to_dict(), windowSeconds=2.5, qos=0, systemMetrics=False, spoolDir="/x")
    assert lite_typed(doc)["windowSeconds"] == "2.5"
    assert TelemetryConfig.from_dict(lite_typed(doc)) == TelemetryConfig.from_dict(doc)
    assert TelemetryConfig.from_dict(doc).window_seconds == 2.5


def test_unknown_keys_are_warned_by_name(caplog: pytest.LogCaptureFixture) -> None:
    assert TelemetryConfig.from_dict({"windowSecond": 5}) == TelemetryConfig()
    assert "com.edgeinfer.Telemetry: unknown configuration key windowSecond (ignored)" in caplog.text


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_prometheus_endpoint_on_loopback(tmp_path: Path, clock: FakeClock) -> None:
    bus, comp = make(tmp_path, clock, windowSeconds=1, prometheusPort=free_port())
    assert comp.exporter is not None
    assert comp.exporter.bind == "127.0.0.1"
    rng = random.Random(2)
    records = [make_record(rng) for _ in range(10)]
    records[0].status = "error"
    bus.publish(TIMINGS_TOPIC, TimingBatch("dev", records, [8, 2]).to_json())
    clock.advance(1)
    comp.tick()
    url = f"http://127.0.0.1:{comp.exporter.port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = resp.read().decode()
    assert "edgeinfer_requests_total 10" in text
    assert 'edgeinfer_errors_total{code="INTERNAL"} 1' in text
    assert 'edgeinfer_latency_ms{thing="dev",stage="total",quantile="0.99"}' in text
    assert 'edgeinfer_system_cpu_percent{thing="dev"} 3.5' in text
    assert 'edgeinfer_provider_info{thing="dev",provider="CPUExecutionProvider"} 1' in text
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(f"http://127.0.0.1:{comp.exporter.port}/other", timeout=5)
    comp.close()
    assert comp.exporter is None


def test_prometheus_off_by_default(tmp_path: Path, clock: FakeClock) -> None:
    _, comp = make(tmp_path, clock)
    assert comp.exporter is None
    comp.close(flush=False)


def test_run_loop_with_a_sender_thread(tmp_path: Path) -> None:
    """The real loop on the real clock: stop() ends it promptly and the last window is not lost."""
    bus = MemoryBus()
    comp = TelemetryComponent(bus, "dev", TelemetryConfig(window_seconds=0.05), system=dict, work=tmp_path)
    comp.start()
    runner = threading.Thread(target=comp.run, kwargs={"tick_s": 0.01})
    runner.start()
    rng = random.Random(4)
    for _ in range(20):
        bus.publish(TIMINGS_TOPIC, TimingBatch("dev", [make_record(rng)]).to_json())
    deadline = time.monotonic() + 30
    while len(windows(bus)) < 3 and time.monotonic() < deadline:
        threading.Event().wait(0.01)
    comp.stop()
    runner.join(10)
    assert not runner.is_alive()
    comp.close()
    sent = windows(bus)
    assert [w.seq for w in sent] == list(range(len(sent)))
    assert sum(w.count for w in sent) == 20


def test_main_outside_greengrass_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from edgeinfer.telemetry.component import main

    monkeypatch.delenv("AWS_IOT_THING_NAME", raising=False)
    assert main([]) == 1
    assert "AWS_IOT_THING_NAME is not set" in caplog.text
    monkeypatch.setenv("AWS_IOT_THING_NAME", "dev")
    monkeypatch.delenv("SVCUID", raising=False)
    assert main([]) == 1
    assert "not running under Greengrass" in caplog.text


@pytest.mark.e2e
def test_on_nucleus_lite_the_real_process_runs_without_live_validation(
    simulator: Any, tmp_path: Path
) -> None:
    """`python -m edgeinfer.telemetry` on the simulated nucleus lite: configuration over IPC with lite's
    string scalars, no validation subscription (one log line), updates applied and bad ones ignored."""
    recipe = yaml.safe_load((PROJECT / "recipes" / f"{COMPONENT}.yaml").read_text("utf-8"))
    recipe.pop("ComponentDependencies", None)
    recipe["ComponentConfiguration"]["DefaultConfiguration"]["windowSeconds"] = 1
    run = f"{sys.executable} -m edgeinfer.telemetry"
    recipe["Manifests"] = [{"Platform": {"os": "linux", "runtime": "*"}, "Lifecycle": {"run": run}}]
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / f"{COMPONENT}.yaml").write_text(yaml.safe_dump(recipe))
    sim = simulator(recipes, thing="lite-tele", nucleus="lite")
    sim.wait_for_report(COMPONENT, "RUNNING", timeout=60)
    inbox = sim.cloud_client().subscribe("edgeinfer/lite-tele/telemetry")
    inbox.wait_for(1, timeout=30)
    assert sim.logs(COMPONENT).count("live configuration validation is off") == 1
    sim.update_configuration(COMPONENT, merge={"windowSeconds": 0})  # nothing validates it …
    eventually(  # … the component ignores it, with the reason
        lambda: "windowSeconds: must be between" in sim.logs(COMPONENT), what="the refusal in the log"
    )
    sim.update_configuration(COMPONENT, merge={"windowSeconds": 0.5})
    eventually(
        lambda: any(json.loads(m.payload)["window_s"] == 0.5 for m in inbox.messages),
        what="a window of the new length",
    )
    assert sim.state(COMPONENT) == "RUNNING"
