from __future__ import annotations

import pytest

from edgeinfer.transport import MemoryBus, Message, TransportError, topic_matches


@pytest.mark.parametrize(
    ("flt", "topic", "expected"),
    [
        ("a/b", "a/b", True),
        ("a/+", "a/b", True),
        ("a/+", "a/b/c", False),
        ("a/#", "a", True),
        ("a/#", "a/b/c", True),
        ("+/+/infer", "edgeinfer/t/infer", True),
        ("a/b", "a/c", False),
        ("a/b/c", "a/b", False),
    ],
)
def test_topic_matching(flt: str, topic: str, expected: bool) -> None:
    assert topic_matches(flt, topic) is expected


def test_publish_reaches_matching_subscribers_on_the_same_target_only() -> None:
    bus = MemoryBus()
    local: list[Message] = []
    iot: list[Message] = []
    bus.subscribe("x/#", local.append)
    sub = bus.subscribe("x/+", iot.append, target="iot")
    bus.publish("x/1", b"a")
    bus.publish("x/2", b"b", target="iot")
    assert [m.payload for m in local] == [b"a"]
    assert [m.payload for m in iot] == [b"b"]
    sub.close()
    bus.publish("x/3", b"c", target="iot")
    assert len(iot) == 1
    assert [m.topic for m in bus.messages_on("x/#", target="iot")] == ["x/2", "x/3"]


def test_configuration_reads_updates_and_validation() -> None:
    bus = MemoryBus(config={"a": {"b": 1}})
    seen: list[list[str]] = []
    bus.on_configuration_update(seen.append)
    bus.on_validate_configuration(lambda cfg: None if cfg.get("ok", True) else "not ok")
    assert bus.get_configuration(["a", "b"]) == 1
    bus.update_configuration(["a", "b"], 2)
    assert seen == [["a", "b"]]
    assert bus.propose_configuration({"ok": False}) == "not ok"
    assert bus.get_configuration(["a", "b"]) == 2
    assert bus.propose_configuration({"a": {"b": 3}}) is None
    assert bus.get_configuration(["a"]) == {"b": 3}
    with pytest.raises(TransportError):
        bus.get_configuration(["missing"])


def test_offline_bus_raises_transport_error() -> None:
    bus = MemoryBus(fail_publish=True)
    with pytest.raises(TransportError):
        bus.publish("t", b"x")


def test_publish_nowait_reports_the_outcome_through_on_done() -> None:
    bus = MemoryBus()
    got: list[Message] = []
    bus.subscribe("t", got.append, inline=True)
    outcomes: list[TransportError | None] = []
    bus.publish_nowait("t", b"x", on_done=outcomes.append)
    bus.fail_publish = True
    bus.publish_nowait("t", b"y", on_done=outcomes.append)
    assert [m.payload for m in got] == [b"x"]
    assert outcomes[0] is None
    assert isinstance(outcomes[1], TransportError)
    with pytest.raises(TransportError):
        bus.publish_nowait("t", b"z")  # nobody to tell: it raises, as publish does
