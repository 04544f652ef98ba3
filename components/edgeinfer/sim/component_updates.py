"""SubscribeToComponentUpdates and DeferComponentUpdate: the component update policy's notify protocol.

Before a deployment stops or updates components, the classic nucleus sends a PreComponentUpdateEvent
to every component subscribed to component updates and waits for each DeferComponentUpdate (or the
policy's timeout, 60 s by default). A component that defers with `recheckAfterMs` > 0 is asked again
after that long; once none defers, the update proceeds and a PostComponentUpdateEvent follows
(`LifecycleIPCEventStreamAgent`; the reply texts are its).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from awsiot.greengrasscoreipc import model

from edgeinfer.sim import ipc_server as ipc
from edgeinfer.sim.pubsub import remove

if TYPE_CHECKING:
    from edgeinfer.sim.core import Nucleus


@dataclass(frozen=True)
class Deferral:
    component: str
    message: str
    recheck_after_ms: int


class ComponentUpdates:
    def __init__(self, nucleus: Nucleus) -> None:
        self.nucleus = nucleus
        self.listeners: dict[str, list[ipc.Stream]] = {}
        self._futures: dict[tuple[str, str], asyncio.Future[Deferral]] = {}

    def handlers(self) -> dict[str, Callable[..., Any]]:
        return {
            "aws.greengrass#SubscribeToComponentUpdates": self._subscribe,
            "aws.greengrass#DeferComponentUpdate": self._defer,
        }

    async def _subscribe(self, conn: ipc.Connection, req: Any, stream: ipc.Stream) -> Any:
        assert conn.component is not None
        streams = self.listeners.setdefault(conn.component, [])
        streams.append(stream)

        def closed() -> None:
            remove(streams, stream)
            if not streams:
                self.listeners.pop(str(conn.component), None)

        stream.on_close.append(closed)
        return model.SubscribeToComponentUpdatesResponse()

    async def _defer(self, conn: ipc.Connection, req: Any, stream: ipc.Stream) -> Any:
        assert conn.component is not None
        if conn.component not in self.listeners:
            raise ipc.invalid("Component is not subscribed to component update events")
        if req.deployment_id is None:
            raise ipc.invalid("Cannot defer the update, the deployment ID provided was null")
        future = self._futures.pop((conn.component, str(req.deployment_id)), None)
        if future is None or future.done():
            raise ipc.service_error("Time limit to respond to PreComponentUpdateEvent exceeded")
        future.set_result(Deferral(conn.component, str(req.message or ""), int(req.recheck_after_ms or 0)))
        return model.DeferComponentUpdateResponse()

    def _notify(self, deployment_id: str, restarting: bool) -> list[asyncio.Future[Deferral]]:
        self._futures.clear()
        loop = asyncio.get_running_loop()
        futures = []
        for name, streams in list(self.listeners.items()):
            for stream in list(streams):
                future: asyncio.Future[Deferral] = loop.create_future()
                self._futures[(name, deployment_id)] = future
                stream.send_event(
                    model.ComponentUpdatePolicyEvents(
                        pre_update_event=model.PreComponentUpdateEvent(
                            deployment_id=deployment_id, is_ggc_restarting=restarting
                        )
                    )
                )
                futures.append(future)
        return futures

    async def before_update(
        self, deployment_id: str, timeout_s: float, restarting: bool = False
    ) -> list[Deferral]:
        """Notify the subscribers and wait until none defers; returns the deferrals that were made."""
        made: list[Deferral] = []
        while True:
            futures = self._notify(deployment_id, restarting)
            if not futures:
                return made
            done, _ = await asyncio.wait(futures, timeout=timeout_s)
            self._futures.clear()
            answers = [f.result() for f in done]
            deferring = [a for a in answers if a.recheck_after_ms > 0]
            made += deferring
            for answer in deferring:
                self.nucleus.component(answer.component).log(
                    f"deferred update {deployment_id} by {answer.recheck_after_ms} ms: {answer.message}"
                )
            if not deferring:
                return made
            await asyncio.sleep(max(a.recheck_after_ms for a in deferring) / 1000)

    def after_update(self, deployment_id: str) -> None:
        for streams in list(self.listeners.values()):
            for stream in list(streams):
                stream.send_event(
                    model.ComponentUpdatePolicyEvents(
                        post_update_event=model.PostComponentUpdateEvent(deployment_id=deployment_id)
                    )
                )
