"""A model update that cuts no request off: deployments wait for requests in flight, and a new
ModelStore version is taken up without restarting the runtime.

Deferral (the classic nucleus's component update policy, `UpdateSystemPolicyService`): before a
deployment stops or updates any component, the nucleus sends a PreComponentUpdateEvent to every
subscriber and waits (up to the deployment's timeout, 60 s by default, polling once a second) for a
DeferComponentUpdate from each. A `recheckAfterMs` > 0 makes it sleep that long and ask again; 0
lets it proceed; a PostComponentUpdateEvent follows the update (or its cancellation). The event
names no component, so every deployment is treated alike: the runtime keeps admitting and serving
requests throughout (refusing them would answer OVERLOADED for a deployment of any component) and
defers while any accepted request is unanswered, acknowledging as soon as none is, or after
`MAX_DEFER_S` of deferring under a load that never drains (the runtime's own stop still answers
what it accepted). Nucleus lite serves neither operation: there deployments do not wait, which is
said once in the log.

The model store: its install step writes its artifact folder to
`{kernel:rootPath}/work/com.edgeinfer.ModelStore/artifacts-path`. The runtime's dependency on it is
SOFT, so neither nucleus restarts the runtime for a new store version; the runtime follows the
pointer instead (one stat every `POLL_S`, and at once after a PostComponentUpdateEvent), builds and
warms an engine on the new folder off the hot path and swaps it in. Batches already running finish
on the old engine, which is released with them; a store that does not load is logged in one line
and the running one kept.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from edgeinfer.transport import Bus, Subscription, TransportError

log = logging.getLogger("edgeinfer.runtime")

STORE = "com.edgeinfer.ModelStore"
POINTER = "artifacts-path"
RECHECK_MS = 500  # the nucleus adds its own once-a-second poll of the answers to each round
MAX_DEFER_S = 30.0  # half the nucleus's default policy timeout
POLL_S = 2.0

UpdateKind = Literal["pre", "post"]
UpdateHandler = Callable[[UpdateKind, str], None]


@runtime_checkable
class ComponentUpdates(Protocol):
    """What a bus that carries SubscribeToComponentUpdates adds to `Bus` (the IPC bus; nucleus lite
    refuses the subscription with a TransportError)."""

    def on_component_update(self, handler: UpdateHandler) -> Subscription: ...

    def defer_component_update(self, deployment_id: str, message: str, recheck_after_ms: int) -> None: ...


class InFlight:
    """Accepted requests not answered yet (a lock and an integer on the request path)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0

    def enter(self) -> None:
        with self._lock:
            self._count += 1

    def leave(self) -> None:
        with self._lock:
            self._count -= 1

    @property
    def count(self) -> int:
        return self._count


class DeferPolicy:
    """The answer to each PreComponentUpdateEvent: `decide` returns (recheckAfterMs, message), where
    0 lets the deployment proceed."""

    def __init__(
        self,
        inflight: InFlight,
        *,
        clock: Callable[[], float] = time.monotonic,
        recheck_ms: int = RECHECK_MS,
        max_defer_s: float = MAX_DEFER_S,
    ) -> None:
        self.inflight = inflight
        self.clock = clock
        self.recheck_ms = recheck_ms
        self.max_defer_s = max_defer_s
        self._first: dict[str, float] = {}  # deployment -> when it was first announced

    def decide(self, deployment_id: str) -> tuple[int, str]:
        now = self.clock()
        if deployment_id not in self._first and len(self._first) >= 16:
            self._first.clear()  # Post events that never came (a nucleus restart) leave no growth
        first = self._first.setdefault(deployment_id, now)
        waited = now - first
        open_ = self.inflight.count
        if open_ <= 0:
            return 0, "no requests in flight"
        if waited >= self.max_defer_s:
            log.warning(
                "deployment %s: %d requests still in flight after deferring %.0f s; letting it proceed",
                deployment_id,
                open_,
                waited,
            )
            return 0, f"{open_} requests in flight after {waited:.0f} s of deferral"
        remaining_ms = max(1, int((self.max_defer_s - waited) * 1000))
        return min(self.recheck_ms, remaining_ms), f"{open_} requests in flight"

    def done(self, deployment_id: str) -> None:
        self._first.pop(deployment_id, None)


def follow_component_updates(
    bus: Bus, policy: DeferPolicy, on_post: Callable[[], None], component: str
) -> Subscription | None:
    """Subscribe to component updates where the nucleus serves them (classic) and answer each
    PreComponentUpdateEvent by `policy`; `on_post` after each PostComponentUpdateEvent. Where the
    nucleus does not (lite: ServiceError), say so once and return None."""
    reason: str | Exception = "this transport has no component updates"
    if isinstance(bus, ComponentUpdates):
        try:
            return bus.on_component_update(_answering(bus, policy, on_post))
        except TransportError as exc:
            reason = exc
    log.warning(
        "%s: deployments do not wait for requests in flight, the nucleus does not serve "
        "SubscribeToComponentUpdates (%s); a new %s is taken up from its %s",
        component,
        reason,
        STORE,
        POINTER,
    )
    return None


def _answering(updates: ComponentUpdates, policy: DeferPolicy, on_post: Callable[[], None]) -> UpdateHandler:
    """The handler of component-update events: each Pre answered by `policy`, each Post `on_post`."""
    deferring: set[str] = set()

    def on_event(kind: UpdateKind, deployment_id: str) -> None:
        if kind == "post":
            policy.done(deployment_id)
            deferring.discard(deployment_id)
            on_post()
            return
        recheck_ms, message = policy.decide(deployment_id)
        if recheck_ms > 0 and deployment_id not in deferring:
            deferring.add(deployment_id)
            log.info("deferring deployment %s: %s", deployment_id, message)
        elif recheck_ms == 0 and deployment_id in deferring:
            deferring.discard(deployment_id)
            log.info("deployment %s may proceed: %s", deployment_id, message)
        try:
            updates.defer_component_update(deployment_id, message, recheck_ms)
        except TransportError as exc:
            log.warning("DeferComponentUpdate for deployment %s failed: %s", deployment_id, exc)

    return on_event


def store_pointer(work_dir: str, component: str = STORE) -> Path:
    """Where a model component's install step (the ModelStore's, or another model's built the same
    way) writes its artifact folder, from this component's work folder (both are
    `{kernel:rootPath}/work/<component>`; lite's paths end in `/`)."""
    return Path(os.path.normpath(work_dir)).parent / component / POINTER


def _folder(text: str) -> str:
    text = text.strip()
    return os.path.normpath(text) if text else ""


def read_pointer(pointer: Path) -> str:
    """The artifact folder `pointer` names (normalised), or '' when there is none to read."""
    try:
        return _folder(pointer.read_text())
    except (OSError, UnicodeDecodeError):
        return ""


class StoreWatcher:
    """Calls `on_change(folder)` on its own thread when the pointer names a folder other than the one
    last seen (`current` at first): at most one stat every `interval_s`, or at once after `poke`."""

    def __init__(
        self,
        pointer: Path,
        current: str,
        on_change: Callable[[str], None],
        *,
        interval_s: float = POLL_S,
    ) -> None:
        self.pointer = pointer
        self.seen = _folder(current)
        self.on_change = on_change
        self.interval_s = interval_s
        self._stat: tuple[int, int, int] | None = None
        self._wake = threading.Event()
        self._stopped = False
        self._thread: threading.Thread | None = None

    def check(self) -> bool:
        """Look once; True when `on_change` was called."""
        try:
            st = os.stat(self.pointer)
        except OSError:
            return False
        stat = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stat == self._stat:
            return False
        self._stat = stat
        folder = read_pointer(self.pointer)
        if not folder or folder == self.seen:
            return False
        self.seen = folder
        self.on_change(folder)
        return True

    def poke(self) -> None:
        self._wake.set()

    def start(self) -> StoreWatcher:
        self.check()  # the stat the loop compares with
        self._thread = threading.Thread(target=self._loop, name="edgeinfer-store", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while True:
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stopped:
                return
            try:
                self.check()
            except Exception:  # a bad store is on_change's to report; keep watching
                log.exception("checking %s failed", self.pointer)

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
