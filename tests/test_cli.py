"""The `edgeinfer` command line as a whole: every subcommand's --help teaches, `-v` goes anywhere."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from edgeinfer.cli import build_parser


def parsers(
    parser: argparse.ArgumentParser, name: str = "edgeinfer"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child_name, child in action.choices.items():
                yield from parsers(child, f"{name} {child_name}")


def test_every_subcommand_has_a_description() -> None:
    missing = [name for name, p in parsers(build_parser()) if not p.description]
    assert missing == []


_NOTHING_TO_SHOW = (None, argparse.SUPPRESS, False, "", [])


def test_every_option_says_what_it_does_and_its_default() -> None:
    silent, hidden = [], []
    for name, p in parsers(build_parser()):
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction) or action.help == argparse.SUPPRESS:
                continue
            if not action.help:
                silent.append(f"{name} {action.option_strings or action.dest}")
                continue
            shows = "default" in action.help.lower() or action.default in _NOTHING_TO_SHOW
            switch = isinstance(
                action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._CountAction)
            )
            if action.option_strings and not switch and not shows:
                hidden.append(f"{name} {action.option_strings}")
    assert silent == []
    assert hidden == []


def test_verbose_before_or_after_the_subcommand() -> None:
    parser = build_parser()
    assert parser.parse_args(["cloud", "router", "--broker", "h:1"]).verbose == 0
    assert parser.parse_args(["-v", "cloud", "router", "--broker", "h:1"]).verbose == 1
    assert parser.parse_args(["cloud", "router", "--broker", "h:1", "-vv"]).verbose == 2
    assert parser.parse_args(["bench", "runtime", "-v"]).verbose == 1
