"""The `capture` configuration node: what to capture, per model, and where it goes.

Not in any recipe's DefaultConfiguration (nucleus lite caps a recipe's sub-objects): a deployment
merges a `capture` map into the runtime's configuration, and everything it leaves out takes the
defaults here. Read by the one configuration reader, `edgeinfer.config`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edgeinfer import config as reader

__all__ = ["COMPONENT", "KINDS", "CaptureConfig", "Limits", "ModelCapture", "SamplerConfig"]

COMPONENT = "capture"
KINDS = ("random", "confidence", "classes", "detections", "errors", "deadline")


@dataclass
class Limits:
    """At most this many records per sliding minute, hour and day (0: no limit)."""

    per_minute: int = 0
    per_hour: int = 0
    per_day: int = 0

    def check(self) -> list[tuple[str, str]]:
        return [
            (reader.camel(name), "must be 0 or more")
            for name in ("per_minute", "per_hour", "per_day")
            if getattr(self, name) < 0
        ]


@dataclass
class SamplerConfig:
    """One reason to capture. `kind` picks which of the other keys apply:
    random (`share`), confidence (`low` ≤ top score ≤ `high`), classes (`classes`), detections
    (`minCount` ≤ count ≤ `maxCount`, -1: no upper bound), errors (`codes`, empty: every code but
    DEADLINE_EXCEEDED), deadline (answers late)."""

    kind: str = "random"
    share: float = 0.0
    low: float = 0.0
    high: float = 1.0
    classes: list[str] = field(default_factory=list)
    min_count: int = 0
    max_count: int = -1
    codes: list[str] = field(default_factory=list)
    limits: Limits = field(default_factory=Limits)

    def check(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if self.kind not in KINDS:
            out.append(("kind", f"must be one of {', '.join(KINDS)}, got {self.kind!r}"))
        if not 0.0 <= self.share <= 1.0:
            out.append(("share", "must be between 0 and 1"))
        if not 0.0 <= self.low <= self.high <= 1.0:
            out.append(("low", "low and high must satisfy 0 <= low <= high <= 1"))
        if self.max_count != -1 and self.max_count < self.min_count:
            out.append(("maxCount", "must be -1 or at least minCount"))
        return out


@dataclass
class ModelCapture:
    """What one model's answers are sampled by, and how its images are kept."""

    samplers: list[SamplerConfig] = field(default_factory=list)
    max_image_side: int = 0  # 0: the image as sent; else resized so its longer side is at most this
    jpeg_quality: int = 85

    def check(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if self.max_image_side < 0:
            out.append(("maxImageSide", "must be 0 (as sent) or a side in pixels"))
        if not 1 <= self.jpeg_quality <= 100:
            out.append(("jpegQuality", "must be between 1 and 100"))
        return out


@dataclass
class CaptureConfig:
    enabled: bool = False
    bucket: str = ""
    prefix: str = "edgeinfer-capture"
    endpoint: str = ""  # an S3-compatible store's URL (MinIO); "": AWS S3 in `region`
    region: str = ""  # "": $AWS_REGION
    spool_dir: str = ""  # "": <work dir>/capture-spool
    spool_max_mb: float = 256.0
    spool_max_age_h: float = 168.0
    upload_bytes_per_s: int = 262_144
    queue_size: int = 64  # chosen answers waiting for the writer; beyond it they are counted, not kept
    models: dict[str, ModelCapture] = field(default_factory=dict)  # a model's name, or "*"

    def check(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if self.enabled and not self.bucket:
            out.append(("bucket", "is needed when capture is enabled"))
        if self.spool_max_mb <= 0:
            out.append(("spoolMaxMb", "must be more than 0"))
        if self.spool_max_age_h <= 0:
            out.append(("spoolMaxAgeH", "must be more than 0"))
        if self.upload_bytes_per_s <= 0:
            out.append(("uploadBytesPerS", "must be more than 0"))
        if self.queue_size < 1:
            out.append(("queueSize", "must be at least 1"))
        return out

    @classmethod
    def from_recipe(cls, doc: Any) -> CaptureConfig:
        """The `capture` node (None: all defaults, capture off). Raises ConfigError."""
        return reader.read(cls, doc, component=COMPONENT, path="capture")

    def for_model(self, name: str) -> ModelCapture | None:
        return self.models.get(name) or self.models.get("*")
