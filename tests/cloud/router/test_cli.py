"""`edgeinfer cloud router` as a user runs it: a real process, a real broker, a real model store."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from edgeinfer.cli import main
from edgeinfer.messages import OffloadOrigin, OffloadRequest, Request, Result, iso_utc
from edgeinfer.sim.broker import MosquittoBroker
from edgeinfer.transport import Message
from edgeinfer.transport.mqtt import MqttPubSub
from tests.helpers.router import jpeg
from tests.helpers.wait import wait_for


def test_cli_errors_are_one_line(tmp_path: Path, capsys: object) -> None:
    assert main(["cloud", "router", "--broker", "127.0.0.1:1883", "--model-dir", str(tmp_path)]) == 2
    assert main(["cloud", "router", "--model-dir", str(tmp_path)]) == 2
    assert main(["cloud", "router", "--broker", "127.0.0.1:1883", "--workers", "0"]) == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--report-every", "-1"], "--report-every must be a positive number of seconds"),
        (["--report-every", "nan"], "--report-every must be a positive number of seconds"),
        (["--group", "a/b"], "--group: not a shared-subscription group name"),
        (["--group", ""], "--group: not a shared-subscription group name"),
        (["--providers", "bogus"], "--providers: unknown provider 'bogus'"),
        (["--threads", "-3"], "--threads must be at least 0"),
        (["--max-batch-size", "0"], "--max-batch-size must be at least 1"),
        (["--max-queue", "-1"], "--max-queue must be at least 1"),
        (["--known-things", "bad thing,ok"], "--known-things: not thing names: 'bad thing'"),
        (["--connections", "0"], "--connections must be at least 1"),
        (["--metrics-every", "0"], "--metrics-every must be a positive number of seconds"),
        (["--pacing-scale", "2"], "--pacing-scale must be in (0, 1]"),
        (["--pacing", "on", "--receive-maximum", "101"], "pacing: receive maximum must be 1..100"),
        (["--sagemaker-endpoint", "foo", "--region", "bad region"], "not an AWS region: 'bad region'"),
    ],
)
def test_values_a_router_cannot_work_with_are_refused_in_one_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    assert main(["cloud", "router", "--broker", "127.0.0.1:1", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert message in err[0]


def test_sagemaker_without_a_region_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))  # no region from a profile either
    assert main(["cloud", "router", "--broker", "127.0.0.1:1", "--sagemaker-endpoint", "foo"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["edgeinfer: error: no AWS region: pass --region"]


def test_router_process_serves_and_stops_cleanly(tiny_store: Path, broker: MosquittoBroker) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "edgeinfer",
            "cloud",
            "router",
            "--broker",
            f"{broker.host}:{broker.port}",
            "--model-dir",
            str(tiny_store),
            "--threads",
            "1",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    device = MqttPubSub.connect_tcp(broker.host, broker.port)
    answers: list[Result] = []
    lock = threading.Lock()

    def on(message: Message) -> None:
        with lock:
            answers.append(Result.parse(message.payload))

    try:
        device.subscribe("edgeinfer/cli-dev/offload/result", on, qos=1)
        payload = OffloadRequest(
            Request(id="c1", image=jpeg(), top_k=2), OffloadOrigin("cli-dev", 5000, iso_utc(time.time()))
        ).to_json()
        # the router needs a moment to load and subscribe: resend until it answers
        assert wait_for(
            lambda: device.publish("edgeinfer/cli-dev/offload", payload, qos=1) is None and bool(answers),
            timeout=60,
        )
        assert answers[0].status == "ok"
        assert answers[0].placement == "cloud"
        assert answers[0].model is not None
        assert answers[0].model.name == "tiny"
        assert len(answers[0].predictions) == 2
    finally:
        device.close()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "router: answered" in err


def test_each_iot_core_connection_asks_for_the_pacings_receive_maximum(
    tiny_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from awsiot import mqtt5_client_builder

    asked: list[dict[str, object]] = []

    def refuse(**kwargs: object) -> None:
        asked.append(kwargs)
        raise RuntimeError("no network in tests")

    monkeypatch.setattr(mqtt5_client_builder, "mtls_from_path", refuse)
    for name in ("c.pem", "k.pem"):
        (tmp_path / name).write_text("-")
    argv = ["cloud", "router", "--endpoint", "example-ats.iot.eu-west-1.amazonaws.com", "--model-dir"]
    argv += [str(tiny_store), "--cert", str(tmp_path / "c.pem"), "--key", str(tmp_path / "k.pem")]
    assert main([*argv, "--connections", "3", "--client-id", "r", "--receive-maximum", "2"]) == 2
    assert "cannot set up TLS" in capsys.readouterr().err
    assert [(a["client_id"], a["receive_maximum"]) for a in asked] == [("r-0", 2)]  # the first refused: stop
