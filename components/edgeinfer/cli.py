"""The `edgeinfer` command. Subcommands live next to the code they drive; this module only wires them.

Each package registers its commands itself, as an entry point in the `edgeinfer.commands` group
(pyproject.toml): a `register(subparsers)` that adds its parser and sets `func(args) -> int` as the
default. Those modules import heavy libraries (onnxruntime, torch, boto3) inside their functions so
that `edgeinfer --help` stays instant. Benchmark scenarios register under `edgeinfer bench` the same
way, in the `edgeinfer.benches` group.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from importlib.metadata import entry_points
from typing import TypeAlias

from edgeinfer import __version__
from edgeinfer.errors import EdgeinferError

log = logging.getLogger(__name__)

COMMANDS = "edgeinfer.commands"  # entry-point group: register(subparsers)
BENCHES = "edgeinfer.benches"  # entry-point group: register_bench(subparsers) under `edgeinfer bench`

# What a register function adds its parsers to.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
Register: TypeAlias = Callable[[Subparsers], None]

_EPILOG = """\
examples:
  edgeinfer model build                 build the INT8 model store into artifacts/
  edgeinfer demo                        the bundle on a simulated core, classifying the sample photos
  edgeinfer build                       lay out artifacts/ and greengrass-build/ for deployment
  edgeinfer sim up --detach --recipes greengrass-build/recipes \\
      --config-merge "com.edgeinfer.RuntimeInstaller={\\"existingVenv\\": \\"$PWD/.venv\\"}"
                                        run the built bundle on this project's own environment
  edgeinfer bench model --json out.json
                                        compare FP32 and INT8 side by side
  edgeinfer watch --thing my-device     live latency dashboard from the broker

Run 'edgeinfer COMMAND --help' for the options of each command.
"""


def registered(group: str) -> Iterator[Register]:
    """The register functions of an entry-point group, in the order of their names (the order
    `edgeinfer --help` lists the commands in, whichever distribution or metadata writer they come from).

    One whose package is not installed is left out, as is the command it would add; any other import
    error is a fault in that package and propagates.
    """
    for ep in sorted(entry_points(group=group), key=lambda ep: ep.name):
        try:
            register: Register = ep.load()
        except ModuleNotFoundError as exc:
            if not exc.name or not (ep.module == exc.name or ep.module.startswith(f"{exc.name}.")):
                raise
            log.debug("%s: %s is not installed; no %s", group, exc.name, ep.name)
            continue
        yield register


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgeinfer",
        description="Low-latency ML inference on AWS IoT Greengrass v2.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"edgeinfer {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv: debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in registered(COMMANDS):
        register(sub)
    bench = sub.add_parser(
        "bench",
        help="benchmarks: each compares against the raw baseline side by side in one run",
        description="Benchmarks. Each prints a table and, with --json FILE, writes the figures as JSON.",
    )
    bench_sub = bench.add_subparsers(dest="scenario", metavar="SCENARIO")
    for register_bench in registered(BENCHES):
        register_bench(bench_sub)
    bench.set_defaults(func=lambda _args: _usage(bench))
    parser.set_defaults(func=lambda _args: _usage(parser))
    _teach(parser)
    return parser


_SWITCHES = (
    argparse._HelpAction,
    argparse._VersionAction,
    argparse._StoreTrueAction,
    argparse._StoreFalseAction,
    argparse._CountAction,
    argparse._AppendAction,
)


def _teach(parser: argparse.ArgumentParser) -> None:
    """What every subcommand's --help gets, in one place: a description (its one-line help when it has
    none), each option's default, and `-v` after the subcommand too (`edgeinfer cloud router … -v`)."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            _show_default(action)
            continue
        helps = {a.dest: a.help for a in action._choices_actions}
        for name, child in action.choices.items():
            if not child.description and helps.get(name):
                child.description = str(helps[name])[:1].upper() + str(helps[name])[1:] + "."
            if not any("-v" in a.option_strings for a in child._actions):
                child.add_argument(
                    "-v",
                    "--verbose",
                    dest="verbose_after",  # added to the count given before the subcommand
                    action="count",
                    default=argparse.SUPPRESS,
                    help="more log output (-vv: debug)",
                )
            _teach(child)


def _show_default(action: argparse.Action) -> None:
    if not action.option_strings or isinstance(action, _SWITCHES) or action.help == argparse.SUPPRESS:
        return
    if action.default in (None, argparse.SUPPRESS, "", []):
        return
    if action.help and "default" in action.help.lower():
        return
    shown = f"(default: {action.default})".replace("%", "%%")  # argparse %-formats help
    action.help = f"{action.help} {shown}" if action.help else shown


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.verbose += getattr(args, "verbose_after", 0)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        code = args.func(args)
    except EdgeinferError as exc:
        print(f"edgeinfer: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("edgeinfer: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
