"""Command line of the installer component (see `__main__`)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgeinfer.errors import EdgeinferError
from edgeinfer.installer.install import Paths, run_installer
from edgeinfer.installer.plan import ConfigError, InstallerConfig
from edgeinfer.installer.probe import ProbeSource, RecordedProbe

log = logging.getLogger("edgeinfer.installer")


def parse_option(text: str) -> tuple[str, Any]:
    """`KEY=VALUE`; VALUE is JSON when it starts with `[` or `{`, else kept as text."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"-o expects KEY=VALUE, got {text!r}")
    stripped = value.strip()
    if stripped[:1] in ("[", "{") and not stripped.startswith("{configuration:"):
        try:
            return key.strip(), json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{key.strip()}: not valid JSON ({exc.msg})") from None
    return key.strip(), value


def nucleus_configuration(mode: str = "auto") -> dict[str, Any]:
    """The component's whole configuration from the nucleus (GetConfiguration over IPC, standard
    library only), or {} when not run by one (`auto`) or told not to ask (`no`)."""
    from edgeinfer.transport import TransportError, ipc_config

    if mode == "no" or (mode == "auto" and not ipc_config.available()):
        return {}
    try:
        value = ipc_config.get_configuration()
    except TransportError as exc:
        raise ConfigError(f"cannot read the configuration from the nucleus: {exc}") from None
    if not isinstance(value, dict):
        raise ConfigError("the nucleus holds no configuration map for this component")
    value.pop("accessControl", None)  # the nucleus's own key
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m edgeinfer.installer",
        description="Detect the platform, install (or link) the edge venv with exactly one ONNX Runtime, "
        "verify the providers and write platform.json. Skips when nothing changed.",
    )
    parser.add_argument("--work", required=True, type=Path, help="the component's work folder ({work:path})")
    parser.add_argument("--artifacts", type=Path, help="{artifacts:path} (the edgeinfer wheel)")
    parser.add_argument("--unpacked", type=Path, help="{artifacts:decompressedPath} (wheelhouse/)")
    parser.add_argument(
        "--from-nucleus",
        choices=("auto", "yes", "no"),
        default="auto",
        help="read the configuration with GetConfiguration (auto: when run by a nucleus); "
        "--config-file and -o override what it holds",
    )
    parser.add_argument("--config-file", type=Path, help="JSON object of configuration keys")
    parser.add_argument(
        "-o", "--option", action="append", default=[], metavar="KEY=VALUE", help="one configuration key"
    )
    parser.add_argument("--probe-recording", type=Path, help="use a recorded probe (tests, dry runs)")
    parser.add_argument("--python", default=sys.executable, help="interpreter the venv is made from")
    parser.add_argument("-q", "--quiet", action="store_true")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        raw = nucleus_configuration(args.from_nucleus)
        if args.config_file is not None:
            try:
                loaded = json.loads(args.config_file.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise ConfigError(f"cannot read {args.config_file}: {exc}") from None
            if not isinstance(loaded, dict):
                raise ConfigError(f"{args.config_file} is not a JSON object")
            raw.update(loaded)
        for option in args.option:
            key, value = parse_option(option)
            raw[key] = value
        config = InstallerConfig.from_mapping(raw)
        source: ProbeSource | None = None
        if args.probe_recording is not None:
            source = RecordedProbe.load(args.probe_recording)
        paths = Paths(work=args.work, artifacts=args.artifacts, unpacked=args.unpacked)
        outcome = run_installer(config, paths, source=source, python=args.python)
    except EdgeinferError as exc:
        print(f"edgeinfer.installer: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("edgeinfer.installer: interrupted", file=sys.stderr)
        return 130
    state = "unchanged, skipped" if outcome.skipped else "installed"
    print(f"edgeinfer.installer: {state} in {outcome.seconds:.2f} s (fingerprint {outcome.fingerprint[:12]})")
    return 0
