"""What the canary watches: telemetry windows (`edgeinfer/{thing}/telemetry`), split into the canary
things' and the rest of the fleet's, for a set time.

A `WindowSource` feeds window payloads to a watch: `MqttWindows` subscribes on the project's MQTT
client (a broker, or AWS IoT Core), `RecordedWindows` plays a recording (JSON Lines, as `edgeinfer
watch --record` writes). The watch ends when the time is up or, with `windows_per_thing`, as soon as
every canary thing and the fleet sent that many windows: it waits on their arrival, never a sleep.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from edgeinfer import codec
from edgeinfer.messages import MessageError, TelemetryWindow, telemetry_topic
from edgeinfer.transport.base import Message, PubSub, Subscription
from edgeinfer_cloud.canary.compare import Window

__all__ = ["Deliver", "MqttWindows", "Observed", "RecordedWindows", "WindowSource", "read_window", "watch"]

Deliver = Callable[[bytes], None]


def read_window(payload: bytes) -> Window | None:
    """One telemetry window's figures, or None for a payload that is not a window."""
    try:
        doc = codec.loads(payload)
        if not isinstance(doc, dict):
            return None
        window = TelemetryWindow.from_dict(doc)
    except (ValueError, MessageError):
        return None
    total = window.latency_ms.get("total")
    return Window(
        thing=window.thing,
        requests=window.count,
        errors=dict(window.errors),
        p99_ms=total.p99 if total is not None and window.count > sum(window.errors.values()) else None,
        low_confidence=low_confidence(doc),
    )


def low_confidence(doc: Mapping[str, Any]) -> tuple[int, int] | None:
    """(low-confidence answers, answers) summed over the models a window describes — a `models` list
    (or one `model` object) whose entries carry `count` and `low_confidence` (a count) or
    `low_confidence_share`; None when no entry does."""
    models = doc.get("models")
    entries = models if isinstance(models, list) else [doc.get("model")]
    low = answers = 0
    carried = False
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("count"), (int, float)):
            continue
        count = int(entry["count"])
        if isinstance(entry.get("low_confidence"), (int, float)):
            low += int(entry["low_confidence"])
        elif isinstance(entry.get("low_confidence_share"), (int, float)):
            low += round(float(entry["low_confidence_share"]) * count)
        else:
            continue
        answers += count
        carried = True
    return (low, answers) if carried else None


class WindowSource:
    """Feeds window payloads to a watch, from any thread. The base feeds none."""

    def start(self, deliver: Deliver) -> None:
        """Begin calling `deliver` with each window payload."""

    def stop(self) -> None:
        """Stop calling it."""


class MqttWindows(WindowSource):
    """Every thing's windows, `edgeinfer/+/telemetry`, on a connected client (QoS 1)."""

    def __init__(self, pubsub: PubSub) -> None:
        self.pubsub = pubsub
        self._subscription: Subscription | None = None

    def start(self, deliver: Deliver) -> None:
        def on_message(message: Message) -> None:
            deliver(message.payload)

        self._subscription = self.pubsub.subscribe(telemetry_topic("+"), on_message, target="iot", qos=1)

    def stop(self) -> None:
        if self._subscription is not None:
            self._subscription.close()
            self._subscription = None


class RecordedWindows(WindowSource):
    """Recorded payloads, delivered at once when the watch starts."""

    def __init__(self, payloads: Iterable[bytes]) -> None:
        self.payloads = list(payloads)

    def start(self, deliver: Deliver) -> None:
        for payload in self.payloads:
            deliver(payload)


@dataclass
class Observed:
    canary: list[Window] = field(default_factory=list)
    fleet: list[Window] = field(default_factory=list)
    ignored: int = 0  # payloads that were not windows
    seconds: float = 0.0


class _Collector:
    def __init__(self, canary_things: frozenset[str], windows_per_thing: int | None) -> None:
        self.canary_things = canary_things
        self.windows_per_thing = windows_per_thing
        self.observed = Observed()
        self._changed = threading.Condition()

    def deliver(self, payload: bytes) -> None:
        window = read_window(payload)
        with self._changed:
            if window is None:
                self.observed.ignored += 1
            elif window.thing in self.canary_things:
                self.observed.canary.append(window)
            else:
                self.observed.fleet.append(window)
            self._changed.notify_all()

    def _enough(self) -> bool:
        need = self.windows_per_thing
        if need is None:
            return False
        per_thing = dict.fromkeys(self.canary_things, 0)
        for window in self.observed.canary:
            per_thing[window.thing] += 1
        return min(per_thing.values(), default=0) >= need and len(self.observed.fleet) >= need

    def snapshot(self, seconds: float) -> Observed:
        with self._changed:  # a late delivery after stop() may still be on its way in
            seen = self.observed
            return Observed(list(seen.canary), list(seen.fleet), seen.ignored, seconds)

    def wait(self, duration_s: float, clock: Callable[[], float]) -> None:
        deadline = clock() + duration_s
        with self._changed:
            while not self._enough():
                left = deadline - clock()
                if left <= 0:
                    return
                self._changed.wait(left)


def watch(
    source: WindowSource,
    canary_things: Iterable[str],
    *,
    duration_s: float,
    windows_per_thing: int | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Observed:
    """The windows `source` delivers for `duration_s` (or until enough arrived), split into the
    canary things' and every other thing's."""
    collector = _Collector(frozenset(canary_things), windows_per_thing)
    started = clock()
    source.start(collector.deliver)
    try:
        collector.wait(duration_s, clock)
    finally:
        source.stop()
    return collector.snapshot(clock() - started)
