"""The echo component: one answer per request, on a MemoryBus and as a process on the simulated core."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from edgeinfer.messages import ErrorCode, Result
from edgeinfer.sim import MosquittoBroker, Simulator
from edgeinfer.transport import MemoryBus, Message, TransportError
from edgeinfer_bench.echo import PROVIDER, Echo, echo_infer_topic, echo_result_topic, main
from edgeinfer_bench.requests import request_templates
from edgeinfer_bench.runtime import CLIENT, COMPONENT, ECHO, THING, Driver, prepare_device
from tests.helpers.images import solid_jpeg


def answers(bus: MemoryBus) -> list[Result]:
    return [Result.parse(m.payload) for m in bus.published if m.topic == echo_result_topic(THING)]


def test_answers_each_request_once_without_inference() -> None:
    bus = MemoryBus()
    echo = Echo(bus, THING, wall=lambda: 0.0)  # the clock passed in: a fixed timestamp
    echo.start()
    image = base64.b64encode(solid_jpeg((120, 80, 40), (640, 480))).decode()
    bus.publish(echo_infer_topic(THING), json.dumps({"id": "a", "image": image, "top_k": 3}).encode())
    bus.publish(echo_infer_topic(THING), json.dumps({"id": "b", "image": image}).encode())
    got = answers(bus)
    assert [r.id for r in got] == ["a", "b"]
    assert [len(r.predictions) for r in got] == [3, 5]
    assert {r.status for r in got} == {"ok"}
    assert {r.provider for r in got} == {PROVIDER}
    assert got[0].timestamp == "1970-01-01T00:00:00.000Z"
    assert echo.sent == 2
    echo.stop()
    bus.publish(echo_infer_topic(THING), json.dumps({"id": "c", "image": image}).encode())
    assert len(answers(bus)) == 2  # unsubscribed


@pytest.mark.parametrize(
    ("payload", "rid", "code"),
    [
        (b"{not json", None, ErrorCode.BAD_REQUEST),
        (b'{"image": "AAAA"}', None, ErrorCode.BAD_REQUEST),
        (b'{"id": "x", "image": "***"}', "x", ErrorCode.BAD_IMAGE),
    ],
)
def test_bad_requests_get_their_error(payload: bytes, rid: str | None, code: ErrorCode) -> None:
    bus = MemoryBus()
    Echo(bus, THING).start()
    bus.publish(echo_infer_topic(THING), payload)
    (got,) = answers(bus)
    assert got.status == "error"
    assert got.id == rid
    assert got.error is not None
    assert got.error.code == code


class OfflineBus(MemoryBus):
    """A bus whose publishes fail at once, as a client whose connection dropped does."""

    def publish_nowait(self, topic: str, payload: bytes, **_kw: Any) -> None:
        raise TransportError(f"PublishToTopic {topic}: the connection is closed")


def test_an_answer_that_cannot_be_sent_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    bus = OfflineBus()
    echo = Echo(bus, THING)
    echo.start()
    bus.publish(echo_infer_topic(THING), b'{"id": "x", "image": "AAAA"}')
    assert echo.sent == 0
    assert "answer to x not published" in caplog.text


def test_an_answer_the_nucleus_refuses_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    bus = MemoryBus()
    echo = Echo(bus, THING)
    echo.start()
    bus.fail_publish = True  # the answer's publish fails; MemoryBus reports it through on_done
    echo.handle(Message(echo_infer_topic(THING), b'{"id": "x", "image": "AAAA"}', "local"))
    assert echo.sent == 1  # handed to the transport, which then refused it
    assert "answer not published: publish to edgeinfer/bench-thing/echo/result failed" in caplog.text


def test_main_outside_greengrass_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("SVCUID", raising=False)
    monkeypatch.delenv("AWS_GG_NUCLEUS_DOMAIN_SOCKET_FILEPATH_FOR_COMPONENT", raising=False)
    assert main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "not running under Greengrass" in err[0]


@pytest.mark.e2e
def test_echo_component_on_the_simulated_core(
    tiny_store: Path, sim_broker: MosquittoBroker, tmp_path: Path
) -> None:
    recipes, artifacts = prepare_device(tmp_path / "dev", tiny_store, echo=True)
    (recipes / f"{COMPONENT}.yaml").unlink()  # the echo alone: no runtime to start
    sim = Simulator(recipes, artifacts, thing=THING, work_dir=tmp_path / "core", broker=sim_broker.address)
    sim.start()
    try:
        sim.wait_for_report(ECHO, "RUNNING", timeout=60)
        from edgeinfer.transport.ipc import GreengrassIpcBus

        env = sim.ipc_env(CLIENT)
        bus = GreengrassIpcBus.connect(
            env["AWS_GG_NUCLEUS_DOMAIN_SOCKET_FILEPATH_FOR_COMPONENT"], env["SVCUID"]
        )
        try:
            driver = Driver(
                bus, "local", THING, request_templates([solid_jpeg((120, 80, 40), (640, 480))]), echo=True
            )
            rids = [driver.send() for _ in range(3)]
            assert all(driver.wait(rid, timeout=30) > 0 for rid in rids)
            assert {driver.results[rid]["provider"] for rid in rids} == {PROVIDER}
            assert {driver.results[rid]["status"] for rid in rids} == {"ok"}
            driver.close()
        finally:
            bus.close()
    finally:
        sim.stop()
    logs = sim.logs(ECHO)
    assert "echo RUNNING on edgeinfer/bench-thing/echo/infer" in logs
    assert "echo stopped after 3 answers" in logs  # SIGTERM: a clean stop
