"""The `edgeinfer` command line as a whole: every subcommand's --help teaches, `-v` goes anywhere."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterator

import pytest

from edgeinfer.cli import _teach, build_parser, main


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


_NOTHING_TO_SHOW: tuple[object, ...] = (None, argparse.SUPPRESS, False, "", [])


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


def test_verbose_before_or_after_the_subcommand(monkeypatch: pytest.MonkeyPatch) -> None:
    levels: list[int] = []
    monkeypatch.setattr(logging, "basicConfig", lambda **kw: levels.append(kw["level"]))
    for argv in (
        ["sim", "status", "--work-dir", "/nonexistent"],
        ["-v", "sim", "status", "--work-dir", "/nonexistent"],
        ["sim", "status", "--work-dir", "/nonexistent", "-v"],
        ["-v", "sim", "status", "--work-dir", "/nonexistent", "-v"],
    ):
        assert main(argv) == 2  # no core there: a one-line error, after logging is set up
    assert levels == [logging.WARNING, logging.INFO, logging.INFO, logging.DEBUG]


def test_a_default_with_a_percent_sign_does_not_break_help(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="x")
    parser.add_argument("--format", default="%Y-%m-%d", help="date format")
    _teach(parser)
    parser.print_help()
    assert "(default: %Y-%m-%d)" in capsys.readouterr().out
