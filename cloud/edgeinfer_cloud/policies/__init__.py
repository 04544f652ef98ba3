"""Least-privilege AWS IoT policy templates for the core device and the cloud router.

`core-device.json`: what a Greengrass core running the edgeinfer bundle needs, and nothing more: the
nucleus's own topics (jobs, shadow, health), the Greengrass data plane, its token-exchange role
alias, and the edgeinfer topics of `edgeinfer.messages`, all scoped to its own thing name with the policy
variable `${iot:Connection.Thing.ThingName}` (one policy serves the whole fleet).

`cloud-router.json`: the router's shared subscription `$share/<group>/edgeinfer/+/offload`, receiving
offloaded requests from any device and publishing `edgeinfer/+/offload/result`.

Placeholders `<REGION>`, `<ACCOUNT_ID>`, `<TOKEN_EXCHANGE_ROLE_ALIAS>` and `<ROUTER_GROUP>` are filled
by `render()`; no account id is stored here. `render(..., thing=NAME)` pins a policy to one thing
instead of the policy variable. `edgeinfer cloud policy` prints one; attach it with, e.g.
`aws iot create-policy --policy-name edgeinfer-core --policy-document file://core.json`.
`for_cloudformation()` gives the same document for a CloudFormation template (the fleet's), the
region, account and partition left to the stack's pseudo parameters.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from edgeinfer.errors import EdgeinferError

__all__ = [
    "DEFAULT_ROLE_ALIAS",
    "DEFAULT_ROUTER_GROUP",
    "TEMPLATES",
    "THING_VARIABLE",
    "PolicyError",
    "for_cloudformation",
    "partition_for",
    "render",
    "template",
]

TEMPLATES = {"core-device": "core-device.json", "cloud-router": "cloud-router.json"}
THING_VARIABLE = "${iot:Connection.Thing.ThingName}"
DEFAULT_ROLE_ALIAS = "GreengrassV2TokenExchangeRoleAlias"  # what the Greengrass installer creates
DEFAULT_ROUTER_GROUP = "edgeinfer-router"  # the router's default --group
_HERE = Path(__file__).parent
_PLACEHOLDER = re.compile(r"<[A-Z_]+>")


class PolicyError(EdgeinferError):
    """A policy template cannot be rendered with the values given."""


def partition_for(region: str) -> str:
    """The ARN partition of a region: `aws-cn` for China, `aws-us-gov` for GovCloud, else `aws`."""
    if region.startswith("cn-"):
        return "aws-cn"
    if region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"


def template(name: str) -> dict[str, Any]:
    if name not in TEMPLATES:
        raise PolicyError(f"unknown policy template {name!r} (one of {', '.join(TEMPLATES)})")
    data: dict[str, Any] = json.loads((_HERE / TEMPLATES[name]).read_text(encoding="utf-8"))
    return data


def render(
    name: str,
    *,
    region: str,
    account: str,
    role_alias: str = DEFAULT_ROLE_ALIAS,
    router_group: str = DEFAULT_ROUTER_GROUP,
    thing: str | None = None,
) -> dict[str, Any]:
    """The policy document with every placeholder filled. The thing-name policy variable stays for
    AWS IoT to resolve (one policy for the fleet) unless `thing` pins the policy to that one thing."""
    if not re.fullmatch(r"[a-z]{2}(-gov)?-[a-z]+-\d", region):
        raise PolicyError(f"not an AWS region: {region!r}")
    if not re.fullmatch(r"\d{12}", account):
        raise PolicyError(f"not an AWS account id (12 digits): {account!r}")
    if not re.fullmatch(r"[\w=,@-]{1,128}", role_alias):
        raise PolicyError(f"not a role alias name: {role_alias!r}")
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,128}", router_group):
        raise PolicyError(f"not a shared-subscription group name: {router_group!r}")
    if thing is not None and not re.fullmatch(r"[A-Za-z0-9:_-]{1,128}", thing):
        raise PolicyError(f"not an AWS IoT thing name (letters, digits, : _ -): {thing!r}")
    text = json.dumps(template(name))
    for key, value in {
        "<REGION>": region,
        "<ACCOUNT_ID>": account,
        "<TOKEN_EXCHANGE_ROLE_ALIAS>": role_alias,
        "<ROUTER_GROUP>": router_group,
    }.items():
        text = text.replace(key, value)
    text = text.replace("arn:aws:", f"arn:{partition_for(region)}:")
    if thing is not None:
        text = text.replace(THING_VARIABLE, thing)
    left = _PLACEHOLDER.findall(text)
    if left:
        raise PolicyError(f"policy {name} still has placeholders: {', '.join(sorted(set(left)))}")
    data: dict[str, Any] = json.loads(text)
    return data


def for_cloudformation(name: str, *, router_group: str, role_alias: str | None = None) -> dict[str, Any]:
    """The policy document for an `AWS::IoT::Policy` resource: every string that names a placeholder
    or an ARN becomes an `Fn::Sub` on the stack's own region, account and partition, and
    `router_group` / `role_alias` (a literal, or `${Parameter}` to take a template parameter). IoT
    policy variables stay for AWS IoT to resolve (`${!...}`: Fn::Sub's escape for a literal `${`)."""
    values = {
        "<REGION>": "${AWS::Region}",
        "<ACCOUNT_ID>": "${AWS::AccountId}",
        "<ROUTER_GROUP>": router_group,
    }
    if role_alias is not None:
        values["<TOKEN_EXCHANGE_ROLE_ALIAS>"] = role_alias

    def sub(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: sub(item) for key, item in value.items()}
        if isinstance(value, list):
            return [sub(item) for item in value]
        if not isinstance(value, str) or not (_PLACEHOLDER.search(value) or "arn:aws:" in value):
            return value
        text = value.replace("${", "${!").replace("arn:aws:", "arn:${AWS::Partition}:")
        for key, replacement in values.items():
            text = text.replace(key, replacement)
        left = _PLACEHOLDER.findall(text)
        if left:
            raise PolicyError(f"policy {name} still has placeholders: {', '.join(sorted(set(left)))}")
        return {"Fn::Sub": text}

    document: dict[str, Any] = sub(template(name))
    return document
