"""The runtime recipe's `placement` object, read into `OffloadConfig`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from edgeinfer.runtime.config import camel as _camel

__all__ = ["OffloadConfig"]


@dataclass
class OffloadConfig:
    """The runtime recipe's `placement` object (camelCase keys: `enabled`, `deadlineMarginMs`, …)."""

    enabled: bool = True
    deadline_margin_ms: float = 5.0  # kept free in every budget, for jitter
    cascade_threshold: float = 0.0  # >0: edge top-1 probability below this asks the cloud's model
    cloud_model: str = ""  # model name asked for on a cascade ("" = the router's default)
    cloud_timeout_ms: float = 2000.0  # wait for the cloud when the request has no deadline
    min_cloud_wait_ms: float = 50.0  # never fall back sooner than this after sending
    prior_cloud_ms: float = 60.0  # predicted cloud latency before any offload came back
    prior_cloud_item_ms: float = 10.0  # … plus this per offload already in flight (the cloud's queue)
    max_inflight: int = 256  # offloads waiting for an answer at once
    # Offloads handed to the nucleus and not yet taken by it: the classic nucleus keeps at most
    # `maxInFlightPublishes` (5) QoS 1 publishes in flight and queues the rest behind them.
    max_inflight_publishes: int = 5
    # The offload's image: re-encoded as a JPEG with this shorter side (0: the local model's common
    # input size, which the cloud's preprocessing shares), never enlarged.
    offload_image_side: int = 0
    offload_jpeg_quality: int = 90
    # Deadline offloads in flight are capped by an adaptive limit (AIMD, as TCP's window): +1/limit
    # for each answer back with headroom (round trip <= `cloud_limit_headroom` of the time it had),
    # ×`cloud_limit_backoff` for an answer that missed (at most once per `cloud_limit_hold_s`).
    cloud_limit_initial: float = 4.0
    cloud_limit_headroom: float = 0.75
    cloud_limit_backoff: float = 0.8
    cloud_limit_hold_s: float = 0.1
    breaker_failures: int = 3  # consecutive failures that open the breaker
    breaker_cooldown_s: float = 2.0  # first wait before a probe
    breaker_max_cooldown_s: float = 30.0
    window: int = 64  # recent samples kept by each model
    cloud_memory_s: float = 20.0  # forget the cloud's latency after this long without a new sample
    feedback_memory_s: float = 3.0  # feedback samples (local and cloud) older than this are dropped
    cloud_probe_s: float = 0.5  # cloud predicted too slow and not measured for this long: offload one
    # request that would be rejected anyway (none in flight), so a pessimistic verdict is tested again
    # Light load: below this engine utilisation (busy share of the last `utilization_window_s`, once
    # batches have been seen for `utilization_min_s`), deadline offloads stop: the cloud is for a
    # device that runs out of capacity, not for the Poisson bursts of one that has plenty (0 = off).
    offload_min_utilization: float = 0.7
    utilization_window_s: float = 2.0
    utilization_min_s: float = 0.25
    local_quantile: float = 0.98  # how sure "the edge meets the budget" must be (feedback residuals)
    cloud_quantile: float = 0.9  # how sure "the cloud meets the budget" must be
    local_models: list[str] = field(default_factory=list)  # names served here ([] = the loaded one)

    @classmethod
    def from_recipe(cls, doc: Mapping[str, object] | None) -> tuple[OffloadConfig, list[str]]:
        """Read camelCase keys; values of the wrong type are reported and left at their default."""
        cfg = cls()
        problems: list[str] = []
        for name in cfg.__dataclass_fields__:
            key = _camel(name)
            if not doc or key not in doc:
                continue
            value, default = doc[key], getattr(cfg, name)
            if isinstance(default, bool):
                ok = isinstance(value, bool)
            elif isinstance(default, (int, float)):
                ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
                if ok and isinstance(value, (int, float)):
                    value = type(default)(value)
            elif isinstance(default, list):
                ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
            else:
                ok = isinstance(value, str)
            if ok:
                setattr(cfg, name, value)
            else:
                problems.append(f"placement.{key} has the wrong type or range: {value!r}")
        if cfg.cascade_threshold > 1:
            problems.append("placement.cascadeThreshold must be from 0 to 1")
            cfg.cascade_threshold = 0.0
        if cfg.breaker_failures < 1:
            problems.append("placement.breakerFailures must be at least 1")
            cfg.breaker_failures = 1
        if not 0 < cfg.cloud_limit_backoff < 1:
            problems.append("placement.cloudLimitBackoff must be between 0 and 1")
            cfg.cloud_limit_backoff = cls.cloud_limit_backoff
        cfg.cloud_limit_initial = max(1.0, cfg.cloud_limit_initial)
        if cfg.offload_min_utilization > 1:
            problems.append("placement.offloadMinUtilization must be from 0 to 1")
            cfg.offload_min_utilization = cls.offload_min_utilization
        for name in ("local_quantile", "cloud_quantile"):
            if not 0.5 <= getattr(cfg, name) < 1:
                problems.append(f"placement.{_camel(name)} must be from 0.5 to below 1")
                setattr(cfg, name, getattr(cls, name))
        cfg.max_inflight_publishes = max(1, cfg.max_inflight_publishes)
        if not 1 <= cfg.offload_jpeg_quality <= 100:
            problems.append("placement.offloadJpegQuality must be from 1 to 100")
            cfg.offload_jpeg_quality = cls.offload_jpeg_quality
        if cfg.window < 2:
            problems.append("placement.window must be at least 2")
            cfg.window = 2
        return cfg, problems
