"""The fleet template's parameters: one table that the template, the renderer's flags and checks, and
docs/fleet.md's parameter table all read.

A value given to the renderer becomes that parameter's `Default` in the rendered template (still
overridable at deploy); a parameter with no default is asked for at deploy. The renderer checks a value
as CloudFormation will (allowed values, range, pattern), so a bad one fails here, before a stack does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edgeinfer.errors import EdgeinferError
from edgeinfer_cloud.policies import DEFAULT_ROUTER_GROUP

__all__ = [
    "INSTANCE_KINDS",
    "PARAMETERS",
    "FleetError",
    "Parameter",
    "Value",
    "check",
]

Value = str | int | float | Sequence[str]


class FleetError(EdgeinferError):
    """A fleet template cannot be rendered with the values given."""


# Instance type -> what it runs on: `gpu` (x86_64, NVIDIA: the Deep Learning AMI, CUDA provider),
# `x86` or `arm` (CPU only: Amazon Linux 2023 of that architecture, the CPU provider).
INSTANCE_KINDS: dict[str, str] = {
    **{f"g5.{size}": "gpu" for size in ("xlarge", "2xlarge", "4xlarge", "8xlarge")},
    **{f"g6.{size}": "gpu" for size in ("xlarge", "2xlarge", "4xlarge", "8xlarge")},
    **{f"c7i.{size}": "x86" for size in ("large", "xlarge", "2xlarge", "4xlarge", "8xlarge")},
    **{f"m7i.{size}": "x86" for size in ("large", "xlarge", "2xlarge", "4xlarge")},
    **{f"c7g.{size}": "arm" for size in ("large", "xlarge", "2xlarge", "4xlarge", "8xlarge")},
}

_SSM_IMAGE = "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>"


@dataclass(frozen=True)
class Parameter:
    """One CloudFormation parameter, with the constraints CloudFormation itself enforces."""

    name: str
    type: str
    description: str
    default: Value | None = None
    allowed_values: tuple[str, ...] = ()
    min_value: float | None = None
    max_value: float | None = None
    pattern: str | None = None
    constraint: str = ""  # CloudFormation's ConstraintDescription: what to say when a check fails

    @property
    def flag(self) -> str:
        """The renderer's option for this parameter: `InstanceType` -> `--instance-type`."""
        return "--" + re.sub(r"(?<!^)(?=[A-Z])", "-", self.name).lower()

    @property
    def is_number(self) -> bool:
        return self.type == "Number"

    @property
    def is_list(self) -> bool:
        return self.type.startswith("List<")

    def to_cloudformation(self, default: Value | None) -> dict[str, Any]:
        out: dict[str, Any] = {"Type": self.type, "Description": self.description}
        if default is not None:
            out["Default"] = ",".join(default) if isinstance(default, list | tuple) else default
        if self.allowed_values:
            out["AllowedValues"] = list(self.allowed_values)
        if self.min_value is not None:
            out["MinValue"] = self.min_value
        if self.max_value is not None:
            out["MaxValue"] = self.max_value
        if self.pattern is not None and self.type == "String":  # the AWS-specific types check their own
            out["AllowedPattern"] = self.pattern
        if self.constraint:
            out["ConstraintDescription"] = self.constraint
        return out

    def check(self, value: Value) -> Value:
        """The value as the template holds it, or FleetError naming the flag and what it takes."""
        if self.is_number:
            return self._check_number(value)
        if isinstance(value, int | float):
            value = str(value)
        items = [value] if isinstance(value, str) else list(value)
        if self.is_list and not items:
            raise FleetError(f"{self.flag}: give at least one value")
        for item in items:
            if self.allowed_values and item not in self.allowed_values:
                raise FleetError(f"{self.flag}: {item!r} is not one of {', '.join(self.allowed_values)}")
            if self.pattern is not None and not re.fullmatch(self.pattern, item):
                raise FleetError(f"{self.flag}: {item!r} is not {self.constraint or self.pattern}")
        return items if self.is_list else items[0]

    def _check_number(self, value: Value) -> Value:
        try:
            number = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise FleetError(f"{self.flag}: not a number: {value!r}") from None
        low = -float("inf") if self.min_value is None else self.min_value
        high = float("inf") if self.max_value is None else self.max_value
        if not low <= number <= high:
            raise FleetError(f"{self.flag}: {value} is out of range ({self.constraint})")
        return int(number) if number.is_integer() else number


_NAME = r"[A-Za-z0-9_-]{1,64}"
_ARN_PARTITION = r"arn:aws(-cn|-us-gov)?"

PARAMETERS: tuple[Parameter, ...] = (
    Parameter(
        "FleetName",
        "String",
        "Names the fleet: the value of the routers' CloudWatch dimension Fleet, and the prefix of the "
        "router's IoT thing and client ids",
        default="edgeinfer",
        pattern=_NAME,
        constraint="letters, digits, _ and -, at most 64",
    ),
    Parameter(
        "RouterGroup",
        "String",
        "The routers' shared-subscription group ($share/GROUP/edgeinfer/+/offload)",
        default=DEFAULT_ROUTER_GROUP,
        pattern=r"[A-Za-z0-9_-]{1,128}",
        constraint="letters, digits, _ and -",
    ),
    Parameter(
        "InstanceType",
        "String",
        "EC2 instance type of a router: g5/g6 run the CUDA provider on the Deep Learning AMI; c7i/m7i "
        "(x86) and c7g (Graviton) the CPU provider on Amazon Linux 2023",
        default="c7i.xlarge",
        allowed_values=tuple(INSTANCE_KINDS),
    ),
    Parameter(
        "MinSize",
        "Number",
        "Fewest routers (at least one: with none subscribed, the devices' offloads go unanswered)",
        default=1,
        min_value=1,
        max_value=100,
        constraint="1 to 100",
    ),
    Parameter(
        "MaxSize",
        "Number",
        "Most routers the fleet scales out to",
        default=4,
        min_value=1,
        max_value=100,
        constraint="1 to 100",
    ),
    Parameter(
        "DesiredCapacity",
        "Number",
        "Routers at creation; scaling moves it between MinSize and MaxSize",
        default=1,
        min_value=1,
        max_value=100,
        constraint="1 to 100",
    ),
    Parameter(
        "TargetBusyShare",
        "Number",
        "Target tracking keeps the fleet's average BusyShare (the percent of time a router's engine is "
        "busy) near this value",
        default=60,
        min_value=5,
        max_value=95,
        constraint="5 to 95 (percent)",
    ),
    Parameter(
        "ConnectionsPerRouter",
        "Number",
        "MQTT connections each router holds in the shared subscription (each is paced under IoT Core's "
        "per-connection limits)",
        default=4,
        min_value=1,
        max_value=50,
        constraint="1 to 50",
    ),
    Parameter(
        "BacklogAlarmThreshold",
        "Number",
        "Alarm when a router's Backlog (requests waiting) stays above this",
        default=200,
        min_value=1,
        constraint="at least 1",
    ),
    Parameter(
        "AlarmEmail",
        "String",
        "Email subscribed to the alarms' SNS topic; empty: no topic, the alarms only show in CloudWatch",
        default="",
        pattern=r"|[^@\s]+@[^@\s]+\.[^@\s]+",
        constraint="an email address, or empty",
    ),
    Parameter(
        "IotEndpoint",
        "String",
        "The account's AWS IoT data endpoint (aws iot describe-endpoint --endpoint-type iot:Data-ATS)",
        pattern=r"[a-z0-9]+(-ats)?\.iot\.[a-z0-9-]+\.amazonaws\.com(\.cn)?",
        constraint="an AWS IoT data endpoint, xxxx-ats.iot.REGION.amazonaws.com",
    ),
    Parameter(
        "RouterCertificateArn",
        "String",
        "ARN of the routers' AWS IoT certificate (the stack attaches the router policy and thing to it)",
        pattern=_ARN_PARTITION + r":iot:[a-z0-9-]+:\d{12}:cert/[0-9a-f]{64}",
        constraint="an AWS IoT certificate ARN",
    ),
    Parameter(
        "RouterCertificateSecretArn",
        "String",
        "ARN of the Secrets Manager secret holding that certificate and its private key as JSON "
        '{"certificatePem": ..., "privateKey": ...}; only the routers\' instance role may read it',
        pattern=_ARN_PARTITION + r":secretsmanager:[a-z0-9-]+:\d{12}:secret:[A-Za-z0-9/_+=.@-]+",
        constraint="a Secrets Manager secret ARN",
    ),
    Parameter(
        "ArtifactBucket",
        "String",
        "S3 bucket holding the edgeinfer wheel and the model store",
        pattern=r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]",
        constraint="an S3 bucket name",
    ),
    Parameter(
        "RouterWheelKey",
        "String",
        "Key of the edgeinfer wheel in ArtifactBucket (pip wheel --no-deps . ; keep the wheel's file name)",
        pattern=r"[A-Za-z0-9!_.*'()/+-]+\.whl",
        constraint="an S3 key ending in .whl",
    ),
    Parameter(
        "ModelPrefix",
        "String",
        "Key prefix of the model store in ArtifactBucket (the folder holding manifest.json), ending in /",
        pattern=r"[A-Za-z0-9!_.*'()/-]+/",
        constraint="an S3 key prefix ending in /",
    ),
    Parameter(
        "VpcId",
        "AWS::EC2::VPC::Id",
        "VPC of the routers' security group (no inbound rules)",
        pattern=r"vpc-[0-9a-f]{8,17}",
        constraint="a VPC id, vpc-...",
    ),
    Parameter(
        "Subnets",
        "List<AWS::EC2::Subnet::Id>",
        "Subnets of VpcId the routers run in (private, with a NAT or VPC endpoints: they only connect out)",
        pattern=r"subnet-[0-9a-f]{8,17}",
        constraint="subnet ids, subnet-...",
    ),
    Parameter(
        "GpuImageId",
        _SSM_IMAGE,
        "AMI of GPU instances: the SSM parameter of the Deep Learning Base OSS Nvidia Driver GPU AMI",
        default="/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-amazon-linux-2023/latest/ami-id",
    ),
    Parameter(
        "X86ImageId",
        _SSM_IMAGE,
        "AMI of x86 CPU instances: the SSM parameter of Amazon Linux 2023",
        default="/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64",
    ),
    Parameter(
        "ArmImageId",
        _SSM_IMAGE,
        "AMI of Graviton CPU instances: the SSM parameter of Amazon Linux 2023 for arm64",
        default="/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-arm64",
    ),
)

_BY_NAME = {p.name: p for p in PARAMETERS}


def check(values: Mapping[str, Value]) -> dict[str, Value]:
    """Every value checked as CloudFormation will, and MinSize <= DesiredCapacity <= MaxSize over the
    values given merged onto the defaults (DesiredCapacity, unless given, moved inside MinSize and
    MaxSize). Raises FleetError on the first bad one."""
    unknown = sorted(set(values) - set(_BY_NAME))
    if unknown:
        raise FleetError(f"unknown fleet parameter(s): {', '.join(unknown)}")
    checked = {name: _BY_NAME[name].check(value) for name, value in values.items()}
    sizes = {
        name: checked.get(name, _BY_NAME[name].default) for name in ("MinSize", "DesiredCapacity", "MaxSize")
    }
    low, desired, high = (float(v) for v in sizes.values())  # type: ignore[arg-type]
    if "DesiredCapacity" not in checked and low <= high and not low <= desired <= high:  # not asked for
        checked["DesiredCapacity"] = sizes["DesiredCapacity"] = int(min(max(desired, low), high))
        desired = float(checked["DesiredCapacity"])  # type: ignore[arg-type]
    if not low <= desired <= high:
        raise FleetError(
            f"sizes must keep --min-size <= --desired-capacity <= --max-size, not "
            f"{sizes['MinSize']} / {sizes['DesiredCapacity']} / {sizes['MaxSize']}"
        )
    return checked
