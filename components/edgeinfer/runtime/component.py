"""The com.edgeinfer.InferenceRuntime component process (`python -m edgeinfer.runtime`).

Connect to the nucleus, read the configuration (GetConfiguration: the component's whole
`configuration` map, with `-o KEY=VALUE` overrides for local runs), create the engine on the best
provider that really loads, warm up every batch size, start serving, then UpdateState RUNNING.
Configuration changes are applied live (SubscribeToConfigurationUpdate, served by both nuclei):
batching, limits, topics and timings at once; a change of provider, model or engine options builds
and warms a new engine off the hot path and swaps it in; sources added, removed or changed start,
stop or restart with their new settings, the others untouched (`runtime.sources`). Where
the nucleus validates proposed changes (SubscribeToValidateConfigurationUpdates: the classic nucleus)
a refused change comes back with the reasons; where it does not (nucleus lite), a change that does
not read is logged and the running configuration kept. A deployment is deferred while requests are
in flight, and a new ModelStore version is swapped in without a restart (`updates`). SIGTERM stops
cleanly, answering what was accepted.
"""

from __future__ import annotations

import argparse
import functools
import gc
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, Any

from edgeinfer import procfs
from edgeinfer.transport import Bus, Message, Subscription
from edgeinfer.transport.outbox import Forwarder

if TYPE_CHECKING:  # imported where used: `main` answers a bad command line before numpy is loaded
    from edgeinfer.capture.hook import CaptureHook
    from edgeinfer.runtime.config import ModelEntry, RuntimeConfig
    from edgeinfer.runtime.engine import Engine
    from edgeinfer.runtime.models import ModelRepository, ModelSlot
    from edgeinfer.runtime.server import InferenceServer
    from edgeinfer.runtime.sources import SourceManager
    from edgeinfer.runtime.updates import StoreWatcher

_T0 = time.monotonic()

log = logging.getLogger("edgeinfer.runtime")


def process_age_ms() -> float:
    """Milliseconds since this process was started (from /proc; since import elsewhere)."""
    age = procfs.process_age_s()
    return age * 1000 if age is not None else (time.monotonic() - _T0) * 1000


def _thing() -> str:
    return os.environ.get("AWS_IOT_THING_NAME", "") or "edgeinfer-local"


@dataclass
class RuntimeArgs:
    """The command line: `--model-dir`, `--work-dir`, `--thing` and the `-o KEY=VALUE` options.
    `model_dir` follows the ModelStore when its pointer moves (see `Component._store_changed`)."""

    model_dir: str = ""
    work_dir: str = ""
    thing: str = ""
    option: list[str] = field(default_factory=list)

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> RuntimeArgs:
        return cls(
            model_dir=str(ns.model_dir or ""),
            work_dir=str(ns.work_dir or ""),
            thing=str(ns.thing or ""),
            option=[str(o) for o in getattr(ns, "option", None) or []],
        )


class EarlyInbox:
    """Subscribed before the engine exists, so requests sent while the runtime starts are served, not
    lost (the nucleus calls a Run component RUNNING as soon as its process starts). Buffers until
    `attach`, then replays in order and forwards everything to the server."""

    def __init__(self, limit: int = 1024) -> None:
        self.limit = limit
        self.server: InferenceServer | None = None
        self.buffer: list[Message] = []
        self.overflow = 0
        self.subs: list[Subscription] = []
        self._lock = threading.Lock()

    def subscribe(self, bus: Bus, topic: str, *, local: bool, iot: bool) -> None:
        if local:
            self.subs.append(bus.subscribe(topic, self, target="local", inline=True))
        if iot:
            self.subs.append(bus.subscribe(topic, self, target="iot", qos=1, inline=True))

    def __call__(self, message: Message) -> None:
        with self._lock:
            server = self.server
            if server is None:
                if len(self.buffer) < self.limit:
                    self.buffer.append(message)
                else:
                    self.overflow += 1
                return
        server.handle_message(message)

    def attach(self, server: InferenceServer) -> int:
        replayed = 0
        while True:
            with self._lock:
                pending, self.buffer = self.buffer, []
                if not pending:
                    self.server = server
                    break
            for message in pending:
                server.handle_message(message)
            replayed += len(pending)
        if self.overflow:
            log.warning(
                "%d requests arrived during start-up beyond the %d buffered", self.overflow, self.limit
            )
        return replayed


class Component:
    def __init__(self, bus: Bus, args: RuntimeArgs | argparse.Namespace) -> None:
        from edgeinfer.config import parse_overrides
        from edgeinfer.runtime.config import RuntimeConfig

        self.bus = bus
        self.args = args if isinstance(args, RuntimeArgs) else RuntimeArgs.from_namespace(args)
        self.overrides = parse_overrides(self.args.option)
        self.thing = self.args.thing or _thing()
        self.work_dir = self.args.work_dir or os.getcwd()
        self.cfg = RuntimeConfig()
        self._server: InferenceServer | None = None
        self.sources: SourceManager | None = None  # `source` and `sources`, started with the server
        self._lock = threading.Lock()
        self._queue_lock = threading.Lock()
        self._update_queued = False
        self._stop = threading.Event()
        self.store_watcher: StoreWatcher | None = None
        self.model_watchers: list[StoreWatcher] = []  # one per model component of `models`
        self.updates: Subscription | None = None
        self.capture: CaptureHook | None = None
        self.forward: Forwarder | None = None  # a source's IoT-bound results: docs/iot-path.md

    @property
    def server(self) -> InferenceServer:
        """The server `start` built (there is none before)."""
        if self._server is None:
            raise RuntimeError("the runtime has not started")
        return self._server

    # ------------------------------------------------------------------------------------------ start

    def read_config(self, doc: dict[str, Any] | None = None) -> RuntimeConfig:
        """The configuration the nucleus holds (or `doc`), under the command line's overrides, with
        the placement object read too. Raises ConfigError naming every refused key."""
        from edgeinfer.config import merge
        from edgeinfer.runtime.config import RuntimeConfig
        from edgeinfer.runtime.placement import OffloadConfig

        if doc is None:
            doc = self.bus.get_configuration()
        doc = merge(doc if isinstance(doc, dict) else {}, self.overrides)
        cfg = RuntimeConfig.from_recipe(doc)
        OffloadConfig.from_recipe(cfg.placement)  # refused here, before the policy is built
        return cfg

    def model_dir(self, cfg: RuntimeConfig) -> str:
        """The default model's store: `modelDir`, else the command line's (the ModelStore); with
        `models`, the first one's."""
        if cfg.models and self._server is not None:
            return self.server.models.default.source.folder
        return str(cfg.model_dir or self.args.model_dir or "")

    def build_engine(self, cfg: RuntimeConfig) -> Engine:
        return self.build_engine_in(cfg, self.model_dir(cfg))

    def new_repository(self, cfg: RuntimeConfig) -> ModelRepository:
        """The models to serve, the default's engine built and warmed: `models`, else the one store.
        Raises ConfigError when the default's store cannot be read; a later one that cannot is
        logged and left out."""
        from edgeinfer.config import ConfigError
        from edgeinfer.model.manifest import Manifest
        from edgeinfer.runtime.config import COMPONENT
        from edgeinfer.runtime.models import ModelRepository, ModelSlot, ModelSource, read_sources

        if cfg.models:
            read = read_sources(cfg.models, self.work_dir)
            if isinstance(read[0], str):  # the default: nothing to serve without it
                raise ConfigError(COMPONENT, [("models[0]", read[0])])
            for problem in read:
                if isinstance(problem, str):
                    log.warning("%s: not served (a model component is, once it is there)", problem)
            sources = [source for source in read if not isinstance(source, str)]
        else:
            folder = self.model_dir(cfg)
            manifest = Manifest.load(folder)
            sources = [ModelSource(manifest.name, folder, version=manifest.version)]
        start = time.monotonic()
        engine = self.build_engine_in(cfg, sources[0].folder) if cfg.models else self.build_engine(cfg)
        slots = [ModelSlot(sources[0], engine, load_s=time.monotonic() - start)]
        slots += [ModelSlot(source) for source in sources[1:]]
        return ModelRepository(
            slots,
            build=self._build_slot,
            max_loaded=cfg.max_loaded_models,
            max_waiting=cfg.max_queue_size,
        )

    def _build_slot(self, slot: ModelSlot) -> Engine:
        """A model's engine, built and warmed on the repository's loader thread."""
        return self.build_engine_in(self.cfg, slot.source.folder)

    def build_engine_in(self, cfg: RuntimeConfig, model_dir: str) -> Engine:
        """A warmed-up engine on the model store in `model_dir`."""
        from edgeinfer.model.manifest import Manifest
        from edgeinfer.runtime.engine import Engine

        manifest = Manifest.load(model_dir)
        engine = Engine.create(manifest, cfg, self.work_dir)
        warm = engine.warm_up()
        log.info(
            "warmed up batch sizes 1-%d on %s (%s ms)",
            engine.max_batch_size,
            engine.provider,
            ", ".join(f"b{n}: {ms:.1f}" for n, ms in warm.items()),
        )
        return engine

    def start(self) -> None:
        from edgeinfer.messages import infer_topic
        from edgeinfer.runtime.providers import apply_process_options
        from edgeinfer.runtime.server import InferenceServer

        cfg = self.read_config()
        apply_process_options(cfg)
        self.cfg = cfg
        early = EarlyInbox(limit=max(1024, cfg.max_queue_size))
        early.subscribe(self.bus, infer_topic(self.thing), local=cfg.subscribe_local, iot=cfg.subscribe_iot)
        models = self.new_repository(cfg)
        engine = models.default.engine
        assert engine is not None
        server = self._server = InferenceServer(self.bus, engine, cfg, self.thing, models=models)
        self._wire_placement()
        from edgeinfer.capture.hook import start_capture  # the `capture` node: docs/capture.md

        self.capture = start_capture(
            self._capture_doc(), self.thing, self.work_dir, server.answers.hooks, server.timings.add_capture
        )
        from edgeinfer.runtime.forward import start_forwarding

        self.forward = server.answers.forward = start_forwarding(self.bus, self.thing, self.work_dir)
        server.start(subscribe=False)
        if not server.self_test():
            log.warning("the self-test requests did not come back; starting anyway")
        server.timings.hello()
        gc.collect()
        gc.freeze()  # start-up objects out of the collector's way: shorter pauses while serving
        server.adopt_subscriptions(early.subs)
        replayed = early.attach(server)
        if replayed:
            log.info("serving %d requests that arrived during start-up", replayed)
        self._start_sources(cfg)
        from edgeinfer import config
        from edgeinfer.runtime.config import COMPONENT

        config.subscribe(self.bus, COMPONENT, self.on_update, self.validate)
        self._follow_model_updates()
        self.bus.update_state("RUNNING")
        log.info(
            "RUNNING %.0f ms after process start: %s %s on %s (variant %s)",
            process_age_ms(),
            engine.manifest.name,
            engine.manifest.version,
            engine.provider,
            engine.model_ref.variant,
        )
        if len(models.slots) > 1:
            log.info(
                "serving models %s (default %s; at most %s loaded)",
                ", ".join(models.names()),
                models.default.name,
                cfg.max_loaded_models or "all",
            )

    def _capture_doc(self) -> object:
        doc = self.bus.get_configuration()
        return doc.get("capture") if isinstance(doc, dict) else None

    def _wire_placement(self) -> None:
        """The recipe's `placement` object: the hybrid edge/cloud policy when enabled, else edge-only."""
        from edgeinfer.runtime.placement import create_placement

        policy, offloader = create_placement(self.bus, self.cfg, self.thing, engine=self.server.engine)
        self.server.set_placement(policy, offloader)

    def _rewire_placement(self) -> None:
        """A new policy for a new engine or placement object: the old offloader stops first, its open
        offloads served locally or answered, with the server edge-only meanwhile."""
        from edgeinfer.runtime.placement import EdgeOnly

        old = self.server.offloader
        self.server.set_placement(EdgeOnly(), None)
        if old is not None and hasattr(old, "stop"):
            old.stop()
        self._wire_placement()

    def _start_sources(self, cfg: RuntimeConfig) -> None:
        from edgeinfer.runtime.sources import ServerSink, SourceManager

        sources = SourceManager(
            ServerSink(self.server),
            self.thing,
            record_drop=self.server.timings.record,
            batch_window_s=cfg.source_batch_window_ms / 1000,
            counts=self.server.timings.add_source,
        )
        self.sources = sources  # recorded before the first frame is served
        sources.apply(cfg.frame_sources())

    # ------------------------------------------------------------------------------ live configuration

    def validate(self, proposed: dict[str, Any]) -> str | None:
        """None to accept a proposed configuration, else the reasons (the validity report's message)."""
        from edgeinfer.config import ConfigError

        try:
            cfg = self.read_config(proposed)
        except ConfigError as exc:
            return exc.reasons
        for i, entry in enumerate(cfg.models):
            if entry.dir and not os.path.isfile(os.path.join(entry.dir, "manifest.json")):
                return f"models[{i}].dir {entry.dir!r} holds no manifest.json"
        model_dir = "" if cfg.models else self.model_dir(cfg)
        if model_dir and not os.path.isfile(os.path.join(model_dir, "manifest.json")):
            return f"modelDir {model_dir!r} holds no manifest.json"
        return None

    def on_update(self, key_path: list[str]) -> None:
        # The event names the changed key, not its value: read the whole configuration again. Nucleus
        # lite sends one event per changed leaf; events that arrive while a re-read is still waiting
        # to start are served by that re-read (one that already started is followed by another).
        with self._queue_lock:
            if self._update_queued:
                return
            self._update_queued = True
        threading.Thread(target=self._apply_update, name="edgeinfer-config", daemon=True).start()

    def _apply_update(self) -> None:
        from edgeinfer.config import ConfigError
        from edgeinfer.runtime.config import diff_keys, engine_keys_changed

        with self._lock:
            with self._queue_lock:
                self._update_queued = False
            try:
                cfg = self.read_config()
            except ConfigError as exc:
                log.warning("configuration update ignored, the running one kept: %s", exc)
                return
            except Exception as exc:
                log.warning("configuration not re-read: %s", exc)
                return
            changed = diff_keys(self.cfg, cfg)
            if not changed:
                return
            log.info("configuration changed: %s", ", ".join(sorted(changed)))
            if "models" in changed:
                self._models_changed(self.cfg, cfg)
            engine: Engine | None = None
            if engine_keys_changed(self.cfg, cfg):
                try:
                    engine = self.build_engine(cfg)
                except Exception as exc:
                    log.error("new engine not built, keeping the running one: %s", exc)
            # Recorded before any of it takes effect: whoever sees the new engine (or batching, or
            # source) and then reads `cfg` finds the configuration that made it.
            self.cfg = cfg
            if engine is not None:
                self.server.swap_engine(engine)
                self._rebuild_other_models()
            self.server.models.configure(cfg.max_loaded_models)
            self.server.apply_config(cfg)
            self.server.placement.apply_config(cfg)  # the running policy too (its IPC cap)
            if "cpu" in changed:
                from edgeinfer.runtime.providers import apply_process_options

                apply_process_options(cfg)
            if "capture" in changed:
                log.info("capture's settings are read at start: they take effect at the next one")
            if self.sources is not None:
                self.sources.mux.window_s = cfg.source_batch_window_ms / 1000
                if "source" in changed or "sources" in changed:
                    self.sources.apply(cfg.frame_sources())
            # A new engine means new local model names and a new a·n + b seed for the policy.
            if "placement" in changed or (engine is not None and self.server.offloader is not None):
                self._rewire_placement()

    def _rebuild_other_models(self) -> None:
        """New engine options: each loaded model besides the default on a new engine too (a model
        not loaded takes them at its next load)."""
        models = self.server.models
        for slot in models.slots[1:]:
            if not models.lease_loaded(slot):  # neither evicted nor reloaded under the swap
                continue
            try:
                engine = self._build_slot(slot)
            except Exception as exc:
                log.error("model %s not rebuilt, keeping its running engine: %s", slot.name, exc)
                continue
            else:
                self.server.swap_model(slot, engine)
            finally:
                models.release(slot)

    # ------------------------------------------------------------------------------------ model updates

    def _follow_model_updates(self) -> None:
        """Defer deployments while requests are in flight (where the nucleus serves it) and follow the
        ModelStore's pointer when the model folder came from it."""
        from edgeinfer.runtime.config import COMPONENT
        from edgeinfer.runtime.updates import (
            DeferPolicy,
            StoreWatcher,
            follow_component_updates,
            read_pointer,
            store_pointer,
        )

        if self.cfg.models:
            for entry in self.cfg.models:
                if entry.component:
                    self._watch_component(entry)
        else:
            pointer = store_pointer(self.work_dir)
            current = os.path.normpath(self.args.model_dir) if self.args.model_dir else ""
            if current and read_pointer(pointer) == current:
                self.store_watcher = StoreWatcher(pointer, current, self._store_changed).start()

        def poke() -> None:
            for watcher in [self.store_watcher, *self.model_watchers]:
                if watcher is not None:
                    watcher.poke()

        self.updates = follow_component_updates(self.bus, DeferPolicy(self.server.inflight), poke, COMPONENT)

    def _watch_component(self, entry: ModelEntry) -> None:
        """Follow a model component's `artifacts-path`: its new versions, or its first one when it
        is not there yet."""
        from edgeinfer.runtime.updates import StoreWatcher, store_pointer

        pointer = store_pointer(self.work_dir, entry.component)
        slot = self._slot_of(entry.component)
        current = slot.source.folder if slot is not None else ""
        on_change = functools.partial(self._component_changed, entry)
        self.model_watchers.append(StoreWatcher(pointer, current, on_change).start())

    def _models_changed(self, old: RuntimeConfig, new: RuntimeConfig) -> None:
        """Live, a change of `models` serves the entries added and takes each served one's `pinned`
        and `preload`; what was removed or moved stays as it is until the runtime restarts."""
        if not old.models or not new.models:
            log.warning("models: from one store to several or back takes effect when the runtime restarts")
            return
        before = [(e.dir, e.component) for e in old.models]
        after = [(e.dir, e.component) for e in new.models]
        if [k for k in after if k in before] != before:
            log.warning("models: a model removed or moved is served as it was until the runtime restarts")
        for entry in new.models:
            slot = self._slot_of(entry.component) if entry.component else self._slot_in(entry.dir)
            if slot is not None:
                slot.source.pinned, slot.source.preload = entry.pinned, entry.preload
            elif (entry.dir, entry.component) not in before:
                if entry.component:
                    self._watch_component(entry)  # served once its artifacts-path names a store
                else:
                    self._serve_new(entry, entry.dir)

    def _serve_new(self, entry: ModelEntry, folder: str) -> None:
        """Serve one more model from `folder` (loaded when first asked for, or now when preloaded)."""
        from edgeinfer.runtime.models import ModelSource, read_source

        source = read_source(entry, folder, self.server.models.names())
        if not isinstance(source, ModelSource):
            log.error("%s: not served", source)
            return
        try:
            slot = self.server.add_model(source)
        except ValueError as exc:
            log.error("model store %s: not served: %s", folder, exc)
            return
        if entry.preload or entry.pinned:
            self.server.models.load(slot)
        log.info("model %s %s served from now on (%s)", slot.name, source.version, folder)

    def _slot_in(self, folder: str) -> ModelSlot | None:
        return next(
            (s for s in self.server.models.slots if s.source.folder == folder and not s.source.component),
            None,
        )

    def _slot_of(self, component: str) -> ModelSlot | None:
        return next((s for s in self.server.models.slots if s.source.component == component), None)

    def _component_changed(self, entry: ModelEntry, folder: str) -> None:
        """A model component's `artifacts-path` names a new folder: its new version, or the model
        itself when it was deployed after the runtime started (served from now on)."""
        slot = self._slot_of(entry.component)
        if slot is not None:
            self._model_changed(slot, folder)
        else:  # the model itself is new (the repository's own lock makes adding it safe)
            self._serve_new(entry, folder)

    def _model_changed(self, slot: ModelSlot, folder: str) -> None:
        """A new version of one model component (`models`): that model alone on a new engine, built
        and warmed off the hot path; one not loaded now loads the new version when next asked for."""
        with self._lock:
            old = slot.source.folder
            # The lease keeps it loaded until the swap; not loaded (or loading), its next load reads
            # the new folder.
            if not self.server.models.lease_loaded(slot, folder):
                log.info("model %s: store now at %s (loaded when next asked for)", slot.name, folder)
                return
            try:
                engine = self.build_engine_in(self.cfg, folder)
            except Exception as exc:
                log.error(
                    "model store at %s not loaded, still serving %s from %s: %s", folder, slot.name, old, exc
                )
                self.server.models.release(slot)
                return
            slot.source.folder = folder  # recorded before the swap, as for the one store
            slot.source.version = engine.manifest.version
            try:
                self.server.swap_model(slot, engine)
            finally:
                self.server.models.release(slot)
            if slot is self.server.models.default and self.server.offloader is not None:
                self._rewire_placement()
            log.info("model %s updated: %s -> %s (%s)", slot.name, old, engine.manifest.version, folder)

    def _store_changed(self, folder: str) -> None:
        """A new ModelStore artifact folder: build and warm its engine, then swap it in; batches
        running now finish on the old engine, released with them."""
        with self._lock:
            if self.cfg.model_dir:
                log.info(
                    "model store now at %s; modelDir %s is configured and kept", folder, self.cfg.model_dir
                )
                return
            old = self.server.engine.manifest
            try:
                engine = self.build_engine_in(self.cfg, folder)
            except Exception as exc:
                log.error(
                    "model store at %s not loaded, still serving %s %s: %s",
                    folder,
                    old.name,
                    old.version,
                    exc,
                )
                return
            # The folder is recorded before the swap: whoever sees the new engine finds its folder.
            self.args.model_dir = folder
            self.server.swap_engine(engine)
            if self.server.offloader is not None:  # new local model names and service-time seed
                self._rewire_placement()
            log.info(
                "model store updated: %s %s -> %s %s (%s)",
                old.name,
                old.version,
                engine.manifest.name,
                engine.manifest.version,
                folder,
            )

    # ------------------------------------------------------------------------------------------- stop

    def wait(self) -> None:
        self._stop.wait()

    def stop(self) -> None:
        if self.store_watcher is not None:
            self.store_watcher.stop()
        for watcher in self.model_watchers:
            watcher.stop()
        if self.updates is not None:
            self.updates.close()
        if self.sources is not None:
            self.sources.stop()
        if self._server is not None:
            offloader = self._server.offloader
            if offloader is not None and hasattr(offloader, "stop"):
                offloader.stop()  # open offloads are served here while the server still runs
            self._server.stop()
        if self.capture is not None:  # after the server: what it answers while stopping is captured
            self.capture.stop()  # what was chosen is spooled; the spool keeps what is not uploaded
        if self.forward is not None:  # after the server too: what it answered waits in the outbox
            self.forward.stop()
        self._stop.set()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edgeinfer.runtime", description=__doc__)
    parser.add_argument("--model-dir", default="", help="the ModelStore artifacts folder (manifest.json)")
    parser.add_argument("--work-dir", default="", help="the component's work folder (TensorRT caches)")
    parser.add_argument("--thing", default="", help="thing name (default: $AWS_IOT_THING_NAME)")
    parser.add_argument(
        "-o",
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a configuration key over what the nucleus holds, e.g. maxBatchSize=4 or "
        "tensorrt.trtFp16Enable=false (local runs; repeatable)",
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stdout,
    )
    from edgeinfer.config import parse_overrides
    from edgeinfer.errors import EdgeinferError
    from edgeinfer.transport import TransportError
    from edgeinfer.transport.ipc import GreengrassIpcBus

    try:
        parse_overrides(args.option)  # a malformed -o fails before the nucleus is asked anything
        bus = GreengrassIpcBus.connect()
    except (EdgeinferError, TransportError) as exc:
        print(f"edgeinfer.runtime: error: {exc}", file=sys.stderr)
        return 2
    component = Component(bus, RuntimeArgs.from_namespace(args))

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        component._stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        component.start()
    except EdgeinferError as exc:  # a configuration it cannot use: one line
        log.error("%s", exc)
        _errored(bus)
        return 1
    except Exception as exc:
        log.exception("the runtime could not start: %s", exc)
        _errored(bus)
        return 1
    component.wait()
    component.stop()
    bus.close()
    return 0


def _errored(bus: Bus) -> None:
    try:
        bus.update_state("ERRORED")
    except Exception:
        log.debug("UpdateState ERRORED failed", exc_info=True)
    bus.close()
