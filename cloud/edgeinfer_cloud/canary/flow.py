"""`edgeinfer deploy --canary`: deploy to the canary group, watch, then promote or roll back.

1. Read the canary group's current deployment (ListDeployments, GetDeployment): what the canaries
   run now is what a rollback redeploys, merges and `runWith` included.
2. Deploy the bundle to the canary group and follow it until every canary device succeeded (a failed
   install is Greengrass's to roll back on the device: `failureHandlingPolicy: ROLLBACK`). When that
   fails or times out the group still holds the new deployment: it is rolled back as in 4.
3. Watch the canary things' telemetry windows against every other thing's for the set time.
4. Promote (the same deployment to the target) or redeploy the canaries' previous components, saying
   why. A group without a previous deployment is rolled back to no components, which removes them.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from edgeinfer_cloud.canary.compare import Thresholds, Verdict, compare, summarize
from edgeinfer_cloud.canary.windows import Observed, WindowSource, watch
from edgeinfer_cloud.deploy import (
    DEFAULT_JOB,
    DeployError,
    Deployment,
    DeployReport,
    Following,
    JobConfig,
    Target,
    component_spec,
    deploy,
    pages,
    parse_target,
)

__all__ = ["CanaryOutcome", "CanaryPlan", "Previous", "previous_deployment", "resolve_canary", "run_canary"]

log = logging.getLogger(__name__)

Say = Callable[[str], None]
_GROUP_NAME = re.compile(r"^[A-Za-z0-9:_-]{1,128}$")


@dataclass(frozen=True)
class CanaryPlan:
    canary: Target
    minutes: float
    windows_per_thing: int | None = None  # end the watch early once each canary thing sent this many
    thresholds: Thresholds = field(default_factory=Thresholds)


@dataclass(frozen=True)
class Previous:
    deployment_id: str
    components: dict[str, dict[str, Any]]


@dataclass
class CanaryOutcome:
    promoted: bool
    verdict: Verdict
    canary: DeployReport  # the deployment to the canary group
    observed: Observed
    then: DeployReport  # the promotion to the target, or the canaries' rollback
    previous: Previous | None


def resolve_canary(text: str, target: Target) -> Target:
    """`--canary`: a thing group ARN (or a thing's), or a thing group's name in the target's account
    and region."""
    text = text.strip()
    canary = parse_target(text) if text.startswith("arn:") else None
    if canary is None:
        if not _GROUP_NAME.match(text):
            raise DeployError(f"--canary must be a thing group name or ARN, got {text!r}")
        canary = target.group(text)
    if canary.arn == target.arn:
        raise DeployError("--canary is the --target itself: give a smaller group of the target's devices")
    if canary.region != target.region:
        raise DeployError(f"--canary is in {canary.region}, the target in {target.region}: use one region")
    return canary


def previous_deployment(gg: Any, target: Target) -> Previous | None:
    """The deployment `target` has now (its latest), with its components as deployed."""
    found = [
        d
        for page in pages(gg.list_deployments, targetArn=target.arn, historyFilter="LATEST_ONLY")
        for d in page.get("deployments", [])
        if d.get("targetArn", target.arn) == target.arn
    ]
    if not found:
        return None
    latest = [d for d in found if d.get("isLatestForTarget")] or sorted(
        found, key=lambda d: d.get("creationTimestamp") or 0
    )[-1:]
    deployment_id = str(latest[0]["deploymentId"])
    got = gg.get_deployment(deploymentId=deployment_id)
    return Previous(deployment_id, {name: dict(spec) for name, spec in got.get("components", {}).items()})


def _versions(spec: Mapping[str, Mapping[str, Any]]) -> str:
    return ", ".join(f"{name} {entry['componentVersion']}" for name, entry in sorted(spec.items())) or "none"


def run_canary(
    gg: Any,
    source: WindowSource,
    target: Target,
    plan: CanaryPlan,
    components: Mapping[str, str],
    *,
    merges: Mapping[str, Mapping[str, Any]] | None = None,
    job: JobConfig = DEFAULT_JOB,
    deployment_name: str | None = None,
    wait: bool = False,
    timeout_s: float = 900.0,
    say: Say = lambda line: log.info("%s", line),
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> CanaryOutcome:
    """Deploy to `plan.canary`, watch, then promote to `target` or roll the canaries back."""
    previous = previous_deployment(gg, plan.canary)
    say(
        f"canary: {plan.canary.kind} {plan.canary.name} runs "
        + (
            f"deployment {previous.deployment_id} ({_versions(previous.components)})"
            if previous
            else "nothing"
        )
    )

    following = Following(timeout_s, say=say, clock=clock, sleep=sleep)

    def to(where: Target, spec: Mapping[str, Mapping[str, Any]], name: str, follow: bool) -> DeployReport:
        return deploy(gg, Deployment(where, spec, name, job), wait=follow, following=following)

    def roll_back(why: str) -> DeployReport:
        spec = previous.components if previous else {}
        say(f"canary: rolling {plan.canary.name} back to {_versions(spec)}: {why}")
        return to(plan.canary, spec, f"edgeinfer-{plan.canary.name}-rollback", wait)

    bundle = component_spec(components, merges)
    try:
        canary = to(plan.canary, bundle, f"edgeinfer-{plan.canary.name}-canary", True)
    except DeployError as exc:
        # Created but not followed to success: the group's deployment is the new one all the same
        # (a device that joins later would install it), so it goes back like a failed verdict.
        try:
            back = roll_back(str(exc))
        except Exception as again:
            raise DeployError(f"canary: {exc}; the rollback failed too: {again}; not promoted") from None
        raise DeployError(f"canary: {exc}; rolled back ({back.deployment_id}); not promoted") from None
    things = sorted(canary.statuses)
    say(
        f"canary: watching {len(things)} canary thing(s)' telemetry windows against the fleet's "
        f"for {plan.minutes:g} min"
    )
    observed = watch(
        source, things, duration_s=plan.minutes * 60, windows_per_thing=plan.windows_per_thing, clock=clock
    )
    verdict = compare(summarize(observed.canary), summarize(observed.fleet), plan.thresholds)
    say(
        f"canary: {len(observed.canary)} canary and {len(observed.fleet)} fleet windows in "
        f"{observed.seconds:.1f} s"
    )
    for note in verdict.notes:
        say(f"  {note}")
    if verdict.promote:
        say(f"canary: promoting to {target.kind} {target.name}")
        then = to(target, bundle, deployment_name or f"edgeinfer-{target.name}", wait)
    else:
        then = roll_back("; ".join(verdict.reasons))
    return CanaryOutcome(verdict.promote, verdict, canary, observed, then, previous)
