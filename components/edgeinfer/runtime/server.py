"""The request pipeline: read → admit → decide → serve (decode pool → dynamic batcher → engine) → answer.

`handle_message` (the transport's callback, never raises) reads the message (`runtime.inbound`: the
request, where it is answered, its deadline and defaults, or a refusal), admits it (a model served
here, an allowed image path, a deadline not already passed upstream), asks the placement policy
(`runtime.placement`: edge, cloud or reject) and serves it. The request's `model` picks one of the
models served (`runtime.models`: each its own engine, batcher and engine threads; everything below
happens per model); one that is not loaded waits for its load, off this thread, or is refused. A
request naming a pipeline (`runtime.pipeline`) is served on its detector, then its crops on its
classifier, and answered once with both.
Every answer, accepted or refused, goes through `runtime.answer`: exactly once, late and too-large
substitutions, the format, publishing and the timing record.

Threads: `decode_threads` workers decode while an engine thread runs the previous batch; one reply
thread answers, so the engine never waits on the bus. A request that finds the runtime idle is
decoded, run and answered on the transport's thread (`runInlineWhenIdle`): there is nothing to
overlap, so a hand-off only costs. Under load the CPU runs up to `lanes` batches at once, one engine
thread and one single-thread ORT run each (see `Engine.run(lane=True)`).

Deadlines count from when the request was sent, when it says: a request is answered DEADLINE_EXCEEDED
on arrival when its budget was spent upstream, at admission when the full batches ahead take longer
than it has left (`admitByDeadline`), in the queue when its batch would end too late, and in place
of a result ready after it. What is answered before decode costs no base64 decode (the image stays
encoded until the request is taken on). How late requests arrive reaches the placement policy: the
sign of a backlog in front of the runtime that its own queue does not show.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np

from edgeinfer.messages import (
    ErrorCode,
    Latency,
    MessageError,
    Request,
    Result,
    error_result,
    infer_topic,
    parse_request,
    result_topic,
)
from edgeinfer.runtime.answer import AnswerHook, Answers, Job, Stats
from edgeinfer.runtime.batcher import BatchPoll, DynamicBatcher, Queued
from edgeinfer.runtime.config import RuntimeConfig
from edgeinfer.runtime.decode import (
    DecodeError,
    Letterbox,
    decode_image,
    decode_letterboxed,
    warm_up_decoder,
)
from edgeinfer.runtime.engine import Engine
from edgeinfer.runtime.image_url import ImageFetcher
from edgeinfer.runtime.inbound import Inbound, Refusal, ReplyTarget, read_message
from edgeinfer.runtime.models import ModelRepository, ModelSlot, ModelSource, RepositoryHooks, Waiting
from edgeinfer.runtime.pipeline import (
    Assembly,
    CropJob,
    Pipeline,
    PipelineJob,
    Route,
    prepare_frame,
    read_pipelines,
    route,
    unknown_model,
)
from edgeinfer.runtime.placement import (
    Decision,
    EdgeOnly,
    Offloader,
    PlacementContext,
    PlacementPolicy,
)
from edgeinfer.runtime.timings import TimingPublisher
from edgeinfer.runtime.updates import InFlight
from edgeinfer.transport import (
    Bus,
    Message,
    Subscription,
    Target,
)

log = logging.getLogger(__name__)

# A message handled sooner than this after the previous one returned was queued behind it: the
# transport's own decoding of the next message falls inside the gap, and a closed loop's next request
# comes later than this (two IPC hops and the client).
BACKLOG_GAP_S = 0.001


def _lower_priority(nice: int) -> None:
    """Run on a new worker thread: raise its niceness by `nice` (Linux schedules threads one by one;
    raising it needs no privilege)."""
    if nice > 0 and hasattr(os, "setpriority"):
        try:
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + nice)
        except OSError as exc:
            log.debug("decode worker priority unchanged: %s", exc)


class InferenceServer:
    def __init__(
        self,
        bus: Bus,
        engine: Engine,
        cfg: RuntimeConfig,
        thing: str,
        *,
        models: ModelRepository | None = None,
        placement: PlacementPolicy | None = None,
        offloader: Offloader | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """`engine`: the default model's (with `models`, the first slot's)."""
        self.bus = bus
        self.cfg = cfg
        self.thing = thing
        self.placement: PlacementPolicy = placement or EdgeOnly()
        self.offloader = offloader
        self.clock = clock
        self.wall = wall
        if models is None:
            models = ModelRepository([ModelSlot(ModelSource(engine.manifest.name, ""), engine)], clock=clock)
        elif models.default.engine is not engine:
            raise ValueError("`engine` is the default model's")
        self.models = models
        self.pipelines = self._read_pipelines(cfg)
        for slot in models.slots:  # each model queues and batches on its own
            slot.batcher = self._new_batcher(cfg, slot.engine)
        self.timings = TimingPublisher(
            bus,
            thing,
            max_records=cfg.timings.max_records,
            flush_interval_ms=cfg.timings.flush_interval_ms,
            enabled=cfg.timings.enabled,
            clock=clock,
            wall=wall,
        )
        self.stats = Stats()
        self.inflight = InFlight()
        self._stats_lock = threading.Lock()
        self.answers = Answers(
            bus,
            thing,
            timings=self.timings,
            inflight=self.inflight,
            stats=self.stats,
            stats_lock=self._stats_lock,
            queue_depth=lambda: sum(s.batcher.depth for s in self.models.slots),
            result_format=cfg.result_format,
            max_ipc_bytes=cfg.max_ipc_message_bytes,
            clock=clock,
            wall=wall,
        )
        self.answers.hooks.append(_PlacementFeedback(self))
        self._decode_pool = self._new_decode_pool(cfg)
        self.image_fetcher = ImageFetcher()  # a request's image_url, read on a decode worker
        self._replies: queue.SimpleQueue[tuple[Job, Result] | None] = queue.SimpleQueue()
        self._subs: list[Subscription] = []
        self._threads: list[threading.Thread] = []
        self._running = False
        self._handled_at = float("-inf")  # when the transport's last handle_message returned

    @property
    def engine(self) -> Engine:
        """The default model's engine (always loaded)."""
        engine = self.models.default.engine
        assert engine is not None
        return engine

    @property
    def batcher(self) -> DynamicBatcher[Job]:
        """The default model's batcher."""
        return self.models.default.batcher

    @property
    def _engine_ms(self) -> float:
        """The default model's recent batch time (`ModelSlot.engine_ms`)."""
        return self.models.default.engine_ms

    @_engine_ms.setter
    def _engine_ms(self, ms: float) -> None:
        self.models.default.engine_ms = ms

    def _new_batcher(self, cfg: RuntimeConfig, engine: Engine | None) -> DynamicBatcher[Job]:
        return DynamicBatcher(
            cfg.max_batch_size,
            cfg.max_queue_delay_us,
            cfg.max_queue_size,
            clock=self.clock,
            lanes=engine.lanes if engine is not None and self.offloader is None else 1,
            full_session_max_contention=cfg.full_session_max_contention,
            lane_batch_size=cfg.lane_max_batch_size,
        )

    # --------------------------------------------------------------------------------------- control

    def start(self, *, subscribe: bool = True) -> None:
        """Start the threads and (unless the caller already holds them, see `adopt_subscriptions`)
        subscribe to the request topics."""
        warm_up_decoder(self.engine.input_size, self.engine.detail)
        for _ in range(self.cfg.decode_threads):  # start the pool's threads now, not on the first request
            self._decode_pool.submit(warm_up_decoder, self.engine.input_size, self.engine.detail)
        self._running = True
        reply = threading.Thread(target=self._reply_loop, name="edgeinfer-reply", daemon=True)
        reply.start()
        self._threads.append(reply)
        for slot in self.models.loaded():
            self._add_engine_threads(slot)
        self.models.start(_ModelEvents(self))
        self.timings.start()
        topic = infer_topic(self.thing)
        if subscribe:
            self._subscribe()
        log.info(
            "serving %s on %s (max batch %d, queue delay %d us, queue %d)",
            topic,
            " and ".join(
                t for t, on in (("local", self.cfg.subscribe_local), ("iot", self.cfg.subscribe_iot)) if on
            ),
            self.cfg.max_batch_size,
            self.cfg.max_queue_delay_us,
            self.cfg.max_queue_size,
        )

    def _subscribe(self) -> None:
        topic = infer_topic(self.thing)
        if self.cfg.subscribe_local:
            self._subs.append(self.bus.subscribe(topic, self.handle_message, target="local", inline=True))
        if self.cfg.subscribe_iot:
            self._subs.append(
                self.bus.subscribe(topic, self.handle_message, target="iot", qos=1, inline=True)
            )

    def adopt_subscriptions(self, subs: list[Subscription]) -> None:
        """Subscriptions the caller made (that deliver to `handle_message`) become the server's own:
        closed at stop, replaced when subscribeLocal/subscribeIot change."""
        self._subs.extend(subs)

    def _unsubscribe(self) -> None:
        for sub in self._subs:
            try:
                sub.close()
            except Exception:  # closing is best effort
                log.debug("closing a subscription failed", exc_info=True)
        self._subs.clear()

    def _add_engine_threads(self, slot: ModelSlot) -> None:
        """One engine thread per lane of the model's engine; back when each has warmed itself up
        (see `Engine.thread_bound`). They end when the model is unloaded."""
        engine = slot.engine
        if engine is None:
            return
        started = []
        slot.threads = [t for t in slot.threads if t.is_alive()]
        self._threads[1:] = [t for t in self._threads[1:] if t.is_alive()]  # [0]: the reply thread
        index = self.models.slots.index(slot)
        while len(slot.threads) < max(1, engine.lanes):
            ready = threading.Event()
            n = len(slot.threads) + 1
            t = threading.Thread(
                target=self._engine_loop,
                args=(slot, ready),
                name=f"edgeinfer-engine-{n}" if index == 0 else f"edgeinfer-engine-{slot.name}-{n}",
                daemon=True,
            )
            t.start()
            slot.threads.append(t)
            self._threads.append(t)
            started.append(ready)
        for ready in started:
            if not ready.wait(timeout=30):
                log.warning("an engine thread did not warm up in 30 s; serving anyway")

    def stop(self) -> None:
        self._unsubscribe()
        for slot, waited in self.models.stop():
            for w in waited:
                self._fail(w.job, ErrorCode.INTERNAL, "the runtime is stopping", slot)
        self._decode_pool.shutdown(wait=True)
        self._running = False
        for slot in self.models.slots:
            for t in slot.threads:
                t.join(timeout=10)  # the engines: running batches finish and are answered
            slot.threads.clear()
            for item in slot.batcher.close():
                self._fail(item.item, ErrorCode.INTERNAL, "the runtime is stopping", slot)
        self._replies.put(None)
        if self._threads:
            self._threads[0].join(timeout=10)
        self._threads.clear()
        self.timings.stop()

    @staticmethod
    def _new_decode_pool(cfg: RuntimeConfig) -> concurrent.futures.ThreadPoolExecutor:
        return concurrent.futures.ThreadPoolExecutor(
            cfg.decode_threads,
            thread_name_prefix="edgeinfer-decode",
            initializer=_lower_priority,
            initargs=(cfg.decode_nice,),
        )

    def set_placement(self, placement: PlacementPolicy, offloader: Offloader | None = None) -> None:
        self.placement = placement
        self.offloader = offloader
        # The offload policy's service-time model and utilisation see one batch at a time.
        for slot in self.models.slots:
            engine = slot.engine
            slot.batcher.configure(lanes=1 if offloader is not None or engine is None else engine.lanes)

    def apply_config(self, cfg: RuntimeConfig) -> None:
        """Apply the keys that are safe live (batching, limits, topics, timings). The engine keys are
        the caller's business (`swap_engine`)."""
        old, self.cfg = self.cfg, cfg
        if (old.subscribe_local, old.subscribe_iot) != (cfg.subscribe_local, cfg.subscribe_iot):
            self._unsubscribe()
            self._subscribe()
        if (old.decode_threads, old.decode_nice) != (cfg.decode_threads, cfg.decode_nice):
            pool, self._decode_pool = self._decode_pool, self._new_decode_pool(cfg)
            pool.shutdown(wait=False)  # what it holds still runs and is answered
        for slot in self.models.slots:
            engine = slot.engine
            slot.batcher.configure(
                max_batch_size=cfg.max_batch_size
                if engine is None
                else min(cfg.max_batch_size, engine.max_batch_size),
                max_queue_delay_us=cfg.max_queue_delay_us,
                max_queue_size=cfg.max_queue_size,
                full_session_max_contention=cfg.full_session_max_contention,
                lane_batch_size=cfg.lane_max_batch_size,
            )
        self.models.max_waiting = cfg.max_queue_size
        if cfg.pipelines != old.pipelines:
            self.pipelines = self._read_pipelines(cfg)
        self.timings.max_records = cfg.timings.max_records
        self.timings.flush_interval_ms = cfg.timings.flush_interval_ms
        self.timings.enabled = cfg.timings.enabled
        self.answers.result_format = cfg.result_format
        self.answers.max_ipc_bytes = cfg.max_ipc_message_bytes

    def _read_pipelines(self, cfg: RuntimeConfig) -> dict[str, Pipeline]:
        """The configured pipelines; one that cannot run on the models served now is said so in the
        log (its requests are answered INTERNAL with the reason until it can)."""
        pipelines = read_pipelines(cfg.pipelines)
        for pipeline in pipelines.values():
            path = route(pipeline, self.models)
            if isinstance(path, str):
                log.warning("%s: its requests are refused until it is", path)
            if self.models.get(pipeline.name) is not None:
                log.warning("pipeline %r: a model has its name, and serves requests for it", pipeline.name)
        return pipelines

    def add_model(self, source: ModelSource) -> ModelSlot:
        """Serve a model found after the start (a model component deployed later), loaded when first
        asked for. ValueError when its name is served already."""
        slot = ModelSlot(source)
        slot.batcher = self._new_batcher(self.cfg, None)
        self.models.add(slot)
        return slot

    def swap_engine(self, engine: Engine) -> None:
        """Put a new, warmed-up engine in place of the default model's (see `swap_model`)."""
        self.swap_model(self.models.default, engine)

    def swap_model(self, slot: ModelSlot, engine: Engine) -> None:
        """Put a new, warmed-up engine in place of `slot`'s; batches running now finish on the old
        one. A model not loaded now takes it as loaded (its store's new version, say)."""
        with slot.engine_lock:
            slot.engine = engine
        self._engine_ready(slot)

    def _start_failed(self, slot: ModelSlot, error: str) -> None:
        """A model whose start after its load failed is marked as a load that failed (the repository
        answers its requests INTERNAL "model X did not load: `error`" at once, and loads it again
        after its retry time). What reached its batcher in between is answered so too."""
        for item in self.models.mark_failed(slot, error):  # its engine threads see it unloaded
            self._fail(item.item, ErrorCode.INTERNAL, self._refused_why(slot), slot)

    def _refused_why(self, slot: ModelSlot) -> str:
        """Why `slot`'s closed batcher refused a request: the runtime is stopping, or its model's
        start failed (said as the repository says it, see `ModelRepository.mark_failed`)."""
        error = slot.load_error
        if not self._running or error is None:
            return "the runtime is stopping"
        return f"model {slot.name} did not load: {error[1]}"

    def _not_admitted(self, job: Job, slot: ModelSlot, batcher: DynamicBatcher[Job]) -> None:
        """`batcher.admit()` refused `job`: its queue is full, or it is closed."""
        if batcher.closed:
            self._fail(job, ErrorCode.INTERNAL, self._refused_why(slot), slot)
        else:
            why = f"the queue is full ({batcher.max_queue_size} requests)"
            self._fail(job, ErrorCode.OVERLOADED, why, slot)

    def _engine_ready(self, slot: ModelSlot) -> None:
        """`slot.engine` is new: its threads and its batcher's sizes."""
        engine = slot.engine
        if engine is None:
            return
        if self._running:
            self._add_engine_threads(slot)
        slot.batcher.configure(
            max_batch_size=min(self.cfg.max_batch_size, engine.max_batch_size),
            lanes=engine.lanes if self.offloader is None else 1,
        )

    # ------------------------------------------------------------------------------------- requests

    def handle_message(self, msg: Message) -> None:
        """Transport callback: read, admit, decide, serve (`_handle`). Never raises. With
        `runInlineWhenIdle`, a request that finds the runtime idle is run to completion here (the
        transport's thread then reads nothing else for one inference; under load it only admits)."""
        try:
            self._handle(msg)
        except Exception:  # the last line of defence: still one answer, and keep serving
            log.exception("unexpected error handling a message on %s", msg.topic)
            where = ReplyTarget(result_topic(self.thing), msg.target)
            self.answers.refuse(Refusal(ErrorCode.INTERNAL, "internal error", None, where), self.clock())
        finally:
            self._handled_at = self.clock()

    def _handle(self, msg: Message) -> None:
        """Read → admit → decide → serve."""
        arrived = self.clock()
        with self._stats_lock:
            self.stats.received += 1
        read = read_message(msg, self.cfg, self.thing)
        if isinstance(read, Refusal):
            self.answers.refuse(read, arrived)
            return
        admitted = self._admit(read, arrived)
        if admitted is None:
            return
        job, slot = admitted
        if isinstance(job, PipelineJob):
            self._enter_pipeline(job)
        else:
            self._serve_model(job, slot)

    def _serve_model(self, job: Job, slot: ModelSlot, *, may_inline: bool = True) -> None:
        """Serve `job` on `slot`'s model once it holds a lease on it (it may wait for its load)."""
        taken = self.models.acquire(slot, job)
        if taken.code is not None:
            self._fail(job, taken.code, taken.why, slot)
            return
        if not taken.ready:
            return  # it waits for its model's load: the loader thread resumes or answers it
        try:
            decision = self._place(job, slot)
            if decision is not None:
                self._serve(job, slot, decision, may_inline=may_inline)
        finally:
            self.models.release(slot)  # admitted to its batcher, or answered: it may be unloaded

    def _enter_pipeline(self, job: PipelineJob, *, may_inline: bool = True) -> None:
        """A pipeline's request leases its classifier first (it may wait for its load), then is
        served on its detector."""
        classifier = job.route.classifier
        taken = self.models.acquire(classifier, job)
        if taken.code is not None:
            self._fail(job, taken.code, taken.why, classifier)
        elif taken.ready:
            self._pipeline_leased(job, may_inline=may_inline)
        # else it waits for the classifier's load: `_resume` comes back with it

    def _pipeline_leased(self, job: PipelineJob, *, may_inline: bool) -> None:
        classifier = job.route.classifier
        job.leased = True
        # The lease ends with the job's one answer, whichever path gives it: its crops reach the
        # classifier's batcher only after the detector, and the model must not be evicted meanwhile.
        job.on_done = lambda: self.models.release(classifier)
        self._serve_model(job, job.route.detector, may_inline=may_inline)

    def _resume(self, job: Job, slot: ModelSlot) -> None:
        """A request that waited for its model's load (on the loader thread: queued, never run here)."""
        if isinstance(job, PipelineJob) and not job.leased:  # its classifier has loaded
            if self.models.lease_loaded(slot):
                self._pipeline_leased(job, may_inline=False)
            else:
                self._fail(job, ErrorCode.OVERLOADED, f"model {slot.name} is loading", slot)
            return
        decision = self._place(job, slot)
        if decision is not None:
            self._serve(job, slot, decision, may_inline=False)

    def _admit(self, read: Inbound, arrived: float) -> tuple[Job, ModelSlot] | None:
        """The request as a job in flight with the model it asks for, or None when it was answered
        here: a model this runtime does not serve, a path outside `imageFolders`, a deadline that
        passed before it arrived."""
        req = read.request
        slot = self.models.get(req.model)
        pipeline = self.pipelines.get(req.model or "") if slot is None else None
        path = route(pipeline, self.models) if pipeline is not None else None
        if isinstance(path, str):
            self.answers.refuse(Refusal(ErrorCode.INTERNAL, path, req.id, read.reply), arrived)
            return None
        if path is not None:
            slot = path.detector
        elif slot is None and self.offloader is not None:
            slot = self.models.default  # the placement policy sends it to the cloud
        why = (
            unknown_model(req.model, self.models.names(), list(self.pipelines))
            if slot is None
            else self._path_refusal(req)
        )
        if slot is None or why is not None:
            self.answers.refuse(Refusal(ErrorCode.BAD_REQUEST, why or "", req.id, read.reply), arrived)
            return None
        job = self._new_job(read, arrived, path)
        self.inflight.enter()
        if job.deadline is not None and job.deadline <= arrived:
            with self._stats_lock:
                self.stats.expired_on_arrival += 1
            waited_ms = (arrived - job.deadline) * 1000
            self._fail(
                job,
                ErrorCode.DEADLINE_EXCEEDED,
                f"the deadline passed {waited_ms:.0f} ms before it arrived",
                slot,
            )
            # What placement never decides on is the plainest sign of a backlog in front of it.
            with _policy_guard("on_late_arrival"):
                self.placement.on_late_arrival(self._age_ms(req), -waited_ms)
            return None
        return job, slot

    def _new_job(self, read: Inbound, arrived: float, path: Route | None) -> Job:
        """The request as a job in flight (for a pipeline, one that knows its two models)."""
        req, deadline = read.request, read.deadline(arrived, self.wall())
        if path is not None:
            return PipelineJob(req, read.reply, arrived, deadline, head=read.head, counted=True, route=path)
        return Job(req, read.reply, arrived, deadline, head=read.head, counted=True)

    def _path_refusal(self, req: Request) -> str | None:
        if req.image_path is not None and not self._path_allowed(req.image_path):
            return "'image_path' is not inside a folder listed in imageFolders"
        return None

    def _place(self, job: Job, slot: ModelSlot) -> Decision | None:
        """The placement policy's decision, or None when the job was answered (a bad image)."""
        if job.head is not None and not isinstance(self.placement, EdgeOnly):
            # A policy weighs (and an offload carries) the image: decode it now. Edge-only, it is
            # decoded after admission, with the JPEG (a full queue answers OVERLOADED without it).
            head, job.head = job.head, None
            try:
                head.decode()
            except MessageError as exc:
                self._fail(job, exc.code, exc.message, slot)
                return None
        return self._decide(job, slot)

    def _serve(self, job: Job, slot: ModelSlot, decision: Decision, *, may_inline: bool = True) -> None:
        if decision.where == "reject":
            why = decision.reason or "refused by placement"
            self._fail(job, decision.code or ErrorCode.OVERLOADED, why, slot)
            return
        if decision.where == "cloud" and self.offloader is not None:
            self._offload(job, slot, self.offloader)
            return
        # Run to completion on this (the transport's) thread when nothing else is in flight and the
        # message did not follow the previous one at once: a hand-off to a decode worker has its cost
        # and there is nothing to overlap with. A message right on the heels of the last one was
        # waiting in the socket while this thread was busy: load, so pipeline it. So is any request
        # while recent arrivals found work in flight (`batcher.quiet`): near capacity the next
        # arrival would wait in the socket for the whole inline run.
        inline = (
            may_inline
            and job.request.image_url is None  # a fetch never holds the transport's thread
            and self.cfg.run_inline_when_idle
            and job.arrived - self._handled_at >= BACKLOG_GAP_S
            and slot.batcher.quiet
        )
        self._serve_local(job, slot, inline=inline)

    def _offload(self, job: Job, slot: ModelSlot, offloader: Offloader) -> None:
        with self._stats_lock:
            self.stats.offloaded += 1
        ctx = dataclasses.replace(
            self._context(job, slot), local=lambda: self._serve_local(job, slot, fallback=True)
        )
        try:
            offloader.offload(job.request, ctx, lambda result: self._reply_offloaded(job, result))
        except Exception as exc:
            log.warning("offload of %s failed, answering with an error: %s", job.request.id, exc)
            self._fail(job, ErrorCode.INTERNAL, f"offload failed: {exc}", slot)

    def _serve_local(
        self, job: Job, slot: ModelSlot, *, fallback: bool = False, inline: bool = False
    ) -> None:
        """Admit and decode on the edge (`inline`: on this thread). `fallback`: an offload came back
        late or failed — served here on what is left of its deadline."""
        if job.answered:
            return
        if fallback and job.deadline is not None and job.deadline <= self.clock():
            # Computed now it could only be answered DEADLINE_EXCEEDED (never `ok` late): at once.
            late_ms = (self.clock() - job.deadline) * 1000
            why = f"the deadline had passed {late_ms:.0f} ms before the offload was given up"
            self._fail(job, ErrorCode.DEADLINE_EXCEEDED, why, slot)
            return
        engine = slot.engine
        if engine is None:  # a fallback after its model was unloaded
            self._fail(job, ErrorCode.OVERLOADED, f"model {slot.name} is not loaded", slot)
            return
        if job.deadline is not None and self.cfg.admit_by_deadline and slot.engine_ms > 0:
            floor_s = slot.batcher.wait_floor_s(slot.engine_ms / 1000)
            left_s = job.deadline - self.clock()
            if floor_s > 0 and left_s <= floor_s:
                # Its deadline counts from its sending: time spent upstream is spent here too.
                ahead_ms = 1000 * floor_s
                why = f"{1000 * left_s:.0f} ms left, and the batches ahead take at least {ahead_ms:.0f} ms"
                self._fail(job, ErrorCode.DEADLINE_EXCEEDED, why, slot)
                return
        batcher = slot.batcher
        if not batcher.admit():
            self._not_admitted(job, slot, batcher)
            return
        if inline:
            # Decoded here; run here too, unless the provider is bound to the engine threads.
            self._decode(job, slot, alone=not engine.thread_bound)
            return
        try:
            self._decode_pool.submit(self._decode, job, slot)
        except RuntimeError:  # pool shut down: we are stopping
            slot.batcher.release()
            self._fail(job, ErrorCode.INTERNAL, "the runtime is stopping", slot)

    def self_test(self, n: int = 2, timeout: float = 30.0) -> bool:
        """Push `n` synthetic 640×480 JPEG requests through parse → decode → batcher → engine → reply,
        discarding the results, so every thread and code path is warm before RUNNING."""
        import cv2

        img = np.zeros((480, 640, 3), dtype=np.uint8)
        img[:, :, 0] = np.arange(640, dtype=np.uint16)[None, :] * 255 // 640
        ok, buf = cv2.imencode(".jpg", img)
        if not ok:
            return False
        left = threading.Semaphore(0)
        for i in range(n):
            payload = Request(f"self-test-{i}", image=bytes(buf)).to_json()
            req = parse_request(payload, max_bytes=self.cfg.max_payload_bytes)
            job = Job(req, ReplyTarget("", "local"), self.clock(), discard=True, on_done=left.release)
            if not self.batcher.admit():  # the default model's
                return False
            self._decode_pool.submit(self._decode, job, self.models.default)
        return all(left.acquire(timeout=timeout) for _ in range(n))

    def submit_frame(
        self,
        frame_id: str,
        image: np.ndarray,
        *,
        source: str,
        topic: str,
        target: Target,
        top_k: int,
        on_done: Callable[[], None] | None = None,
        geometry: Letterbox | None = None,
        model: str = "",
    ) -> bool:
        """A decoded frame from a source joins the queue of `model` (empty: the default's). False when
        the queue is full or the model is not loaded now. `geometry`: a detector's letterboxed frame,
        so its boxes come back in the frame's pixels. For a pipeline, the frame is its detector's
        (`frame_slot`), letterboxed."""
        pipeline = self.pipelines.get(model) if model and self.models.get(model) is None else None
        if pipeline is not None:
            req = Request(id=frame_id, top_k=top_k, model=model)
            reply = ReplyTarget(topic, target)
            path = route(pipeline, self.models)
            return self._submit_pipeline_frame(
                req, image, geometry, reply, path, source=source, on_done=on_done
            )
        slot = self.models.get(model or None)
        if slot is None or not self.models.lease_for_frame(slot):
            return False
        req = Request(
            id=frame_id,
            top_k=top_k,
            result_format="dlr" if self.cfg.result_format == "dlr" else "edgeinfer",
            model=slot.name if slot is not self.models.default else None,
        )
        now = self.clock()
        job = Job(
            req,
            ReplyTarget(topic, target),
            now,
            image=image,
            geometry=geometry,
            decode_start=now,
            decode_end=now,
            source=source,
            on_done=on_done,
        )
        try:
            return slot.batcher.put(job, None, admitted=False)
        finally:
            self.models.release(slot)  # queued: its batch runs on the engine it was admitted to

    def frame_slot(self, model: str) -> ModelSlot | None:
        """The model whose input a source's frames for `model` are made as: the model's own, or a
        pipeline's detector's; None when neither is served."""
        slot = self.models.get(model or None)
        pipeline = self.pipelines.get(model) if slot is None else None
        return self.models.get(pipeline.entry.detector) if pipeline is not None else slot

    def _submit_pipeline_frame(
        self,
        req: Request,
        image: np.ndarray,
        geometry: Letterbox | None,
        reply: ReplyTarget,
        path: Route | str,
        *,
        source: str,
        on_done: Callable[[], None] | None,
    ) -> bool:
        """A source's frame for a pipeline joins its detector's queue, its classifier leased until it
        is answered. False (the source counts the frame dropped) when either model is not loaded now
        (its load is asked for), the queue is full, or the pipeline cannot run here (logged). Its
        crops are cut from the letterboxed frame: a source keeps no larger copy."""
        if isinstance(path, str) or geometry is None:
            log.warning("source %s: %s", source, path if isinstance(path, str) else "frame not letterboxed")
            return False
        leased = []
        for slot in (path.classifier, path.detector):
            if not self.models.lease_for_frame(slot):
                break
            leased.append(slot)
        queued = False
        try:
            if len(leased) == 2:
                now = self.clock()
                job = PipelineJob(
                    req,
                    reply,
                    now,
                    image=image,
                    geometry=geometry,
                    decode_start=now,
                    decode_end=now,
                    source=source,
                    on_done=_then(lambda: self.models.release(path.classifier), on_done),
                    route=path,
                    leased=True,
                )
                queued = path.detector.batcher.put(job, None, admitted=False)
        finally:
            for slot in leased[1:] if queued else leased:  # a queued frame keeps its classifier's
                self.models.release(slot)
        return queued

    # ------------------------------------------------------------------------------------ pipeline

    def _decode(self, job: Job, slot: ModelSlot, *, alone: bool = False) -> None:
        """Decode on this thread for `slot`'s model, queue, and run the batch here if a lane is free
        (`alone`: the request arrived at an idle runtime and may have every core)."""
        batcher = slot.batcher
        try:
            job.decode_start = self.clock()
            if job.deadline is not None and job.decode_start >= job.deadline:
                batcher.release()
                self._fail(job, ErrorCode.DEADLINE_EXCEEDED, "deadline passed before decode", slot)
                return
            if job.head is not None:
                head, job.head = job.head, None
                head.decode()  # its base64 (MessageError below)
            data = job.request.image
            if data is None and job.request.image_url is not None:
                data = self.image_fetcher.fetch(job.request.image_url, self.cfg.max_payload_bytes)
            elif data is None:
                data = self._read_path(job.request.image_path or "")
            engine = slot.engine
            if engine is None:  # admitted to its batcher, it is not unloaded: its start failed since
                raise MessageError(ErrorCode.INTERNAL, self._refused_why(slot))
            limits = {
                "max_pixels": self.cfg.max_image_pixels,
                "min_side": self.cfg.min_image_side,
                "detail": engine.detail,
            }
            if isinstance(job, PipelineJob):  # the full image is kept for its crops
                job.frame, job.image, job.geometry = prepare_frame(
                    data,
                    engine,
                    job.route.pipeline,
                    max_pixels=self.cfg.max_image_pixels,
                    min_side=self.cfg.min_image_side,
                )
            elif engine.detector:
                job.image, job.geometry = decode_letterboxed(data, engine.input_size, **limits)
            else:
                job.image = decode_image(data, engine.input_size, **limits)
            job.decode_end = self.clock()
        except DecodeError as exc:
            batcher.release()
            self._fail(job, ErrorCode.BAD_IMAGE, str(exc), slot)
            return
        except MessageError as exc:
            batcher.release()
            self._fail(job, exc.code, exc.message, slot)
            return
        except Exception as exc:
            log.exception("decode of %s failed", job.request.id)
            batcher.release()
            self._fail(job, ErrorCode.INTERNAL, f"decode failed: {exc}", slot)
            return
        poll = batcher.put_take(job, job.deadline, alone=alone)
        if poll is None:  # closed since its admission
            self._fail(job, ErrorCode.INTERNAL, self._refused_why(slot), slot)
            return
        # When the batcher handed this thread the batch (`alone` at an idle runtime), it runs and
        # answers it here; otherwise the poll is empty and an engine thread takes it.
        self._run_poll(slot, poll, inline_replies=True)

    def _engine_loop(self, slot: ModelSlot, ready: threading.Event | None = None) -> None:
        """One engine thread of `slot`'s model, until the runtime stops or the model is unloaded."""
        failed: Engine | None = None  # an engine whose warm-up failed here is not tried again
        try:
            while self._running:
                engine = slot.engine
                if engine is None:
                    return
                if engine.thread_bound and engine is not failed:  # at start, and after a swap
                    try:
                        engine.warm_thread()
                    except Exception:
                        log.exception("warming %s up on an engine thread failed", engine.provider)
                        failed = engine
                if ready is not None:
                    ready.set()
                    ready = None
                self._run_poll(slot, slot.batcher.get(timeout=0.1))
        finally:
            if ready is not None:  # stopped before it began
                ready.set()

    def _run_poll(self, slot: ModelSlot, poll: BatchPoll[Job], *, inline_replies: bool = False) -> None:
        """Answer what expired, run the batch; whatever goes wrong, every job gets its one answer and
        the batch's lanes are given back (a lane kept would stop the engine for good)."""
        try:
            for item in poll.expired:
                self._fail(item.item, ErrorCode.DEADLINE_EXCEEDED, "deadline passed while queued", slot)
            for item in poll.doomed:
                self._fail(item.item, ErrorCode.DEADLINE_EXCEEDED, self._doomed_why(item, poll), slot)
            if poll.batch:
                self._run_batch(slot, poll.batch, inline_replies=inline_replies, lane=not poll.alone)
        except Exception:
            log.exception("a batch of %d failed after inference", len(poll.batch))
            for q in [*poll.expired, *poll.doomed, *poll.batch]:
                try:
                    self._fail(q.item, ErrorCode.INTERNAL, "internal error", slot)  # no-op if answered
                except Exception:
                    log.exception("answering %s failed", q.item.request.id)
        finally:
            if poll.batch:
                slot.batcher.done(poll.slots)

    def _doomed_why(self, item: Queued[Job], poll: BatchPoll[Job]) -> str:
        left_ms = 0.0 if item.deadline is None else (item.deadline - self.clock()) * 1000
        size = len(poll.batch) + 1
        return f"{left_ms:.0f} ms left, and a batch of {size} takes about {poll.run_s * 1000:.0f} ms"

    def _run_batch(
        self, slot: ModelSlot, batch: list[Queued[Job]], *, inline_replies: bool = False, lane: bool = False
    ) -> None:
        jobs = [q.item for q in batch]
        with slot.engine_lock:
            engine = slot.engine
        if engine is None:  # admitted to its batcher, it is not unloaded: only a bug gets here
            raise RuntimeError(f"model {slot.name} is not loaded")
        with _policy_guard("on_batch_start"):
            self.placement.on_batch_start(len(jobs))
        start = self.clock()
        try:
            images = np.stack([j.image for j in jobs if j.image is not None])
            if images.shape[1] != engine.input_size:  # an engine swap changed the input size
                from edgeinfer.runtime.decode import refit

                images = np.stack([refit(j, engine.input_size, engine.detector) for j in jobs])
            probs = engine.run(images, lane=lane)
        except Exception as exc:
            log.exception("inference on a batch of %d failed", len(jobs))
            for j in jobs:
                self._fail(j, ErrorCode.INTERNAL, f"inference failed: {exc}", slot)
            return
        end = self.clock()
        n = len(jobs)
        if not all(j.discard for j in jobs):
            self.timings.execution(n)
        ms = (end - start) * 1000
        slot.batcher.observe_run(n, end - start, alone=not lane)
        with _policy_guard("on_batch_end"):
            self.placement.on_batch_end(n, ms)
        with self._stats_lock:
            self.stats.batches.append(n)
            del self.stats.batches[:-1000]
            slot.engine_ms = ms if not slot.engine_ms else 0.8 * slot.engine_ms + 0.2 * ms
            slot.mean_batch = n if not slot.mean_batch else 0.8 * slot.mean_batch + 0.2 * n
        detected: list[tuple[PipelineJob, Result]] = []  # pipelines: their crops go on together
        for j, row in zip(jobs, probs, strict=True):
            req = j.request
            preds = [] if engine.detector else engine.top_k(row, req.top_k)
            dets = (
                engine.detect(
                    row,
                    max_detections=req.max_detections,
                    score_threshold=req.score_threshold,
                    geometry=j.geometry,
                )
                if engine.detector
                else None
            )
            lat = Latency(
                queue=((j.decode_start - j.arrived) + (start - j.decode_end)) * 1000,
                decode=(j.decode_end - j.decode_start) * 1000,
                inference=ms,
            )
            result = Result(
                id=j.request.id,
                status="ok",
                timestamp="",
                predictions=preds,
                model=engine.model_ref,
                placement="edge",
                provider=engine.provider,
                batch_size=n,
                latency_ms=lat,
                detections=dets,
            )
            if isinstance(j, CropJob):
                self._crop_answered(j, result)
                continue
            if isinstance(j, PipelineJob):
                detected.append((j, result))
                continue
            if j.source is None and self._cascade(j, result):
                continue  # the placement policy asks the cloud's heavier model; it answers later
            if inline_replies:
                self._reply(j, result)
            else:
                self._replies.put((j, result))
        if detected:
            self._classify_crops(detected)

    # ------------------------------------------------------------------------------------ pipelines

    def _classify_crops(self, detected: list[tuple[PipelineJob, Result]]) -> None:
        """Pipelines' detectors have answered (a batch of them): the chosen detections' crops join
        their classifiers' batchers, every crop of the batch admitted before any is queued — while
        some are on their way a batcher waits for them (up to its queue delay), so the crops of a
        frame, and of the frames in one detector batch, go as one batch. A job with no detection
        chosen is answered now."""
        crops: list[tuple[CropJob, ModelSlot]] = []
        for job, result in detected:
            try:
                crops.extend(self._cut_crops(job, result))
            except Exception as exc:
                log.exception("the crops of %s failed", job.request.id)
                self._fail(job, ErrorCode.INTERNAL, f"pipeline {job.route.pipeline.name!r}: {exc}")
        rooms = [slot.batcher.admit() for _, slot in crops]
        for (crop, slot), room in zip(crops, rooms, strict=True):
            if not room:  # full, or closed (at stop the classifier's may close before the detector's)
                self._not_admitted(crop, slot, slot.batcher)
            elif slot.batcher.put_take(crop, crop.deadline) is None:
                self._fail(crop, ErrorCode.INTERNAL, self._refused_why(slot), slot)

    def _cut_crops(self, job: PipelineJob, detected: Result) -> list[tuple[CropJob, ModelSlot]]:
        """`job`'s crops, each for its classifier's batcher (none: `job` is answered here)."""
        slot = job.route.classifier
        engine = slot.engine  # leased by the job: loaded
        if engine is None or engine.detector:
            why = "is not loaded" if engine is None else "is a detector, not a classifier"
            raise RuntimeError(f"its classifier {slot.name!r} {why}")
        # A request's image was kept at its full size; a source's frame is the letterboxed one.
        frame, geometry = (job.frame, None) if job.frame is not None else (job.image, job.geometry)
        job.frame = job.image = None
        if frame is None:
            raise RuntimeError("the image was not kept for its crops")
        start = self.clock()
        chosen, images = job.route.pipeline.crops(
            frame, detected.detections or [], engine.input_size, geometry=geometry
        )
        now = self.clock()
        assembly = Assembly(job, detected, chosen, prep_ms=(now - start) * 1000)
        if not chosen:
            self._replies.put((job, assembly.result()))
        return [
            (
                CropJob(
                    Request(id=f"{job.request.id}#{i}", top_k=job.request.top_k),
                    job.reply,
                    now,
                    job.deadline,
                    image=image,
                    decode_start=now,
                    decode_end=now,
                    source="pipeline",  # never cascaded to the cloud
                    assembly=assembly,
                    index=i,
                ),
                slot,
            )
            for i, image in enumerate(images)
        ]

    def _crop_answered(self, crop: CropJob, result: Result) -> None:
        """A crop's answer goes to its assembly; the last one answers the pipeline's job."""
        if not crop.claim():
            return
        final = crop.assembly.add(crop.index, result)
        if final is not None:
            self._replies.put((crop.assembly.job, final))

    def _reply_loop(self) -> None:
        while True:
            item = self._replies.get()
            if item is None:
                return
            self._reply(*item)

    def _reply(self, job: Job, result: Result) -> None:
        if isinstance(job, CropJob):
            self._crop_answered(job, result)
            return
        try:
            self.answers.send(job, result)
        except Exception:
            log.exception("publishing the result of %s failed", job.request.id)

    # -------------------------------------------------------------------------------------- answers

    def _fail(self, job: Job, code: ErrorCode, message: str, slot: ModelSlot | None = None) -> None:
        """Answer `job` with an error that names its model (`slot`; the default when not known; a
        pipeline's job names its pipeline)."""
        slot = slot or self.models.default
        engine = slot.engine
        provider = None if engine is None else engine.provider
        if isinstance(job, CropJob):
            failed = error_result(job.request.id, code, message, timestamp="", model=slot.model_ref)
            self._crop_answered(job, failed)
            return
        model = job.route.model_ref if isinstance(job, PipelineJob) else slot.model_ref
        self.answers.fail(job, code, message, model=model, provider=provider)

    def _reply_offloaded(self, job: Job, result: Result) -> None:
        if result.id is None:
            result.id = job.request.id
        self.answers.send(job, result)

    # ------------------------------------------------------------------------------------- helpers

    def _cascade(self, job: Job, result: Result) -> bool:
        """Low-confidence cascade: a policy's `cascade(request, local_result, reply)` may hold the
        edge answer and ask the cloud; True means it took over and will call `reply` exactly once."""
        if self.offloader is None:
            return False
        try:
            return self.placement.cascade(job.request, result, lambda r: self._replies.put((job, r)))
        except Exception:
            log.exception("placement cascade failed; answering %s from the edge", job.request.id)
            return False

    def _decide(self, job: Job, slot: ModelSlot) -> Decision:
        if isinstance(job, PipelineJob):
            return Decision()  # the cloud serves models, not this runtime's pipelines: the edge
        try:
            return self.placement.decide(job.request, self._context(job, slot))
        except Exception:
            log.exception("placement policy failed; running %s on the edge", job.request.id)
            return Decision()

    def _context(self, job: Job, slot: ModelSlot) -> PlacementContext:
        engine = slot.engine
        return PlacementContext(
            thing=self.thing,
            target=job.reply.bus,
            queue_depth=slot.batcher.depth,
            outstanding=slot.batcher.outstanding,
            max_queue_size=slot.batcher.max_queue_size,
            max_batch_size=slot.batcher.max_batch_size,
            engine_ms_per_batch=slot.engine_ms,
            mean_batch_size=slot.mean_batch,
            deadline_left_ms=None if job.deadline is None else (job.deadline - self.clock()) * 1000,
            provider=self.engine.provider if engine is None else engine.provider,
            age_ms=self._age_ms(job.request),
        )

    def _age_ms(self, req: Request) -> float | None:
        """How long ago the request was sent, when it says (on the sender's clock: see docs)."""
        return None if req.sent_at is None else (self.wall() - req.sent_at) * 1000

    def _path_allowed(self, path: str) -> bool:
        real = os.path.realpath(path)
        for folder in self.cfg.image_folders:
            base = os.path.realpath(folder)
            if real == base or real.startswith(base.rstrip(os.sep) + os.sep):
                return True
        return False

    def _read_path(self, path: str) -> bytes:
        try:
            size = os.path.getsize(path)
            if size > self.cfg.max_payload_bytes:
                raise MessageError(ErrorCode.TOO_LARGE, f"image file is {size} bytes, over the limit")
            with open(path, "rb") as fh:
                return fh.read()
        except OSError as exc:
            raise MessageError(ErrorCode.BAD_IMAGE, f"cannot read image_path: {exc.strerror}") from None


@contextlib.contextmanager
def _policy_guard(hook: str) -> Iterator[None]:
    """A placement policy's exception is logged, never raised into serving."""
    try:
        yield
    except Exception:
        log.exception("placement hook %s failed", hook)


class _PlacementFeedback(AnswerHook):
    """The placement policy learns from what the edge really took, in time or not."""

    def __init__(self, server: InferenceServer) -> None:
        self.server = server

    def on_answer(self, job: Job, computed: Result, answered: Result) -> None:
        with _policy_guard("on_result"):
            self.server.placement.on_result(job.request.id, computed)


class _ModelEvents(RepositoryHooks):
    """The server's side of the model repository's loader (run on the loader thread)."""

    def __init__(self, server: InferenceServer) -> None:
        self.server = server

    def on_loaded(self, slot: ModelSlot, waiting: list[Waiting]) -> None:
        engine = slot.engine
        try:
            if engine is not None:
                warm_up_decoder(engine.input_size, engine.detail)
            self.server._engine_ready(slot)
        except Exception as exc:  # what waited still gets its one answer
            log.exception("starting model %s after its load failed", slot.name)
            error = f"its start failed: {exc}"  # what the repository answers until it loads again
            self.server._start_failed(slot, error)
            for w in waiting:
                self.server._fail(w.job, ErrorCode.INTERNAL, f"model {slot.name} did not load: {error}", slot)
            return
        for w in waiting:
            try:
                self.server._resume(w.job, slot)
            except Exception:
                log.exception("serving %s after its model's load failed", w.job.request.id)
                self.server._fail(w.job, ErrorCode.INTERNAL, "internal error", slot)

    def on_unloaded(self, slot: ModelSlot, engine: Engine) -> None:
        for t in slot.threads:  # they see the model unloaded within their next poll
            t.join(timeout=10)
        slot.threads = [t for t in slot.threads if t.is_alive()]

    def on_waited_out(self, slot: ModelSlot, waiting: list[Waiting]) -> None:
        for w in waiting:
            if w.deadline:
                self.server._fail(
                    w.job,
                    ErrorCode.DEADLINE_EXCEEDED,
                    f"deadline passed while model {slot.name} was loading",
                    slot,
                )
            else:
                self.server._fail(w.job, ErrorCode.OVERLOADED, f"model {slot.name} is loading", slot)

    def on_load_failed(self, slot: ModelSlot, waiting: list[Waiting], error: str) -> None:
        for w in waiting:
            self.server._fail(w.job, ErrorCode.INTERNAL, f"model {slot.name} did not load: {error}", slot)


def _then(first: Callable[[], None], then: Callable[[], None] | None) -> Callable[[], None]:
    """`first`, then `then` (when there is one): two things to do once a job is answered."""

    def both() -> None:
        try:
            first()
        finally:
            if then is not None:
                then()

    return both
