"""Router backends: where an offloaded request is really computed.

* `OnnxBackend`: ONNX Runtime on a model store folder (by default the heavier EfficientNet-Lite2 FP32
  built with `edgeinfer model build --arch lite2 --no-int8`; the offload benchmark gives it the edge's
  own store). It reuses the runtime's engine (provider selection, variant choice) and image decoder,
  so the cloud answers exactly as the edge would, with the same error codes for bad images.
* `SageMakerBackend`: a SageMaker real-time endpoint through boto3 `sagemaker-runtime`
  `invoke_endpoint` (image bytes in, JSON out).

A backend turns a list of `Job`s into one `Outcome` per job, in order: predictions, or the stable
error code of what went wrong. It never raises for a single bad request; `BackendError` is for a
backend that cannot serve at all (each job then gets INTERNAL).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from edgeinfer.messages import Detection, ErrorCode, ModelRef, Prediction

log = logging.getLogger(__name__)

__all__ = [
    "Backend",
    "BackendError",
    "Job",
    "OnnxBackend",
    "Outcome",
    "SageMakerBackend",
]


class BackendError(Exception):
    """The backend as a whole failed (session crashed, endpoint unreachable)."""


@dataclass
class Job:
    image: bytes
    top_k: int = 5
    model: str | None = None
    max_detections: int | None = None  # detectors; None: the model's defaults
    score_threshold: float | None = None


@dataclass
class Outcome:
    predictions: list[Prediction] = field(default_factory=list)
    detections: list[Detection] | None = None  # set by a detector
    code: ErrorCode | None = None
    message: str = ""
    decode_ms: float = 0.0
    inference_ms: float = 0.0
    postprocess_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return self.code is None


class Backend(Protocol):
    model_ref: ModelRef
    provider: str
    max_batch_size: int

    def serves(self, model: str | None) -> bool:
        """Can a request naming `model` (None: the default) be served here?"""
        ...

    def infer(self, jobs: Sequence[Job]) -> list[Outcome]: ...

    def close(self) -> None: ...


def _model_names(ref: ModelRef) -> set[str]:
    return {ref.name, f"{ref.name}:{ref.version}", ref.variant, f"{ref.name}:{ref.variant}"}


class OnnxBackend:
    """ONNX Runtime on a model store folder. Thread-safe (the engine serialises its runs)."""

    def __init__(self, engine: Any, *, max_image_pixels: int = 40_000_000, min_image_side: int = 8) -> None:
        self.engine = engine
        self.model_ref: ModelRef = engine.model_ref
        self.provider: str = engine.short_provider
        self.max_batch_size: int = engine.max_batch_size
        self.max_image_pixels = max_image_pixels
        self.min_image_side = min_image_side
        self.aliases: set[str] = set()

    @classmethod
    def load(
        cls,
        model_dir: str | Path,
        *,
        providers: Sequence[str] = ("CPUExecutionProvider",),
        max_batch_size: int = 8,
        intra_op_num_threads: int = 0,
        work_dir: str | None = None,
        warm_up: bool = True,
    ) -> OnnxBackend:
        """Load a model store (`manifest.json` + variants). Raises `BackendError` with the reason."""
        from edgeinfer.model.manifest import Manifest, ManifestError
        from edgeinfer.runtime.config import RuntimeConfig
        from edgeinfer.runtime.engine import Engine, EngineError

        try:
            manifest = Manifest.load(model_dir)
        except ManifestError as exc:
            raise BackendError(str(exc)) from None
        cfg = RuntimeConfig()
        cfg.execution_providers = list(providers)
        cfg.max_batch_size = max_batch_size
        cfg.cpu.intra_op_num_threads = intra_op_num_threads
        cfg.lanes = 1  # the router runs one batch at a time
        try:
            engine = Engine.create(manifest, cfg, work_dir or str(Path(model_dir).resolve()))
        except (EngineError, ManifestError) as exc:
            raise BackendError(str(exc)) from None
        from edgeinfer.runtime.providers import apply_process_options

        apply_process_options(cfg)  # the router decodes and runs a model, as the runtime does
        if warm_up:
            engine.warm_up(max_batch_size, runs=1)
        log.info("router backend: %s", engine.describe())
        return cls(engine)

    def serves(self, model: str | None) -> bool:
        return model is None or model in _model_names(self.model_ref) | self.aliases

    def infer(self, jobs: Sequence[Job]) -> list[Outcome]:
        import numpy as np

        from edgeinfer.runtime.decode import DecodeError, decode_image, decode_letterboxed

        outcomes = [Outcome() for _ in jobs]
        images: list[Any] = []
        slots: list[int] = []
        geometry: dict[int, Any] = {}
        detector = bool(getattr(self.engine, "detector", False))
        for i, job in enumerate(jobs):
            start = time.perf_counter()
            try:
                limits = {
                    "max_pixels": self.max_image_pixels,
                    "min_side": self.min_image_side,
                    "detail": self.engine.detail,
                }
                if detector:
                    image, geometry[i] = decode_letterboxed(job.image, self.engine.input_size, **limits)
                    images.append(image)
                else:
                    images.append(decode_image(job.image, self.engine.input_size, **limits))
                slots.append(i)
            except DecodeError as exc:
                outcomes[i].code = ErrorCode.BAD_IMAGE
                outcomes[i].message = str(exc)
            except Exception as exc:  # cv2 on hostile input: still a bad image, never a crash
                outcomes[i].code = ErrorCode.BAD_IMAGE
                outcomes[i].message = f"cannot decode the image: {exc}"[:300]
            outcomes[i].decode_ms = (time.perf_counter() - start) * 1000
        if not images:
            return outcomes
        start = time.perf_counter()
        try:
            probs = self.engine.run(np.ascontiguousarray(np.stack(images, axis=0)))
        except Exception as exc:
            raise BackendError(f"ONNX Runtime failed: {exc}".splitlines()[0][:300]) from exc
        inference_ms = (time.perf_counter() - start) * 1000
        for row, i in enumerate(slots):
            t0 = time.perf_counter()
            if detector:
                outcomes[i].detections = self.engine.detect(
                    probs[row],
                    max_detections=jobs[i].max_detections,
                    score_threshold=jobs[i].score_threshold,
                    geometry=geometry[i],
                )
            else:
                outcomes[i].predictions = self.engine.top_k(probs[row], jobs[i].top_k)
            outcomes[i].inference_ms = inference_ms
            outcomes[i].postprocess_ms = (time.perf_counter() - t0) * 1000
        return outcomes

    def close(self) -> None:
        self.engine = None


class SageMakerBackend:
    """A SageMaker real-time endpoint. The request body is the encoded image (`application/x-image`);
    the answer is JSON in one of the shapes SageMaker image classifiers return:

    * a list of class probabilities (the built-in image-classification algorithm),
    * `{"probabilities": [...]}` / `{"predictions": [[...]]}` (TensorFlow/PyTorch serving),
    * `{"predictions": [{"index", "label", "score"}, ...]}` (already ranked).
    """

    max_batch_size = 1

    def __init__(
        self,
        endpoint_name: str,
        *,
        client: Any = None,
        region_name: str | None = None,
        labels: Sequence[str] = (),
        model_ref: ModelRef | None = None,
        content_type: str = "application/x-image",
        target_variant: str | None = None,
    ) -> None:
        if client is None:
            import boto3

            client = boto3.client("sagemaker-runtime", region_name=region_name)
        self.client = client
        self.endpoint_name = endpoint_name
        self.labels = list(labels)
        self.model_ref = model_ref or ModelRef(endpoint_name, "endpoint", target_variant or "default")
        self.provider = "sagemaker"
        self.content_type = content_type
        self.target_variant = target_variant

    def serves(self, model: str | None) -> bool:
        return model is None or model in _model_names(self.model_ref) | {self.endpoint_name}

    def infer(self, jobs: Sequence[Job]) -> list[Outcome]:
        return [self._one(job) for job in jobs]

    def _one(self, job: Job) -> Outcome:
        from botocore.exceptions import BotoCoreError, ClientError

        kwargs: dict[str, Any] = {
            "EndpointName": self.endpoint_name,
            "ContentType": self.content_type,
            "Accept": "application/json",
            "Body": job.image,
        }
        if self.target_variant:
            kwargs["TargetVariant"] = self.target_variant
        start = time.perf_counter()
        try:
            response = self.client.invoke_endpoint(**kwargs)
            body = response["Body"].read()
        except ClientError as exc:
            response_doc: dict[str, Any] = dict(exc.response)
            err = response_doc.get("Error", {})
            code, message = str(err.get("Code", "")), str(err.get("Message", exc))
            status = response_doc.get("OriginalStatusCode") or response_doc.get("ResponseMetadata", {}).get(
                "HTTPStatusCode", 0
            )
            # A model error on a 4xx is the request's fault (usually an image it cannot read).
            if code == "ModelError" and 400 <= int(status or 0) < 500:
                return Outcome(code=ErrorCode.BAD_IMAGE, message=f"endpoint refused the image: {message}")
            if code in ("ThrottlingException", "ServiceUnavailable", "ModelNotReadyException"):
                return Outcome(code=ErrorCode.OVERLOADED, message=f"SageMaker {code}: {message}")
            return Outcome(code=ErrorCode.INTERNAL, message=f"SageMaker {code or 'error'}: {message}")
        except BotoCoreError as exc:
            return Outcome(code=ErrorCode.INTERNAL, message=f"SageMaker unreachable: {exc}")
        inference_ms = (time.perf_counter() - start) * 1000
        try:
            predictions = self._parse(body, job.top_k)
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            return Outcome(
                code=ErrorCode.INTERNAL,
                message=f"endpoint answered in an unknown shape: {exc}"[:300],
                inference_ms=inference_ms,
            )
        return Outcome(predictions=predictions, inference_ms=inference_ms)

    def _label(self, index: int) -> str:
        return self.labels[index] if 0 <= index < len(self.labels) else str(index)

    def _parse(self, body: bytes, top_k: int) -> list[Prediction]:
        doc = json.loads(body)
        if isinstance(doc, dict):
            if "probabilities" in doc:
                doc = doc["probabilities"]
            elif "predictions" in doc:
                doc = doc["predictions"]
            else:
                raise ValueError(f"no 'predictions' or 'probabilities' in {sorted(doc)[:5]}")
        if not isinstance(doc, list) or not doc:
            raise ValueError("empty answer")
        if isinstance(doc[0], list):  # batch of one
            doc = doc[0]
        if isinstance(doc[0], dict):
            ranked = [
                Prediction(
                    int(p["index"]), str(p.get("label") or self._label(int(p["index"]))), float(p["score"])
                )
                for p in doc
            ]
            ranked.sort(key=lambda p: -p.score)
            return ranked[:top_k]
        probs = [float(x) for x in doc]
        order = sorted(range(len(probs)), key=lambda i: -probs[i])[:top_k]
        return [Prediction(i, self._label(i), probs[i]) for i in order]

    def close(self) -> None:
        pass
