"""Pipelines: a detector's boxes of chosen classes cropped and classified by a classifier, one answer.

A pipeline (`RuntimeConfig.pipelines`, by name) is requested like a model. The server takes such a
request as a `PipelineJob`: it leases the pipeline's classifier for the job's whole life (the crops
join that model's batcher only once the detector has run, and the lease keeps it from being evicted
meanwhile), decodes the image once at its full size (`prepare_frame`), letterboxes it for the
detector and serves it on the detector's batcher like any request. When the detector's batch has run,
the detections the pipeline takes (`Pipeline.chosen`) are cut from the full image (`Pipeline.crops`)
and each crop joins the classifier's batcher as a `CropJob`: the crops of one frame, and of the frames
in flight at once, batch together there. An `Assembly` collects the crops' answers; the last one
makes the job's one result — the detector's detections, each chosen one carrying its crop's
classification — or, when any crop failed, an error with that crop's code. The request's deadline
covers all of it: each crop carries it into the classifier's batcher.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from edgeinfer.messages import (
    Box,
    Detection,
    ErrorCode,
    Latency,
    MessageError,
    ModelRef,
    Result,
    error_result,
)
from edgeinfer.runtime.answer import Job
from edgeinfer.runtime.config import PipelineEntry
from edgeinfer.runtime.decode import Letterbox, decode_source, letterbox, to_model_input
from edgeinfer.runtime.engine import Engine
from edgeinfer.runtime.inbound import model_refusal
from edgeinfer.runtime.models import ModelRepository, ModelSlot

__all__ = [
    "Assembly",
    "CropJob",
    "Pipeline",
    "PipelineJob",
    "Route",
    "prepare_frame",
    "read_pipelines",
    "route",
    "unknown_model",
]


@dataclass(frozen=True)
class Pipeline:
    """One configured pipeline: its name and what `pipelines.<name>` says."""

    name: str
    entry: PipelineEntry

    def chosen(self, detections: Sequence[Detection]) -> list[int]:
        """The indices of the detections this pipeline crops: of its classes, score and size, the
        `max_crops` best (a crowded frame's crops would fill the classifier's queue)."""
        entry = self.entry
        wanted = set(entry.classes)
        taken = [
            i
            for i, d in enumerate(detections)
            if (not wanted or d.label in wanted)
            and d.score >= entry.min_score
            and min(d.box.x_max - d.box.x_min, d.box.y_max - d.box.y_min) >= entry.min_box_size
        ]
        best = sorted(taken, key=lambda i: -detections[i].score)[: entry.max_crops]
        return sorted(best)

    def crop_box(self, detection: Detection, width: int, height: int) -> tuple[int, int, int, int]:
        """The pixels cut for `detection` in a `width`×`height` image: (x0, y0, x1, y1), x1 and y1
        exclusive. The box as answered (to 0.1 px), widened by `padding` on each side, out to whole
        pixels and clipped to the image; at least one pixel each way."""
        box = detection.box
        x_min, y_min, x_max, y_max = (round(v, 1) for v in (box.x_min, box.y_min, box.x_max, box.y_max))
        pad_x = self.entry.padding * (x_max - x_min)
        pad_y = self.entry.padding * (y_max - y_min)
        x0 = min(width - 1, max(0, math.floor(x_min - pad_x)))
        y0 = min(height - 1, max(0, math.floor(y_min - pad_y)))
        x1 = max(x0 + 1, min(width, math.ceil(x_max + pad_x)))
        y1 = max(y0 + 1, min(height, math.ceil(y_max + pad_y)))
        return x0, y0, x1, y1

    def crops(
        self,
        frame: np.ndarray,
        detections: Sequence[Detection],
        size: int,
        *,
        geometry: Letterbox | None = None,
    ) -> tuple[list[int], list[np.ndarray]]:
        """The chosen detections' indices and their crops of `frame`, each as the classifier takes an
        image (RGB `[size, size, 3]`, as `decode_image` makes one). `frame`: the image at its full
        size (BGR), or with `geometry` the detector's letterboxed input (RGB), boxes mapped into it."""
        height, width = frame.shape[:2]
        chosen = self.chosen(detections)
        images = []
        for i in chosen:
            found = detections[i] if geometry is None else _into(detections[i], geometry)
            x0, y0, x1, y1 = self.crop_box(found, width, height)
            images.append(to_model_input(frame[y0:y1, x0:x1], size, bgr=geometry is None))
        return chosen, images


def _into(detection: Detection, geometry: Letterbox) -> Detection:
    """`detection` with its box in the letterboxed image (boxes are answered in the source's)."""
    (sx, sy), (ox, oy) = geometry.scale, geometry.offset
    box = detection.box
    return dataclasses.replace(
        detection, box=Box(box.x_min * sx + ox, box.y_min * sy + oy, box.x_max * sx + ox, box.y_max * sy + oy)
    )


def read_pipelines(entries: Mapping[str, PipelineEntry]) -> dict[str, Pipeline]:
    return {name: Pipeline(name, entry) for name, entry in entries.items()}


@dataclass(frozen=True)
class Route:
    """A pipeline with the slots of its two models."""

    pipeline: Pipeline
    detector: ModelSlot
    classifier: ModelSlot

    @property
    def model_ref(self) -> ModelRef:
        """What its answers name: the pipeline, and its two models' versions and variants."""
        det, cls = self.detector.model_ref, self.classifier.model_ref
        return ModelRef(self.pipeline.name, f"{det.version}+{cls.version}", f"{det.variant}+{cls.variant}")


def route(pipeline: Pipeline, models: ModelRepository) -> Route | str:
    """`pipeline` on the models served here, or why it cannot be served."""
    slots = {}
    for role, name in (("detector", pipeline.entry.detector), ("classifier", pipeline.entry.classifier)):
        slot = models.get(name)
        if slot is None:
            served = ", ".join(repr(n) for n in models.names())
            return f"pipeline {pipeline.name!r}: its {role} {name!r} is not served here (models: {served})"
        slots[role] = slot
    return Route(pipeline, slots["detector"], slots["classifier"])


def unknown_model(model: str | None, models: Sequence[str], pipelines: Sequence[str]) -> str:
    """Why a request naming `model` is refused: every model served, and every pipeline."""
    why = model_refusal(model, models)
    return f"{why} and the pipelines {', '.join(repr(p) for p in pipelines)}" if pipelines else why


@dataclass(kw_only=True, eq=False)
class PipelineJob(Job):
    """A request for a pipeline: served on its detector, then its crops on its classifier."""

    route: Route
    frame: np.ndarray | None = None  # the image at its full size (BGR), until its crops are cut
    leased: bool = False  # holds a lease on its classifier, given back with its answer


@dataclass(kw_only=True, eq=False)
class CropJob(Job):
    """One crop of a pipeline's frame on the classifier's batcher; its answer goes to `assembly`."""

    assembly: Assembly
    index: int  # its place among the assembly's chosen detections


def prepare_frame(
    data: bytes, engine: Engine, pipeline: Pipeline, *, max_pixels: int, min_side: int
) -> tuple[np.ndarray, np.ndarray, Letterbox]:
    """The image at its full size (BGR, for the crops), and letterboxed for the detector `engine`
    with its geometry. MessageError when the pipeline's detector is not one."""
    if not engine.detector:
        why = f"pipeline {pipeline.name!r}: its detector {engine.manifest.name!r} is not a detector"
        raise MessageError(ErrorCode.INTERNAL, why)
    frame = decode_source(data, max_pixels=max_pixels, min_side=min_side)
    image, geometry = letterbox(frame, engine.input_size, bgr=True)
    return frame, image, geometry


class Assembly:
    """A pipeline job's crops in flight: their answers, and the job's one result once all are in."""

    def __init__(self, job: PipelineJob, detected: Result, chosen: Sequence[int], *, prep_ms: float) -> None:
        self.job = job
        self.detected = detected
        self.chosen = list(chosen)
        self.prep_ms = prep_ms  # cutting and sizing the crops
        self._answers: list[Result | None] = [None] * len(self.chosen)
        self._left = len(self.chosen)
        self._lock = threading.Lock()

    def add(self, index: int, result: Result) -> Result | None:
        """A crop's answer; the job's result when it was the last one."""
        with self._lock:
            if self._answers[index] is not None:
                return None
            self._answers[index] = result
            self._left -= 1
            if self._left:
                return None
        return self.result()

    def result(self) -> Result:
        """The job's result from the detector's and the crops' answers (all in)."""
        answers = [r for r in self._answers if r is not None]
        ref = self.job.route.model_ref
        failed = next((r for r in answers if r.status != "ok"), None)
        if failed is not None:
            code = failed.error.code if failed.error else ErrorCode.INTERNAL
            why = failed.error.message if failed.error else "failed"
            name = self.job.route.classifier.name
            return error_result(
                self.job.request.id,
                code,
                f"pipeline {ref.name!r}: a crop on model {name!r}: {why}",
                timestamp="",
                model=ref,
                provider=self.detected.provider,
            )
        detections = list(self.detected.detections or [])
        for i, answer in zip(self.chosen, answers, strict=True):
            detections[i] = dataclasses.replace(detections[i], classification=tuple(answer.predictions))
        lat = self.detected.latency_ms
        return Result(
            id=self.job.request.id,
            status="ok",
            timestamp="",
            model=ref,
            placement="edge",
            provider=self.detected.provider,
            batch_size=self.detected.batch_size,
            latency_ms=Latency(
                queue=lat.queue + max((r.latency_ms.queue for r in answers), default=0.0),
                decode=lat.decode + self.prep_ms,
                inference=lat.inference + max((r.latency_ms.inference for r in answers), default=0.0),
            ),
            detections=detections,
        )
