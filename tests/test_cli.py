"""The `edgeinfer` command line as a whole: every subcommand's --help teaches, `-v` goes anywhere."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterator
from importlib.metadata import EntryPoint, EntryPoints
from pathlib import Path

import pytest

from edgeinfer import cli
from edgeinfer.cli import COMMANDS, Register, Subparsers, _teach, build_parser, main, registered


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


def _choices(parser: argparse.ArgumentParser) -> list[str]:
    return [
        name
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name in action.choices
    ]


def test_the_packages_register_every_command_in_the_order_help_lists_them() -> None:
    parser = build_parser()
    assert _choices(parser) == [
        *("model", "build", "sim", "publish", "deploy", "capture"),
        *("cloud", "watch", "report", "demo", "bench"),
    ]
    children = dict(parsers(parser))
    assert _choices(children["edgeinfer bench"]) == [
        *("model", "sim", "runtime", "compare", "telemetry", "offload", "iot", "router", "capture"),
        *("models", "streams"),
    ]
    assert _choices(children["edgeinfer cloud"]) == ["router", "policy", "fleet-template"]


def _adds(name: str) -> Register:
    def register(subparsers: Subparsers) -> None:
        subparsers.add_parser(name, help=name)

    return register


_FIRST, _SECOND = _adds("first"), _adds("second")


def _group(monkeypatch: pytest.MonkeyPatch, *values: tuple[str, str]) -> None:
    eps = EntryPoints(EntryPoint(name, value, COMMANDS) for name, value in values)
    monkeypatch.setattr(cli, "entry_points", lambda group: eps if group == COMMANDS else EntryPoints(()))


def test_commands_register_in_the_order_of_their_names(monkeypatch: pytest.MonkeyPatch) -> None:
    _group(monkeypatch, ("20-second", "tests.test_cli:_SECOND"), ("10-first", "tests.test_cli:_FIRST"))
    assert list(registered(COMMANDS)) == [_FIRST, _SECOND]
    assert _choices(build_parser()) == ["first", "second", "bench"]


def test_a_command_whose_package_is_not_installed_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    _group(
        monkeypatch,
        ("10-first", "tests.test_cli:_FIRST"),
        ("20-gone", "edgeinfer_not_installed.cli:register"),
        ("30-gone-module", "tests.not_a_module:register"),
    )
    assert list(registered(COMMANDS)) == [_FIRST]


def test_an_import_error_inside_a_registered_package_propagates(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "broken_commands.py").write_text("import edgeinfer_no_such_dependency\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    _group(monkeypatch, ("10-broken", "broken_commands:register"))
    with pytest.raises(ModuleNotFoundError, match="edgeinfer_no_such_dependency"):
        list(registered(COMMANDS))
