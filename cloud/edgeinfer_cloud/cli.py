"""`edgeinfer cloud`: the router's command, which adds the group, then the policies' and the fleet
template's beside it.

One entry point for the group, so that the order the two register in is written here rather than
left to the order entry points are read in.
"""

from __future__ import annotations

from typing import Any

from edgeinfer_cloud.fleet import cli as fleet_cli
from edgeinfer_cloud.policies import cli as policies_cli
from edgeinfer_cloud.router import cli as router_cli


def register(subparsers: Any) -> None:
    router_cli.register(subparsers)  # adds `cloud`, its help, and `cloud router`
    policies_cli.register(subparsers)  # `cloud policy`, under the group above
    fleet_cli.register(subparsers)  # `cloud fleet-template`, under it too
