"""The models one runtime serves: a repository of model stores, each loaded on its own, within a budget.

Each configured store is a `ModelSlot`, named by its manifest (read at configuration, before any
engine exists), with its own engine when loaded, its own dynamic batcher and its own batch-time
figures: one model's queue never delays another's, and each keeps its own variant and provider. The
first slot is the default (a request without `model`, the source, the placement policy and the
self-test use it): loaded at start and never evicted.

Loads and warm-ups run one at a time, each on a thread of its own that the repository's thread
starts, never on the transport's thread or an engine thread. A request for a model that is not
loaded (`acquire`) starts its load and waits for it within its deadline (a request without one waits
at most `LOAD_WAIT_S`); one whose deadline the load cannot meet by the last load's duration is
answered at once, OVERLOADED "model X is loading". At most `max_loaded` models are loaded: before a
load, and whenever the budget is over, the least recently used model that is neither the default
nor pinned, and has nothing admitted or running, is unloaded. A request in admission holds a lease
on its slot (`acquire` … `release`), so the model it was
admitted to is not unloaded under it.

What the repository decides, the server carries out through `RepositoryHooks` (start a model's
engine threads, resume or answer the requests that waited); the repository knows nothing of the bus.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgeinfer.messages import ErrorCode, ModelRef
from edgeinfer.runtime.answer import Job
from edgeinfer.runtime.batcher import DynamicBatcher, Queued
from edgeinfer.runtime.engine import BackgroundLoad, Engine, background_load

if TYPE_CHECKING:
    from edgeinfer.runtime.config import ModelEntry

__all__ = [
    "LOAD_WAIT_S",
    "Admission",
    "ModelRepository",
    "ModelSlot",
    "ModelSource",
    "RepositoryHooks",
    "Waiting",
    "read_source",
    "read_sources",
]

log = logging.getLogger("edgeinfer.runtime")

# How long a request without a deadline waits for its model to load: a load expected to take longer
# is answered OVERLOADED at once, and one that does is answered so when this has passed.
LOAD_WAIT_S = 5.0
# A store that failed to load is not tried again for this long: its requests are answered at once.
RETRY_S = 30.0
# How often the loader looks at the budget when nothing else wakes it (a model that was busy when
# a load needed its room is unloaded once it drains).
BUDGET_POLL_S = 0.5


@dataclass
class ModelSource:
    """Where a model's store is: `folder` (it follows a component's new versions), `component` when
    it came from a Greengrass model component's `artifacts-path`."""

    name: str
    folder: str
    version: str = ""  # the manifest's, for what is answered while it is not loaded
    component: str = ""
    pinned: bool = False
    preload: bool = False


@dataclass
class Waiting:
    """A request that waits for its model's load, until `until` (its deadline when `deadline`)."""

    job: Job
    until: float
    deadline: bool


@dataclass(frozen=True)
class Admission:
    """What `acquire` decided: `ready` (a lease is held: serve it, then `release`), refused (`code`
    and `why`: answer it so), or neither (it waits; the loader resumes or answers it)."""

    ready: bool = False
    code: ErrorCode | None = None
    why: str = ""


_READY = Admission(ready=True)
_WAITS = Admission()


class ModelSlot:
    """One configured model: its store, its engine while loaded, its own batcher and figures."""

    def __init__(
        self, source: ModelSource, engine: Engine | None = None, *, load_s: float | None = None
    ) -> None:
        self.source = source
        self.engine = engine
        # Replaced by the server with one sized from its configuration (see `InferenceServer`).
        self.batcher: DynamicBatcher[Job] = DynamicBatcher()
        self.engine_lock = threading.Lock()
        self.engine_ms = 0.0  # moving average of a batch's run on this model's engine
        self.mean_batch = 0.0
        self.threads: list[threading.Thread] = []  # this model's engine threads
        self.last_used = 0.0
        self.leases = 0
        self.loading_since: float | None = None
        self.load_s = load_s  # how long its last load (build and warm-up) took
        self.load_error: tuple[float, str] | None = None
        self.waiting: list[Waiting] = []

    @property
    def name(self) -> str:
        return self.source.name

    @property
    def model_ref(self) -> ModelRef:
        """What answers name: the engine's (with its variant), else the store's."""
        engine = self.engine
        return engine.model_ref if engine is not None else ModelRef(self.name, self.source.version, "")

    def matches(self, model: str) -> bool:
        """`model` names this store: its manifest's name, or the variant its engine runs."""
        return model == self.name or (self.engine is not None and model == self.engine.model_ref.variant)

    def __repr__(self) -> str:
        return f"ModelSlot({self.name!r}, loaded={self.engine is not None})"


class RepositoryHooks:
    """What the repository asks of the server, on its own threads (never a request's). The base does
    nothing."""

    def on_loaded(self, slot: ModelSlot, waiting: list[Waiting]) -> None:
        """(On the load's thread.) `slot.engine` is new: start its engine threads, then serve `waiting`."""

    def on_unloaded(self, slot: ModelSlot, engine: Engine) -> None:
        """`engine` is no longer `slot`'s (evicted): let its engine threads end."""

    def on_waited_out(self, slot: ModelSlot, waiting: list[Waiting]) -> None:
        """These waited as long as they could for `slot`'s load: answer them."""

    def on_load_failed(self, slot: ModelSlot, waiting: list[Waiting], error: str) -> None:
        """`slot`'s store did not load: answer what waited for it."""


class ModelRepository:
    """The slots in configuration order (the first is the default), the budget and the loader."""

    def __init__(
        self,
        slots: Sequence[ModelSlot],
        *,
        build: Callable[[ModelSlot], Engine] | None = None,
        max_loaded: int = 0,
        max_waiting: int = 64,
        background: BackgroundLoad | None = BackgroundLoad(),  # noqa: B008 - frozen
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not slots:
            raise ValueError("a repository serves at least one model")
        if slots[0].engine is None:
            raise ValueError("the default model is loaded before serving starts")
        self.slots = list(slots)
        self.build = build
        self.max_loaded = max_loaded
        self.max_waiting = max_waiting
        # How a load a request asked for spends the CPU while the loaded models serve (None: as the
        # first model's at start, as a preload always does).
        self.background = background
        self.clock = clock
        self.hooks = RepositoryHooks()
        self._cond = threading.Condition()
        self._pending: deque[ModelSlot] = deque()
        self._preloads: set[str] = set()  # queued by `load`: built at full speed, as at start
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._loading: threading.Thread | None = None  # the load under way

    # ------------------------------------------------------------------------------------ lookup

    @property
    def default(self) -> ModelSlot:
        return self.slots[0]

    def names(self) -> list[str]:
        return [s.name for s in self.slots]

    def get(self, model: str | None) -> ModelSlot | None:
        """The slot a request's `model` picks (None: the default): by manifest name first, then by
        the variant a loaded engine runs; None when nothing here serves it."""
        if model is None:
            return self.default
        for slot in self.slots:
            if slot.name == model:
                return slot
        return next((s for s in self.slots if s.matches(model)), None)

    def add(self, slot: ModelSlot) -> None:
        """Serve one more model (a model component deployed after the start). ValueError when its
        name is one served already."""
        with self._cond:
            if any(s.name == slot.name for s in self.slots):
                raise ValueError(f"a model named {slot.name!r} is served already")
            self.slots.append(slot)

    def loaded(self) -> list[ModelSlot]:
        return [s for s in self.slots if s.engine is not None]

    # ---------------------------------------------------------------------------------- admission

    def acquire(self, slot: ModelSlot, job: Job) -> Admission:
        """A lease on a loaded slot, or `job` waits for its load (started here), or why it cannot."""
        with self._cond:
            if self._stopped:  # stop() has collected what waited: one joining now would go unanswered
                return Admission(code=ErrorCode.INTERNAL, why="the runtime is stopping")
            now = self.clock()
            slot.last_used = now
            if slot.engine is not None:
                slot.leases += 1
                return _READY
            if slot.load_error is not None and now - slot.load_error[0] < RETRY_S:
                return Admission(
                    code=ErrorCode.INTERNAL, why=f"model {slot.name} did not load: {slot.load_error[1]}"
                )
            self._queue_load(slot, now)
            return self._wait(slot, job, now)

    def _wait(self, slot: ModelSlot, job: Job, now: float) -> Admission:
        limit = job.deadline if job.deadline is not None else now + LOAD_WAIT_S
        left_s = self._expected_end(slot) - now
        if now + left_s > limit:
            why = f"model {slot.name} is loading (about {left_s * 1000:.0f} ms more"
            why += ", past the request's deadline)" if job.deadline is not None else ")"
            return Admission(code=ErrorCode.OVERLOADED, why=why)
        if len(slot.waiting) >= self.max_waiting:
            why = f"model {slot.name} is loading and {len(slot.waiting)} requests wait for it"
            return Admission(code=ErrorCode.OVERLOADED, why=why)
        slot.waiting.append(Waiting(job, limit, job.deadline is not None))
        self._cond.notify_all()
        return _WAITS

    def release(self, slot: ModelSlot) -> None:
        with self._cond:
            slot.leases -= 1

    def lease_loaded(self, slot: ModelSlot, folder: str = "") -> bool:
        """A lease on `slot` when it is loaded (True: `release` it), so that no eviction or load runs
        while the caller swaps its engine; else False, and with `folder` its store is there from now
        on (its next load reads it; a load under way from the old folder is run again)."""
        with self._cond:
            if slot.engine is not None and slot.loading_since is None:
                slot.leases += 1
                return True
            if folder:
                slot.source.folder = folder
            return False

    def lease_for_frame(self, slot: ModelSlot) -> bool:
        """A lease on `slot` for a source's frame when it is loaded (True: `release` it), marking it used
        as a request does, so that eviction sees a model only a camera keeps busy. When it is not
        loaded, its load is asked for (not again within the retry time of a failed one) and False: the
        frame is dropped, and the source's next frames are served once it is loaded."""
        with self._cond:
            now = self.clock()
            slot.last_used = now
            if slot.engine is not None and slot.loading_since is None:
                slot.leases += 1
                return True
            if slot.load_error is not None and now - slot.load_error[0] < RETRY_S:
                return False
        self.load(slot)
        return False

    def mark_failed(self, slot: ModelSlot, error: str) -> list[Queued[Job]]:
        """`slot`'s model loaded but its start failed: it is not left loaded with no engine thread to
        run its batches. Until its retry time has passed its requests are refused as a load that
        failed (`acquire`); its batcher is closed until it loads again, so that a request admitted
        before now is refused there (its caller answers it); what was queued is returned, to answer."""
        with self._cond:
            slot.engine = None
            slot.load_error = (self.clock(), error)
            return slot.batcher.close()

    def _expected_end(self, slot: ModelSlot) -> float:
        """When `slot`'s load should end: its last load's duration, else the longest load seen of any
        model (0 before any was timed)."""
        took = slot.load_s
        if took is None:
            took = max((s.load_s for s in self.slots if s.load_s is not None), default=0.0)
        return (slot.loading_since if slot.loading_since is not None else self.clock()) + took

    def _queue_load(self, slot: ModelSlot, now: float) -> None:
        if slot.loading_since is None:
            slot.loading_since = now
            self._pending.append(slot)
            self._cond.notify_all()

    def load(self, slot: ModelSlot) -> None:
        """Load `slot` on the loader thread (a preload), unless it is loaded or loading. A preload is
        part of the start (asked to be ready as soon as it can), so `background` does not apply."""
        with self._cond:
            if slot.engine is None:
                if slot.loading_since is None:
                    self._preloads.add(slot.name)
                self._queue_load(slot, self.clock())

    def configure(self, max_loaded: int) -> None:
        with self._cond:
            self.max_loaded = max_loaded
            self._cond.notify_all()

    # ------------------------------------------------------------------------------------- loader

    def start(self, hooks: RepositoryHooks) -> None:
        """Start the loader thread and load what is preloaded or pinned."""
        self.hooks = hooks
        self._thread = threading.Thread(target=self._loop, name="edgeinfer-models", daemon=True)
        self._thread.start()
        for slot in self.slots:
            if slot.source.preload or slot.source.pinned:
                self.load(slot)

    def stop(self) -> list[tuple[ModelSlot, list[Waiting]]]:
        """Stop the loader (a load under way is given up when it ends); what waited, to answer."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        for thread in (self._thread, self._loading):
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=30)
        with self._cond:
            out = [(s, s.waiting) for s in self.slots if s.waiting]
            for s in self.slots:
                s.waiting = []
            return out

    def _loop(self) -> None:
        """Answer what waited too long, start the next load (one at a time, each on a thread of its
        own, so that a long load holds up no answer), keep to the budget."""
        while True:
            with self._cond:
                if self._stopped:
                    return
                now = self.clock()
                expired = self._take_expired(now)
                slot = self._pending.popleft() if self._pending and self._loading is None else None
                if slot is not None:
                    self._loading = threading.Thread(
                        target=self._load, args=(slot,), name=f"edgeinfer-load-{slot.name}", daemon=True
                    )
                    self._loading.start()
                elif not expired:
                    self._cond.wait(self._next_wake(now))
            try:
                for s, waited in expired:
                    self.hooks.on_waited_out(s, waited)
                self._enforce_budget(None)
            except Exception:  # the loader keeps serving the other models
                log.exception("the model loader failed")

    def _take_expired(self, now: float) -> list[tuple[ModelSlot, list[Waiting]]]:
        out = []
        for s in self.slots:
            gone = [w for w in s.waiting if w.until <= now]
            if gone:
                s.waiting = [w for w in s.waiting if w.until > now]
                out.append((s, gone))
        return out

    def _next_wake(self, now: float) -> float:
        ends = [w.until for s in self.slots for w in s.waiting]
        return max(0.001, min([*ends, now + BUDGET_POLL_S]) - now)

    def _load(self, slot: ModelSlot) -> None:
        try:
            self._build(slot)
        except Exception:
            log.exception("loading model %s failed", slot.name)
        finally:
            with self._cond:
                self._loading = None
                self._cond.notify_all()

    def _build(self, slot: ModelSlot) -> None:
        start = self.clock()
        with self._cond:
            folder = slot.source.folder
            background = None if slot.name in self._preloads else self.background
            self._preloads.discard(slot.name)
        try:
            # In here, so that a failure to make room still ends the load and answers what waited.
            self._enforce_budget(slot)
            if self.build is None:
                raise RuntimeError("this runtime loads no model after its start")
            with background_load(background):
                engine = self.build(slot)
        except Exception as exc:
            log.error("model %s at %s not loaded: %s", slot.name, slot.source.folder, exc)
            with self._cond:
                slot.loading_since = None
                slot.load_error = (self.clock(), str(exc))
                waited, slot.waiting = slot.waiting, []
            self.hooks.on_load_failed(slot, waited, str(exc))
            return
        with self._cond:
            if slot.source.folder != folder and not self._stopped:
                # The store moved during the build (a new version): load it from there instead.
                log.info(
                    "model %s: its store moved to %s while loading; loading again",
                    slot.name,
                    slot.source.folder,
                )
                self._pending.append(slot)
                self._cond.notify_all()
                return
            slot.load_s = self.clock() - start
            slot.loading_since = None
            slot.load_error = None
            slot.engine = engine
            if not self._stopped:  # closed by `mark_failed`: it takes work again (at stop it stays closed)
                slot.batcher.reopen()
            slot.last_used = self.clock()
            waited, slot.waiting = slot.waiting, []
            slot.leases += 1  # what waited is admitted before the budget may unload it again
        log.info(
            "model %s loaded in %.0f ms (%s, %s)",
            slot.name,
            1000 * slot.load_s,
            engine.provider,
            slot.source.folder,
        )
        try:
            self.hooks.on_loaded(slot, waited)
        finally:
            self.release(slot)

    def _enforce_budget(self, coming: ModelSlot | None) -> None:
        """Unload the least recently used models that may go while more than the budget are loaded
        (with `coming`: while it would not fit)."""
        if not self.max_loaded:
            return
        gone: list[tuple[ModelSlot, Engine]] = []
        with self._cond:
            loaded = [s for s in self.slots if s.engine is not None and s is not coming]
            room = self.max_loaded - (1 if coming is not None else 0)
            for victim in sorted((s for s in loaded if self._evictable(s)), key=lambda s: s.last_used):
                if len(loaded) <= room:
                    break
                engine = victim.engine
                assert engine is not None
                victim.engine = None
                loaded.remove(victim)
                gone.append((victim, engine))
        for victim, engine in gone:
            log.info("model %s unloaded: least recently used of %d loaded", victim.name, self.max_loaded)
            self.hooks.on_unloaded(victim, engine)

    def _evictable(self, slot: ModelSlot) -> bool:
        return (
            slot is not self.default
            and not slot.source.pinned
            and slot.leases == 0
            and not slot.waiting
            and slot.batcher.idle
        )


def read_sources(entries: Sequence[ModelEntry], work_dir: str) -> list[ModelSource | str]:
    """Each configured model's store, named by its manifest (a `dir` as given, a `component` by the
    `artifacts-path` its install step wrote beside this component's work folder), or in its place
    why it cannot be served (no store there, a name an earlier store has)."""
    from edgeinfer.runtime.updates import read_pointer, store_pointer

    out: list[ModelSource | str] = []
    for entry in entries:
        folder = entry.dir
        if entry.component:
            pointer = store_pointer(work_dir, entry.component)
            folder = read_pointer(pointer)
            if not folder:
                out.append(f"model component {entry.component}: no store at {pointer}")
                continue
        taken = [s.name for s in out if isinstance(s, ModelSource)]
        out.append(read_source(entry, folder, taken))
    return out


def read_source(entry: ModelEntry, folder: str, taken: Sequence[str]) -> ModelSource | str:
    """`entry`'s store in `folder`, named by its manifest, or why it cannot be served (`taken`: the
    names of the stores before it)."""
    from edgeinfer.model.manifest import Manifest

    try:
        manifest = Manifest.load(folder)
    except Exception as exc:
        return f"model store {folder}: {exc}"
    if manifest.name in taken:
        return f"model store {folder}: the name {manifest.name!r} is an earlier store's"
    return ModelSource(
        manifest.name,
        folder,
        version=manifest.version,
        component=entry.component,
        pinned=entry.pinned,
        preload=entry.preload,
    )
