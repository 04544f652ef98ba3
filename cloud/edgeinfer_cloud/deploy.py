"""`edgeinfer deploy`: one Greengrass deployment of the bundle's component versions to a core device
or a thing group, with optional configuration merges, optionally following it to the end.

For a thing target the status is the device's own (`list_effective_deployments`); for a thing group,
every core device in the group is followed. The deployment rolls back on failure
(`failureHandlingPolicy: ROLLBACK`), so a failed deployment leaves devices as they were.
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
    "DeployError",
    "DeployReport",
    "Target",
    "deploy",
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


class DeployError(EdgeinferError):
    """The deployment could not be created, or it did not succeed: one line saying why."""


@dataclass(frozen=True)
class Target:
    arn: str
    region: str
    kind: str  # "thing" | "thinggroup"
    name: str


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
    return Target(arn=arn.strip(), region=m["region"], kind=m["kind"], name=m["name"])


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


def _pages(call: Callable[..., Any], **kwargs: Any) -> Iterator[dict[str, Any]]:
    """Every page of a paginated greengrassv2 list call (following `nextToken`)."""
    token: str | None = None
    while True:
        page = call(**kwargs, nextToken=token) if token else call(**kwargs)
        yield page
        token = page.get("nextToken")
        if not token:
            return


def _devices(gg: Any, target: Target) -> list[str]:
    if target.kind == "thing":
        return [target.name]
    return [
        d["coreDeviceThingName"]
        for page in _pages(gg.list_core_devices, thingGroupArn=target.arn)
        for d in page.get("coreDevices", [])
    ]


def _device_status(gg: Any, device: str, deployment_id: str) -> tuple[str, str]:
    for page in _pages(gg.list_effective_deployments, coreDeviceThingName=device):
        for entry in page.get("effectiveDeployments", []):
            if entry.get("deploymentId") == deployment_id:
                reason = entry.get("reason", "") or entry.get("description", "")
                return str(entry.get("coreDeviceExecutionStatus", "QUEUED")), str(reason)
    return "QUEUED", ""


def deploy(
    gg: Any,
    target: Target,
    components: Mapping[str, str],
    *,
    merges: Mapping[str, Mapping[str, Any]] | None = None,
    deployment_name: str | None = None,
    wait: bool = False,
    timeout_s: float = 900.0,
    poll_s: float = 5.0,
    say: Say = lambda line: log.info("%s", line),
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> DeployReport:
    """Create the deployment (and with `wait`, follow it until every device reports an end state)."""
    merges = merges or {}
    spec: dict[str, Any] = {}
    for name, version in components.items():
        entry: dict[str, Any] = {"componentVersion": version}
        if name in merges:
            entry["configurationUpdate"] = {"merge": json.dumps(merges[name], separators=(",", ":"))}
        spec[name] = entry
    response = gg.create_deployment(
        targetArn=target.arn,
        deploymentName=deployment_name or f"edgeinfer-{target.name}",
        components=spec,
        deploymentPolicies={
            "failureHandlingPolicy": "ROLLBACK",
            "componentUpdatePolicy": {"timeoutInSeconds": 60, "action": "NOTIFY_COMPONENTS"},
            "configurationValidationPolicy": {"timeoutInSeconds": 30},
        },
        clientToken=str(uuid.uuid4()),
    )
    deployment_id = str(response["deploymentId"])
    report = DeployReport(deployment_id=deployment_id, target=target, components=dict(components))
    say(f"deployment {deployment_id} created for {target.kind} {target.name}")
    if not wait:
        return report

    deadline = clock() + timeout_s
    devices = _devices(gg, target)
    if not devices:
        raise DeployError(f"thing group {target.name} has no Greengrass core devices to follow")
    pending = set(devices)
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
        sleep(poll_s)
    failed = {d: s for d, s in report.statuses.items() if s not in SUCCEEDED}
    if failed:
        detail = "; ".join(
            f"{d}: {s}{f' ({reasons[d]})' if reasons.get(d) else ''}" for d, s in failed.items()
        )
        raise DeployError(f"deployment {deployment_id} did not succeed: {detail}")
    return report
