"""Optional CloudWatch metrics for the router (boto3 `put_metric_data`), aggregated between flushes.

Per flush and per thing: `Requests`, `Errors` (and one `Errors` datum per error code), and `Latency`
as CloudWatch statistic sets (SampleCount / Sum / Minimum / Maximum, milliseconds), so a busy router
makes a handful of API calls a minute instead of one per request. Failures to publish are logged and
the data dropped: metrics never stop the router.

The signal to scale on (`record_load`), per flush and with the one dimension `Fleet` (the fleet's
name; default the router group) and no other, so that every router of a fleet writes the same metric
and CloudWatch aggregates them: `BusyShare` (Percent, the share of the time the backend computed: its
Average over the routers is the target to track) and `Backlog` (Count, requests waiting). The fleet
template (`edgeinfer_cloud.fleet`, docs/fleet.md) scales and alarms on exactly these.
"""

from __future__ import annotations

import datetime as _dt
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["CloudWatchMetrics"]

_MAX_DATA_PER_CALL = 1000


@dataclass
class _Stats:
    count: int = 0
    total: float = 0.0
    minimum: float = float("inf")
    maximum: float = 0.0

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        self.minimum = min(self.minimum, value)
        self.maximum = max(self.maximum, value)


class CloudWatchMetrics:
    def __init__(
        self,
        client: Any = None,
        *,
        namespace: str = "edgeinfer/router",
        router: str = "edgeinfer-router",
        fleet: str | None = None,
        region_name: str | None = None,
        now: Callable[[], _dt.datetime] = lambda: _dt.datetime.now(_dt.timezone.utc),
    ) -> None:
        if client is None:
            import boto3

            client = boto3.client("cloudwatch", region_name=region_name)
        self.client = client
        self.namespace = namespace
        self.router = router
        self.fleet = fleet or router
        self.now = now
        self._lock = threading.Lock()
        self._requests: dict[str, int] = {}
        self._errors: dict[tuple[str, str], int] = {}
        self._latency: dict[str, _Stats] = {}
        self._load: tuple[float, float] | None = None  # (busy share 0..1, backlog)
        self.failed_flushes = 0

    def record(self, thing: str, *, ok: bool, code: str | None, latency_ms: float) -> None:
        with self._lock:
            self._requests[thing] = self._requests.get(thing, 0) + 1
            if not ok:
                key = (thing, code or "INTERNAL")
                self._errors[key] = self._errors.get(key, 0) + 1
            else:
                self._latency.setdefault(thing, _Stats()).add(latency_ms)

    def record_load(self, busy_share: float, backlog: float) -> None:
        """The router's load since the last flush (the newest reading wins)."""
        with self._lock:
            self._load = (busy_share, backlog)

    def _take(self) -> list[dict[str, Any]]:
        with self._lock:
            requests, errors, latency = self._requests, self._errors, self._latency
            self._requests, self._errors, self._latency = {}, {}, {}
            load, self._load = self._load, None
        stamp = self.now()

        def dims(thing: str, **extra: str) -> list[dict[str, str]]:
            out = [{"Name": "Router", "Value": self.router}, {"Name": "Thing", "Value": thing}]
            out += [{"Name": k, "Value": v} for k, v in extra.items()]
            return out

        data: list[dict[str, Any]] = []
        if load is not None:
            fleet = [{"Name": "Fleet", "Value": self.fleet}]
            busy, backlog = load
            data += [
                {
                    "MetricName": "BusyShare",
                    "Dimensions": fleet,
                    "Timestamp": stamp,
                    "Value": round(100 * busy, 2),
                    "Unit": "Percent",
                },
                {
                    "MetricName": "Backlog",
                    "Dimensions": fleet,
                    "Timestamp": stamp,
                    "Value": backlog,
                    "Unit": "Count",
                },
            ]
        for thing, n in sorted(requests.items()):
            data.append(
                {
                    "MetricName": "Requests",
                    "Dimensions": dims(thing),
                    "Timestamp": stamp,
                    "Value": n,
                    "Unit": "Count",
                }
            )
            failed = sum(v for (t, _), v in errors.items() if t == thing)
            data.append(
                {
                    "MetricName": "Errors",
                    "Dimensions": dims(thing),
                    "Timestamp": stamp,
                    "Value": failed,
                    "Unit": "Count",
                }
            )
        for (thing, code), n in sorted(errors.items()):
            data.append(
                {
                    "MetricName": "Errors",
                    "Dimensions": dims(thing, Code=code),
                    "Timestamp": stamp,
                    "Value": n,
                    "Unit": "Count",
                }
            )
        for thing, s in sorted(latency.items()):
            data.append(
                {
                    "MetricName": "Latency",
                    "Dimensions": dims(thing),
                    "Timestamp": stamp,
                    "StatisticValues": {
                        "SampleCount": s.count,
                        "Sum": round(s.total, 3),
                        "Minimum": round(s.minimum, 3),
                        "Maximum": round(s.maximum, 3),
                    },
                    "Unit": "Milliseconds",
                }
            )
        return data

    def flush(self) -> int:
        """Send what was recorded since the last flush. Returns the number of data points sent."""
        from botocore.exceptions import BotoCoreError, ClientError

        data = self._take()
        sent = 0
        for i in range(0, len(data), _MAX_DATA_PER_CALL):
            chunk = data[i : i + _MAX_DATA_PER_CALL]
            try:
                self.client.put_metric_data(Namespace=self.namespace, MetricData=chunk)
                sent += len(chunk)
            except (BotoCoreError, ClientError) as exc:
                self.failed_flushes += 1
                log.warning("CloudWatch put_metric_data failed (%d data points dropped): %s", len(chunk), exc)
        return sent
