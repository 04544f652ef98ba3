"""Pacing a router connection within AWS IoT Core's per-connection limits.

IoT Core allows a connection 100 publishes a second (not adjustable) and 512 KB a second, each way,
and at most 100 unacknowledged QoS 1 messages each way. A router connection pushed past them is
throttled: devices then get their answers late or never. Each direction of a router connection
therefore takes tokens from two buckets, one counting messages and one counting bytes, before a
message passes:

* outbound, before a result is published;
* inbound, before a received offload is handled. The handler runs before the client acknowledges
  the message (MQTT 5 Receive Maximum set on the CONNECT, see `edgeinfer.transport.mqtt`), so a
  connection that waits here holds its acknowledgements back and the broker keeps the rest.

A token bucket with rate `r` and capacity `b` lets at most `b + r·T` through in any window of `T`
seconds. Inbound, the broker may also send up to Receive Maximum messages that have not yet been
paid for, so a one-second window sees at most `receive_maximum + rate + burst` messages (and that
many times the message size in bytes): the defaults keep that under the limits with a margin for a
typical offload, and docs/router.md gives the arithmetic.

A message larger than a bucket's capacity still passes once the bucket is full, leaving it in debt,
so no message size can block a connection for ever while the long-run rate still holds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from edgeinfer.pacing import TokenBucket

__all__ = ["DirectionLimits", "Pacer", "PacingConfig", "TokenBucket"]

KB = 1024

# AWS IoT Core's message-broker limits per connection (its quota page).
IOT_CORE_PUBLISHES_PER_S = 100
IOT_CORE_BYTES_PER_S = 512 * KB
IOT_CORE_MAX_UNACKED = 100


@dataclass(frozen=True)
class DirectionLimits:
    """What one direction of one connection may carry: a rate and a burst, in messages and bytes."""

    publishes_per_s: float
    publish_burst: float
    bytes_per_s: float
    byte_burst: float


@dataclass(frozen=True)
class PacingConfig:
    """Per-connection limits. The defaults stay under IoT Core's with a margin (see the module doc):
    outbound `rate + burst` ≤ 90 messages and ≤ 448 KB in any second; inbound, with 25 KB offloads,
    `receive_maximum + rate + burst` ≤ 89 messages and ≤ 485 KB."""

    outbound: DirectionLimits = DirectionLimits(80, 10, 400 * KB, 48 * KB)
    inbound: DirectionLimits = DirectionLimits(80, 5, 360 * KB, 25 * KB)
    receive_maximum: int = 4  # unacknowledged QoS 1 messages the broker may send (MQTT 5 CONNECT)

    def check(self) -> None:
        """Raise ValueError for limits that could never pass IoT Core's (or could never pass anything)."""
        for name, d in (("outbound", self.outbound), ("inbound", self.inbound)):
            if min(d.publishes_per_s, d.publish_burst, d.bytes_per_s, d.byte_burst) <= 0:
                raise ValueError(f"{name} pacing limits must be positive")
            if d.publishes_per_s + d.publish_burst > IOT_CORE_PUBLISHES_PER_S:
                raise ValueError(
                    f"{name}: {d.publishes_per_s:g}/s plus a burst of {d.publish_burst:g} exceeds "
                    f"IoT Core's {IOT_CORE_PUBLISHES_PER_S} publishes a second"
                )
            if d.bytes_per_s + d.byte_burst > IOT_CORE_BYTES_PER_S:
                raise ValueError(f"{name}: {d.bytes_per_s:g} B/s plus its burst exceeds IoT Core's 512 KB/s")
        if not 1 <= self.receive_maximum <= IOT_CORE_MAX_UNACKED:
            raise ValueError(f"receive maximum must be 1..{IOT_CORE_MAX_UNACKED}, not {self.receive_maximum}")

    def scaled(self, factor: float, receive_maximum: int | None = None) -> PacingConfig:
        """These limits times `factor` (tests run the same arithmetic against a scaled-down broker)."""

        def scale(d: DirectionLimits) -> DirectionLimits:
            return DirectionLimits(*(max(1.0, v * factor) for v in vars(d).values()))

        return PacingConfig(
            scale(self.outbound), scale(self.inbound), receive_maximum or self.receive_maximum
        )


class Pacer:
    """One direction of one connection: a message passes once both buckets let it (`admit`)."""

    def __init__(
        self,
        limits: DirectionLimits,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.limits = limits
        self.count = TokenBucket(limits.publishes_per_s, limits.publish_burst, clock=clock, sleep=sleep)
        self.bytes = TokenBucket(limits.bytes_per_s, limits.byte_burst, clock=clock, sleep=sleep)
        self._lock = threading.Lock()  # one message at a time takes from both, so none jumps the line
        self.messages = 0
        self.total_bytes = 0
        self.waited_s = 0.0

    def admit(self, size: int) -> float:
        """Wait until a message of `size` bytes may pass; returns the seconds it waited."""
        with self._lock:
            waited = self.count.take(1)
            waited += self.bytes.take(size)
            self.messages += 1
            self.total_bytes += size
            self.waited_s += waited
            return waited
