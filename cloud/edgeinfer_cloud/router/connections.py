"""One router connection: a `PubSub` with its own pacing each way (`edgeinfer_cloud.router.pacer`).

A router process may hold several connections in the same shared subscription: the broker deals the
offloads among them as among separate routers, and the router batches whatever arrives on any of
them into its one backend. Each result goes back on the connection its request came on, so every
connection's outbound follows its own inbound and each stays within its own limits.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgeinfer.transport import Message, MessageHandler, PubSub, Subscription
from edgeinfer_cloud.router.pacer import Pacer, PacingConfig

__all__ = ["RouterConnection", "paced_connections"]


@dataclass
class RouterConnection:
    """A connection and its pacers (None: unpaced, as a router on the in-memory bus runs)."""

    pubsub: PubSub
    name: str = "0"
    outbound: Pacer | None = None
    inbound: Pacer | None = None

    def publish(self, topic: str, payload: bytes, *, qos: int) -> None:
        """Publish once the outbound pacer lets this message through (waits here when it must)."""
        if self.outbound is not None:
            self.outbound.admit(len(payload) + len(topic))
        self.pubsub.publish(topic, payload, target="iot", qos=qos)

    def subscribe(self, topic: str, handler: MessageHandler, *, qos: int, paced: bool) -> Subscription:
        """Subscribe `handler`; `paced`: each message first waits for the inbound pacer, on the
        client's dispatcher thread and before the client acknowledges it, so the broker holds the rest."""
        inbound = self.inbound if paced else None
        if inbound is None:
            return self.pubsub.subscribe(topic, handler, target="iot", qos=qos)

        def paced_handler(message: Message) -> None:
            inbound.admit(len(message.payload) + len(message.topic))
            handler(message)

        return self.pubsub.subscribe(topic, paced_handler, target="iot", qos=qos)

    def stats(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for way, pacer in (("out", self.outbound), ("in", self.inbound)):
            if pacer is not None:
                out[f"{way}_messages"] = pacer.messages
                out[f"{way}_bytes"] = pacer.total_bytes
                out[f"{way}_waited_s"] = round(pacer.waited_s, 3)
        return out


def paced_connections(pubsubs: list[PubSub], pacing: PacingConfig | None) -> list[RouterConnection]:
    """One `RouterConnection` per client, each with pacers of its own (None: unpaced)."""
    return [
        RouterConnection(
            p,
            str(i),
            Pacer(pacing.outbound) if pacing is not None else None,
            Pacer(pacing.inbound) if pacing is not None else None,
        )
        for i, p in enumerate(pubsubs)
    ]
