"""`edgeinfer watch` against a real broker: windows and results in, one frame out (no terminal)."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest

from edgeinfer.cli import main
from edgeinfer.messages import Latency, Result, TimingBatch, result_topic, telemetry_topic
from edgeinfer.telemetry.window import WindowAggregator
from tests.helpers.clock import FakeClock
from tests.helpers.telemetry import make_record


def test_watch_once_shows_what_the_broker_carried(
    sim_broker: Any, tmp_path: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from edgeinfer.transport.mqtt import MqttPubSub

    clock = FakeClock()
    agg = WindowAggregator("cam-7", window_s=10, clock=clock)
    agg.add(TimingBatch("cam-7", [make_record(random.Random(1)) for _ in range(30)]))
    clock.advance(10)
    (window,) = agg.poll()
    record = tmp_path / "windows.jsonl"
    host, port = sim_broker.address
    # publish once watch's last subscription is acknowledged by the broker (not after a guessed sleep)
    subscribed = threading.Event()
    real_subscribe = MqttPubSub.subscribe

    def subscribe(self: MqttPubSub, topic: str, *args: Any, **kwargs: Any) -> Any:
        sub = real_subscribe(self, topic, *args, **kwargs)
        if topic == result_topic("+") + "/#":
            subscribed.set()
        return sub

    monkeypatch.setattr(MqttPubSub, "subscribe", subscribe)
    codes: list[int] = []
    runner = threading.Thread(
        target=lambda: codes.append(
            main(
                ["watch", "--broker", f"{host}:{port}", "--once", "--duration", "4", "--record", str(record)]
            )
        )
    )
    runner.start()
    with MqttPubSub.connect_tcp(host, port) as pub:
        assert subscribed.wait(30)
        pub.publish(telemetry_topic("cam-7"), window.to_json(), qos=1)
        ok = Result(id="1", status="ok", timestamp="", latency_ms=Latency(total=12.0))
        pub.publish(result_topic("cam-7"), ok.to_json(), qos=1)
        pub.publish(result_topic("cam-7") + "/my-app", ok.to_json(), qos=1)  # a request's reply_to
        pub.publish(telemetry_topic("cam-7"), b"garbage", qos=1)
    runner.join(30)
    assert codes == [0]
    out = capsys.readouterr().out
    assert "cam-7" in out
    assert f"window #{window.seq} (10 s)" in out
    assert "throughput 3.0/s" in out
    assert "results (last 10 s) 0.2/s" in out
    lines = record.read_text().splitlines()
    assert len(lines) == 1  # the garbage was not recorded


def test_watch_rejects_a_bad_thing_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["watch", "--thing", "a/b", "--broker", "127.0.0.1:1"]) == 2
    assert "not a thing name" in capsys.readouterr().err


def test_watch_endpoint_needs_cert_and_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["watch", "--endpoint", "example-ats.iot.us-east-1.amazonaws.com"]) == 2
    assert "--cert and --key" in capsys.readouterr().err
