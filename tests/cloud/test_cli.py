"""`edgeinfer cloud`: one entry point adds the group and all its commands, whatever else registers."""

from __future__ import annotations

import argparse

from edgeinfer_cloud.cli import register


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def test_the_group_holds_router_policy_fleet_template_under_the_routers_description() -> None:
    parser = argparse.ArgumentParser(prog="edgeinfer")
    register(parser.add_subparsers())
    cloud = _commands(parser)["cloud"]
    assert cloud.description is not None
    assert cloud.description.startswith("Cloud side: the hybrid router")
    assert list(_commands(cloud)) == ["router", "policy", "fleet-template"]
