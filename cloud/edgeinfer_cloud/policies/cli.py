"""`edgeinfer cloud policy`: print an AWS IoT policy document rendered from `cloud/policies/`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from edgeinfer.files import write_output
from edgeinfer_cloud.policies import (
    DEFAULT_ROLE_ALIAS,
    DEFAULT_ROUTER_GROUP,
    TEMPLATES,
    THING_VARIABLE,
    render,
)

_EPILOG = """\
templates:
  core-device    a Greengrass core running the bundle: its own nucleus topics, the data plane, the
                 token-exchange role alias and its own edgeinfer/{thing}/... topics
  cloud-router   the router: the shared subscription to edgeinfer/+/offload and the answers on
                 edgeinfer/+/offload/result

examples:
  edgeinfer cloud policy core-device --region eu-west-1 --account 123456789012 > core.json
  aws iot create-policy --policy-name edgeinfer-core --policy-document file://core.json
  edgeinfer cloud policy core-device --region eu-west-1 --account 123456789012 --thing cam-1
  edgeinfer cloud policy cloud-router --region eu-west-1 --account 123456789012 --router-group g1
"""


def register(subparsers: Any) -> None:
    p = cloud_commands(subparsers).add_parser(
        "policy",
        help="print an AWS IoT policy (core device or router) for a region and account",
        description=(
            "Print a least-privilege AWS IoT policy document as JSON, with the region, account, role\n"
            "alias and router group filled in. By default one policy serves the whole fleet: AWS IoT\n"
            f"resolves {THING_VARIABLE} to the connecting thing. --thing pins it\n"
            "to one thing name instead."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "template", choices=list(TEMPLATES), metavar="TEMPLATE", help="core-device or cloud-router (below)"
    )
    p.add_argument("--region", required=True, help="AWS region of the IoT endpoint, e.g. eu-west-1")
    p.add_argument("--account", required=True, help="12-digit AWS account id")
    p.add_argument(
        "--thing",
        metavar="NAME",
        help=f"pin the policy to this thing name instead of {THING_VARIABLE} (default: the whole fleet)",
    )
    p.add_argument(
        "--role-alias",
        default=DEFAULT_ROLE_ALIAS,
        help=f"token-exchange role alias of the core device (default: {DEFAULT_ROLE_ALIAS})",
    )
    p.add_argument(
        "--router-group",
        default=DEFAULT_ROUTER_GROUP,
        help=f"the routers' shared-subscription group, their --group (default: {DEFAULT_ROUTER_GROUP})",
    )
    p.add_argument("-o", "--out", type=Path, help="write the JSON to this file instead of stdout")
    p.set_defaults(func=run_policy)


def cloud_commands(subparsers: Any) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    """The subcommands of `edgeinfer cloud` (registered by the router's CLI; created if it is absent)."""
    cloud: argparse.ArgumentParser | None = subparsers.choices.get("cloud")
    if cloud is None:
        created: argparse.ArgumentParser = subparsers.add_parser(
            "cloud", help="cloud side", description="Cloud side."
        )
        created.set_defaults(func=lambda _args: _usage(created))
        cloud = created
    for action in cloud._actions:  # argparse keeps a parser's subcommands only here
        if isinstance(action, argparse._SubParsersAction):
            return action
    return cloud.add_subparsers(dest="cloud_command", metavar="COMMAND")


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def run_policy(args: argparse.Namespace) -> int:
    policy = render(
        args.template,
        region=args.region,
        account=args.account,
        role_alias=args.role_alias,
        router_group=args.router_group,
        thing=args.thing,
    )
    text = json.dumps(policy, indent=2) + "\n"
    if args.out is not None:
        write_output(args.out, text.encode())
    else:
        sys.stdout.write(text)
    return 0
