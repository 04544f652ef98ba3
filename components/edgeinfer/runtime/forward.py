"""Store and forward for a source's results bound for IoT Core (docs/iot-path.md, "While IoT Core is away").

Where the line is: a source's results on IoT Core (a camera, video or folder with `publishToIot`) are
a stream nobody waits on, worth keeping while IoT Core is away and sending late, in order; they go
through the runtime's outbox (`edgeinfer.transport.outbox`). A request's reply is answered once,
now, as before: its client is waiting for it, has a deadline, and may ask again; a reply sent hours
late would answer a question nobody is asking any more, so a reply that cannot be published is
counted (`publish_failures`) and not kept. Offloads to the cloud are requests too.

Each result is published with QoS 1 and leaves the outbox once the nucleus accepted it: at least
once. A duplicate is possible where QoS 1 allows one (a publish the nucleus took but whose answer was
lost, or a crash between the answer and the removal of the file); each result carries its `id`.
What "accepted" means depends on the nucleus: the classic one answers once its in-memory spooler
holds the message, so while IoT Core is away results wait there first (up to its
`mqtt.spooler.maxSizeInBytes`, lost if the nucleus restarts) and in the outbox once it refuses
them as full; nucleus lite answers once the message is written to its MQTT connection and refuses
it while disconnected, so the outbox holds them all.

The outbox lives in `outbox/` in the component's work folder, bounded by `ForwardConfig`'s defaults
(not yet a configuration key); the counters (pending, spooled, sent, dropped) reach the telemetry
window as `system.forward` through the timings topic.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from edgeinfer.messages import TIMINGS_TOPIC, TimingBatch, iso_utc, result_topic
from edgeinfer.transport import Bus, TransportError
from edgeinfer.transport.outbox import Forwarder, Outbox, OutboxPublisher

__all__ = ["ForwardConfig", "start_forwarding"]

log = logging.getLogger(__name__)


@dataclass
class ForwardConfig:
    """Where a source's IoT-bound results wait while IoT Core is away.

    `dir`: the outbox folder ("" = `outbox/` in the component's work folder); `max_mb`, `max_age_h`,
    `max_messages`: its bounds, the oldest dropped first and counted."""

    dir: str = ""
    max_mb: float = 20.0
    max_age_h: float = 168.0
    max_messages: int = 100_000

    def check(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if not self.max_mb > 0:
            out.append(("maxMb", "must be above 0"))
        if not self.max_age_h > 0:
            out.append(("maxAgeH", "must be above 0"))
        if self.max_messages < 1:
            out.append(("maxMessages", "must be at least 1"))
        return out


def start_forwarding(
    bus: Bus, thing: str, work_dir: str, cfg: ForwardConfig | None = None
) -> Forwarder | None:
    """Start the outbox's forwarder. A folder that cannot be used is logged and the results go
    straight out as before: serving goes on."""
    cfg = cfg or ForwardConfig()
    problems = cfg.check()
    if problems:
        raise ValueError("; ".join(f"{k}: {why}" for k, why in problems))
    try:
        folder = Path(cfg.dir or os.path.join(work_dir, "outbox"))
        outbox = Outbox(
            folder,
            max_items=cfg.max_messages,
            max_bytes=int(cfg.max_mb * 1024 * 1024),
            max_age_s=cfg.max_age_h * 3600,
            name="results outbox",
        )
    except OSError as exc:
        log.error("no store and forward for IoT-bound source results: %s", exc)
        return None
    publisher = OutboxPublisher(bus, result_topic(thing), outbox, qos=1)
    reporter = _CountersToTelemetry(bus, thing)
    forwarder = Forwarder(publisher, on_change=reporter).start()
    if len(outbox):
        log.info("%d source result(s) wait in %s for IoT Core", len(outbox), folder)
    return forwarder


class _CountersToTelemetry:
    """Publishes the outbox's counters on the timings topic, in a batch with no records, when they
    change: the telemetry component shows the latest in each window (`system.forward`)."""

    def __init__(self, bus: Bus, thing: str) -> None:
        self.bus = bus
        self.thing = thing

    def __call__(self, counters: dict[str, int]) -> None:
        batch = TimingBatch(self.thing, [], [], iso_utc(time.time()), forward=dict(counters))
        try:
            self.bus.publish(TIMINGS_TOPIC, batch.to_json(), target="local")
        except TransportError as exc:  # counters are telemetry: the next change brings them again
            log.debug("forward counters not published: %s", exc)
