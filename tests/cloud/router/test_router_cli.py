"""`edgeinfer cloud router` as a user runs it: a real process, a real broker, a real model store."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from router_helpers import jpeg, wait_for

from edgeinfer.cli import main
from edgeinfer.messages import OffloadOrigin, OffloadRequest, Request, Result, iso_utc
from edgeinfer.sim.broker import MosquittoBroker
from edgeinfer.transport import Message
from edgeinfer.transport.mqtt import MqttPubSub


def test_cli_errors_are_one_line(tmp_path: Path, capsys: object) -> None:
    assert main(["cloud", "router", "--broker", "127.0.0.1:1883", "--model-dir", str(tmp_path)]) == 2
    assert main(["cloud", "router", "--model-dir", str(tmp_path)]) == 2
    assert main(["cloud", "router", "--broker", "127.0.0.1:1883", "--workers", "0"]) == 2


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
