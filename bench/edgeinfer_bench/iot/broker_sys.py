"""The broker's own view during `edgeinfer bench iot`: mosquitto's `$SYS` counters."""

from __future__ import annotations

import threading
import time
from typing import Any


class BrokerSys:
    """mosquitto's own counters from its `$SYS` topics (every 10 s, its default `sys_interval`; the
    broker fixture's config sets none). mosquitto 2.0.11 counts no expired messages: it discards an
    expired queued message without counting it in `publish/messages/dropped`, which counts only the
    queue limits' drops. So `dropped` staying put says the queue limits dropped nothing."""

    TOPICS = ("$SYS/broker/publish/messages/+", "$SYS/broker/store/messages/count")

    def __init__(self) -> None:
        self.values: dict[str, int] = {}
        self.updated = 0.0
        self.lock = threading.Lock()

    def subscribe(self, client: Any) -> None:
        for topic in self.TOPICS:
            client.subscribe(topic, self.handler, qos=0)

    def handler(self, message: Any) -> None:
        try:
            value = int(message.payload.split()[0])
        except (ValueError, IndexError):
            return
        with self.lock:
            self.values[message.topic.removeprefix("$SYS/broker/").replace("/", "_")] = value
            self.updated = time.time()

    def snapshot(self, fresher_than: float | None = None, timeout: float = 12.0) -> dict[str, Any]:
        """The latest values, after waiting up to `timeout` for a report newer than `fresher_than`."""
        limit = time.monotonic() + (timeout if fresher_than is not None else 0.0)
        while fresher_than is not None and time.monotonic() < limit:
            with self.lock:
                if self.updated > fresher_than:
                    break
            time.sleep(0.2)
        with self.lock:
            return {**dict(sorted(self.values.items())), "as_of": round(self.updated, 3) or None}
