"""The com.edgeinfer.RuntimeInstaller component: its Install step (`python -m edgeinfer.installer`).

Runs on the system Python (standard library only), usually straight from the shipped wheel:

    PYTHONPATH={artifacts:path}/edgeinfer-<v>-py3-none-any.whl python3 -m edgeinfer.installer \\
        --work {work:path} --artifacts {artifacts:path} --unpacked {artifacts:decompressedPath}

The configuration comes from the nucleus (GetConfiguration over IPC: `transport.ipc_config`, which
needs no awsiotsdk); `--config-file` and `-o KEY=VALUE` override it (local runs, or scalars a recipe
still interpolates). Exit 0 when the environment is ready (installed, linked or unchanged);
otherwise one line on stderr and exit 2, so Greengrass marks the component ERRORED, and the device
is left as it was.

This module imports on any Python 3 and imports the rest only after `preflight` accepted the
interpreter: an old one (Python < 3.10) gets the one line naming what to set or install.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgeinfer.installer.preflight import check_running_interpreter

log = logging.getLogger("edgeinfer.installer")


class RuntimeInstaller:
    """One Install step: the configuration (nucleus, then file, then options), then the installer."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    def configuration(self) -> Any:
        """The InstallerConfig to run with. Raises ConfigError (one line)."""
        from edgeinfer.config import ConfigError, merge, parse_overrides
        from edgeinfer.installer.plan import InstallerConfig

        doc = nucleus_configuration(self.args.from_nucleus)
        if self.args.config_file is not None:
            try:
                loaded = json.loads(self.args.config_file.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise ConfigError(f"cannot read {self.args.config_file}: {exc}") from None
            if not isinstance(loaded, dict):
                raise ConfigError(f"{self.args.config_file} is not a JSON object")
            doc = merge(doc, loaded)
        doc = merge(doc, parse_overrides(self.args.option))
        return InstallerConfig.from_mapping(doc)

    def run(self) -> Any:
        from edgeinfer.installer.install import Paths, run_installer
        from edgeinfer.installer.probe import ProbeSource, RecordedProbe

        config = self.configuration()
        source: ProbeSource | None = None
        if self.args.probe_recording is not None:
            source = RecordedProbe.load(self.args.probe_recording)
        paths = Paths(work=self.args.work, artifacts=self.args.artifacts, unpacked=self.args.unpacked)
        return run_installer(config, paths, source=source, python=self.args.python)


def nucleus_configuration(mode: str = "auto") -> dict[str, Any]:
    """The component's whole configuration from the nucleus (GetConfiguration over IPC, standard
    library only), or {} when not run by one (`auto`) or told not to ask (`no`)."""
    from edgeinfer.config import NUCLEUS_KEYS, ConfigError
    from edgeinfer.transport import TransportError, ipc_config

    if mode == "no" or (mode == "auto" and not ipc_config.available()):
        return {}
    try:
        value = ipc_config.get_configuration()
    except TransportError as exc:
        raise ConfigError(f"cannot read the configuration from the nucleus: {exc}") from None
    if not isinstance(value, dict):
        raise ConfigError("the nucleus holds no configuration map for this component")
    return {k: v for k, v in value.items() if k not in NUCLEUS_KEYS}


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
        "-o",
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one configuration key (a list or map as JSON), e.g. allowRoot=true",
    )
    parser.add_argument("--probe-recording", type=Path, help="use a recorded probe (tests, dry runs)")
    parser.add_argument("--python", default=sys.executable, help="interpreter the venv is made from")
    parser.add_argument("-q", "--quiet", action="store_true")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    refusal = check_running_interpreter()
    if refusal is not None:
        print(f"edgeinfer.installer: error: {refusal}", file=sys.stderr)
        return 2
    from edgeinfer.errors import EdgeinferError

    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        outcome = RuntimeInstaller(args).run()
    except EdgeinferError as exc:
        print(f"edgeinfer.installer: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("edgeinfer.installer: interrupted", file=sys.stderr)
        return 130
    state = "unchanged, skipped" if outcome.skipped else "installed"
    print(f"edgeinfer.installer: {state} in {outcome.seconds:.2f} s (fingerprint {outcome.fingerprint[:12]})")
    return 0
