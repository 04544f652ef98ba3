"""The runtime recipe's `placement` object, read into `OffloadConfig` by `edgeinfer.config`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from edgeinfer import config

COMPONENT = "com.edgeinfer.InferenceRuntime"

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
    # The classic nucleus keeps at most `maxInFlightPublishes` (5) QoS 1 publishes in flight and
    # queues the rest behind them; offloads beyond that would only wait there.
    max_inflight_publishes: int = 5  # offloads handed to the nucleus and not yet taken by it
    # 0: the local model's common input size, which the cloud's preprocessing shares.
    offload_image_side: int = 0  # offloads carry the image re-encoded as a JPEG with this shorter side
    offload_jpeg_quality: int = 90  # of that JPEG
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
    # Behind: requests that arrive late say the device is behind a backlog upstream (a broker's queue,
    # a clogged bridge) that its own queue does not show. A sign: an arrival that spent
    # `backlogLagShare` of its deadline on the way (its lag, now − `sent_at`, above the least of the
    # last `backlogFloorS` once arrivals span that long: a sender's clock behind this one's is no
    # backlog, but a device that starts into one has not seen the usual lag yet), or arrived past its
    # deadline, or whose lag is `backlogGrowthMs` over the least of the last `utilizationWindowS`.
    # `backlogArrivals` signs in a row put the device behind, for `backlogHoldS` after the last.
    # Behind, the light-load rule is off and a deadline request goes to the cloud whenever the cloud
    # meets what is left of its budget (0 = that sign is off).
    backlog_lag_share: float = 0.5  # share of its deadline an arrival spent upstream: a sign of a backlog
    backlog_growth_ms: float = 20.0  # an arrival lag this much over the window's least: a sign too
    backlog_arrivals: int = 3  # signs in a row that put the device behind
    backlog_hold_s: float = 0.5  # behind until this long after the last sign
    backlog_floor_s: float = 30.0  # the least lag of this long is the usual one (clock offset, link)
    local_quantile: float = 0.98  # how sure "the edge meets the budget" must be (feedback residuals)
    cloud_quantile: float = 0.9  # how sure "the cloud meets the budget" must be
    local_models: list[str] = field(default_factory=list)  # names served here ([] = the loaded one)

    @classmethod
    def from_recipe(cls, doc: Mapping[str, object] | None, *, path: str = "placement") -> OffloadConfig:
        """Read the camelCase keys (either nucleus's typing). Raises ConfigError naming every refused
        key; a limit of at least 1 (`cloudLimitInitial`, `maxInflightPublishes`) is raised to 1."""
        cfg = config.read(cls, doc, component=COMPONENT, path=path)
        cfg.cloud_limit_initial = max(1.0, cfg.cloud_limit_initial)
        cfg.max_inflight_publishes = max(1, cfg.max_inflight_publishes)
        return cfg

    def check(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
                out.append((config.key_of(f), "must not be negative"))
        if self.cascade_threshold > 1:
            out.append(("cascadeThreshold", "must be from 0 to 1"))
        if self.breaker_failures < 1:
            out.append(("breakerFailures", "must be at least 1"))
        if not 0 < self.cloud_limit_backoff < 1:
            out.append(("cloudLimitBackoff", "must be between 0 and 1"))
        if self.offload_min_utilization > 1:
            out.append(("offloadMinUtilization", "must be from 0 to 1"))
        if self.backlog_lag_share > 1:
            out.append(("backlogLagShare", "must be from 0 to 1"))
        if self.backlog_arrivals < 1:
            out.append(("backlogArrivals", "must be at least 1"))
        for name in ("local_quantile", "cloud_quantile"):
            if not 0.5 <= getattr(self, name) < 1:
                out.append((config.key_for(OffloadConfig, name), "must be from 0.5 to below 1"))
        if not 1 <= self.offload_jpeg_quality <= 100:
            out.append(("offloadJpegQuality", "must be from 1 to 100"))
        if self.window < 2:
            out.append(("window", "must be at least 2"))
        return out
