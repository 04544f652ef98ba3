"""`edgeinfer deploy`: one Greengrass deployment of the bundle's component versions to a core device
or a thing group, with optional configuration merges, optionally following it to the end.

For a thing target the status is the device's own (`list_effective_deployments`); for a thing group,
every core device in the group is followed. The deployment rolls back on failure
(`failureHandlingPolicy: ROLLBACK`), so a failed deployment leaves devices as they were. Every
deployment carries an `iotJobConfiguration` (`JobConfig`): how fast it reaches the target's devices,
when the job cancels itself because too many of them failed, and how long one device may take. The
quality canary (`edgeinfer_cloud.canary`) builds on `deploy` and `follow`.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from edgeinfer.errors import EdgeinferError

__all__ = [
    "ABORT_TYPES",
    "DEFAULT_JOB",
    "FOLLOWING",
    "AbortCriterion",
    "DeployError",
    "DeployReport",
    "Deployment",
    "Following",
    "JobConfig",
    "Target",
    "component_spec",
    "deploy",
    "devices",
    "follow",
    "pages",
    "parse_abort",
    "parse_config_merge",
    "parse_target",
]

log = logging.getLogger(__name__)

Say = Callable[[str], None]

_TARGET_RE = re.compile(
    r"^arn:(?P<partition>aws[a-z-]*):iot:(?P<region>[a-z0-9-]+):(?P<account>\d{12}):"
    r"(?P<kind>thing|thinggroup)/(?P<name>[A-Za-z0-9:_-]+)$"
)
SUCCEEDED = {"SUCCEEDED", "COMPLETED"}
TERMINAL = SUCCEEDED | {"FAILED", "REJECTED", "TIMED_OUT", "CANCELED"}
ABORT_TYPES = ("FAILED", "REJECTED", "TIMED_OUT", "ALL")
"""The job execution outcomes an abort criterion counts (ALL: any of the three)."""


class DeployError(EdgeinferError):
    """The deployment could not be created, or it did not succeed: one line saying why."""


@dataclass(frozen=True)
class Target:
    arn: str
    region: str
    kind: str  # "thing" | "thinggroup"
    name: str
    account: str = ""
    partition: str = "aws"

    def group(self, name: str) -> Target:
        """The thing group `name` in this target's partition, region and account."""
        return parse_target(f"arn:{self.partition}:iot:{self.region}:{self.account}:thinggroup/{name}")


@dataclass(frozen=True)
class AbortCriterion:
    """Cancel the job once `percent` of its executions ended as `failure_type`, counted only after
    `min_things` devices ran it (so the first failure of a large fleet does not stop it alone)."""

    failure_type: str  # one of ABORT_TYPES
    percent: float
    min_things: int = 5

    def to_api(self) -> dict[str, Any]:
        return {
            "failureType": self.failure_type,
            "action": "CANCEL",
            "thresholdPercentage": self.percent,
            "minNumberOfExecutedThings": self.min_things,
        }


@dataclass(frozen=True)
class JobConfig:
    """Greengrass's `iotJobConfiguration`. The defaults start slowly (`start_per_minute` devices a
    minute), multiply the rate by `increment_factor` each time `increase_after` more devices succeeded,
    up to `max_per_minute`; cancel once a tenth of the executed devices failed in any way (after five);
    and give a device `timeout_minutes` in progress (downloading the model store included)."""

    max_per_minute: int = 50
    start_per_minute: int = 5
    increment_factor: float = 2.0
    increase_after: int = 5
    abort: tuple[AbortCriterion, ...] = (AbortCriterion("ALL", 10.0, 5),)
    timeout_minutes: int = 60

    def check(self) -> None:
        """Raise `DeployError` for what the service model would refuse, naming the option."""
        _within("--rollout-max", self.max_per_minute, 1, 1000)
        _within("--rollout-start", self.start_per_minute, 1, self.max_per_minute)
        _within("--rollout-factor", self.increment_factor, 1, 5)
        _within("--rollout-step", self.increase_after, 1, None)
        _within("--job-timeout", self.timeout_minutes, 1, 10080)
        for criterion in self.abort:
            if criterion.failure_type not in ABORT_TYPES:
                raise DeployError(f"--abort: {criterion.failure_type} is not one of {', '.join(ABORT_TYPES)}")
            _within(f"--abort {criterion.failure_type}", criterion.percent, 0.01, 100)
            _within("--abort-min-things", criterion.min_things, 1, None)

    def to_api(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "jobExecutionsRolloutConfig": {
                "maximumPerMinute": self.max_per_minute,
                "exponentialRate": {
                    "baseRatePerMinute": self.start_per_minute,
                    "incrementFactor": self.increment_factor,
                    "rateIncreaseCriteria": {"numberOfSucceededThings": self.increase_after},
                },
            },
            "timeoutConfig": {"inProgressTimeoutInMinutes": self.timeout_minutes},
        }
        if self.abort:
            config["abortConfig"] = {"criteriaList": [c.to_api() for c in self.abort]}
        return config


DEFAULT_JOB = JobConfig()


def _within(option: str, value: float, low: float, high: float | None) -> None:
    if value < low or (high is not None and value > high):
        span = f"between {low:g} and {high:g}" if high is not None else f"at least {low:g}"
        raise DeployError(f"{option} must be {span}, got {value:g}")


def parse_abort(items: Sequence[str], min_things: int) -> tuple[AbortCriterion, ...]:
    """`TYPE=PERCENT` items (`ALL=10`, `TIMED_OUT=25`) → abort criteria; `none` alone → none."""
    if list(items) == ["none"]:
        return ()
    criteria: list[AbortCriterion] = []
    for item in items:
        kind, sep, text = item.partition("=")
        kind = kind.strip().upper()
        if not sep or kind not in ABORT_TYPES:
            raise DeployError(
                f"--abort expects TYPE=PERCENT with TYPE one of {', '.join(ABORT_TYPES)}, got {item!r}"
            )
        try:
            percent = round(float(text), 2)  # the service takes two decimals
        except ValueError:
            raise DeployError(f"--abort {kind}: {text!r} is not a percentage") from None
        criteria.append(AbortCriterion(kind, percent, min_things))
    return tuple(criteria)


@dataclass
class DeployReport:
    deployment_id: str
    target: Target
    components: dict[str, str]
    statuses: dict[str, str] = field(default_factory=dict)  # device → status


def parse_target(arn: str) -> Target:
    m = _TARGET_RE.match(arn.strip())
    if not m:
        raise DeployError(
            f"--target must be a thing or thing group ARN "
            f"(arn:aws:iot:REGION:ACCOUNT:thing/NAME or .../thinggroup/NAME), got {arn!r}"
        )
    return Target(
        arn=arn.strip(),
        region=m["region"],
        kind=m["kind"],
        name=m["name"],
        account=m["account"],
        partition=m["partition"],
    )


def parse_config_merge(
    items: Sequence[str], components: Sequence[str] | None = None
) -> dict[str, dict[str, Any]]:
    """`COMPONENT=JSON` items → component → configuration object to merge (`deploy`, `sim up`).

    With `components`, a name outside them is refused here; without, the caller checks names.
    """
    merges: dict[str, dict[str, Any]] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise DeployError(f"--config-merge expects COMPONENT=JSON, got {item!r}")
        if components is not None and name not in components:
            raise DeployError(f"--config-merge: {name} is not in the bundle ({', '.join(components)})")
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DeployError(
                f"--config-merge {name}: not valid JSON ({exc.msg} at column {exc.colno})"
            ) from None
        if not isinstance(value, dict):
            raise DeployError(f"--config-merge {name}: the JSON must be an object")
        merges[name] = {**merges.get(name, {}), **value}
    return merges


def pages(call: Callable[..., Any], **kwargs: Any) -> Iterator[dict[str, Any]]:
    """Every page of a paginated greengrassv2 list call (following `nextToken`)."""
    token: str | None = None
    while True:
        page = call(**kwargs, nextToken=token) if token else call(**kwargs)
        yield page
        token = page.get("nextToken")
        if not token:
            return


def devices(gg: Any, target: Target) -> list[str]:
    """The core devices a deployment to `target` reaches: the thing itself, or every core device of
    the thing group."""
    if target.kind == "thing":
        return [target.name]
    return [
        d["coreDeviceThingName"]
        for page in pages(gg.list_core_devices, thingGroupArn=target.arn)
        for d in page.get("coreDevices", [])
    ]


def _device_status(gg: Any, device: str, deployment_id: str) -> tuple[str, str]:
    for page in pages(gg.list_effective_deployments, coreDeviceThingName=device):
        for entry in page.get("effectiveDeployments", []):
            if entry.get("deploymentId") == deployment_id:
                reason = entry.get("reason", "") or entry.get("description", "")
                return str(entry.get("coreDeviceExecutionStatus", "QUEUED")), str(reason)
    return "QUEUED", ""


def component_spec(
    components: Mapping[str, str], merges: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[str, dict[str, Any]]:
    """Component name → version → the deployment's `components` (with each configuration merge)."""
    merges = merges or {}
    spec: dict[str, dict[str, Any]] = {}
    for name, version in components.items():
        entry: dict[str, Any] = {"componentVersion": version}
        if name in merges:
            entry["configurationUpdate"] = {"merge": json.dumps(merges[name], separators=(",", ":"))}
        spec[name] = entry
    return spec


def _say_in_log(line: str) -> None:
    log.info("%s", line)


@dataclass(frozen=True)
class Deployment:
    """One CreateDeployment request, its fields named after the API's: `targetArn` (from `target`),
    `components` as the API takes them (`component_spec`, or a previous deployment's, redeployed as it
    was with its merges and `runWith`), `deploymentName` (default `edgeinfer-<target name>`) and
    `iotJobConfiguration`. Every deployment rolls back on failure and lets components defer it."""

    target: Target
    components: Mapping[str, Mapping[str, Any]]
    deployment_name: str | None = None
    iot_job_configuration: JobConfig = DEFAULT_JOB

    def to_api(self) -> dict[str, Any]:
        """The CreateDeployment parameters (a new client token each time)."""
        return {
            "targetArn": self.target.arn,
            "deploymentName": self.deployment_name or f"edgeinfer-{self.target.name}",
            "components": {name: dict(entry) for name, entry in self.components.items()},
            "iotJobConfiguration": self.iot_job_configuration.to_api(),
            "deploymentPolicies": {
                "failureHandlingPolicy": "ROLLBACK",
                "componentUpdatePolicy": {"timeoutInSeconds": 60, "action": "NOTIFY_COMPONENTS"},
                "configurationValidationPolicy": {"timeoutInSeconds": 30},
            },
            "clientToken": str(uuid.uuid4()),
        }


@dataclass(frozen=True)
class Following:
    """How a deployment is followed (`follow`): for at most `timeout_s`, asking every `poll_s`; `say`
    gets each line of progress (the creation's too)."""

    timeout_s: float = 900.0
    poll_s: float = 5.0
    say: Say = _say_in_log
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


FOLLOWING = Following()


def deploy(
    gg: Any, deployment: Deployment, *, wait: bool = False, following: Following = FOLLOWING
) -> DeployReport:
    """Create the deployment (and with `wait`, follow it until every device reports an end state)."""
    target = deployment.target
    response = gg.create_deployment(**deployment.to_api())
    deployment_id = str(response["deploymentId"])
    versions = {name: str(entry["componentVersion"]) for name, entry in deployment.components.items()}
    report = DeployReport(deployment_id=deployment_id, target=target, components=versions)
    following.say(f"deployment {deployment_id} created for {target.kind} {target.name}")
    if wait:
        follow(gg, report, following)
    return report


def follow(gg: Any, report: DeployReport, following: Following = FOLLOWING) -> None:
    """Follow `report`'s deployment until every device reports an end state (into `report.statuses`);
    raise `DeployError` when one did not succeed or the time is up."""
    target, deployment_id = report.target, report.deployment_id
    timeout_s, say, clock = following.timeout_s, following.say, following.clock
    deadline = clock() + timeout_s
    found = devices(gg, target)
    if not found:
        raise DeployError(f"thing group {target.name} has no Greengrass core devices to follow")
    pending = set(found)
    reasons: dict[str, str] = {}
    while pending:
        for device in sorted(pending):
            status, reason = _device_status(gg, device, deployment_id)
            if status != report.statuses.get(device):
                say(f"  {device}: {status}{f' ({reason})' if reason else ''}")
            report.statuses[device] = status
            if status in TERMINAL:
                pending.discard(device)
                reasons[device] = reason
        if not pending:
            break
        if clock() >= deadline:
            states = ", ".join(f"{d}: {report.statuses.get(d, 'QUEUED')}" for d in sorted(pending))
            raise DeployError(f"deployment {deployment_id} not finished after {timeout_s:.0f} s ({states})")
        following.sleep(following.poll_s)
    failed = {d: s for d, s in report.statuses.items() if s not in SUCCEEDED}
    if failed:
        detail = "; ".join(
            f"{d}: {s}{f' ({reasons[d]})' if reasons.get(d) else ''}" for d, s in failed.items()
        )
        raise DeployError(f"deployment {deployment_id} did not succeed: {detail}")
