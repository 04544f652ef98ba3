"""`edgeinfer sim up | status | logs | down`: run recipes/ + artifacts/ on a simulated Greengrass core.

`up` stays in the foreground with a live status line (Ctrl-C stops everything) or, with `--detach`,
leaves a background process; `status`, `logs` and `down` find it through `WORK_DIR/status.json`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from edgeinfer.errors import EdgeinferError

DEFAULT_WORK_DIR = ".edgeinfer/sim"


def _thing_name(text: str) -> str:
    from edgeinfer.messages import is_thing_name

    if not is_thing_name(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a thing name (1-128 letters, digits, ':', '_', '-')"
        )
    return text


def _lines(text: str) -> int:
    try:
        lines = int(text)
    except ValueError:
        lines = -1
    if lines < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of lines (0 or more)")
    return lines


def register(subparsers: Any) -> None:
    sim = subparsers.add_parser(
        "sim",
        help="run the components on a simulated Greengrass core (local nucleus + MQTT broker)",
        description=(
            "A local Greengrass nucleus for tests and demos: loads recipes and artifacts as "
            "`greengrass-cli deployment create` does, runs the lifecycles, serves Greengrass IPC and "
            "bridges IoT Core to a local mosquitto."
        ),
    )
    sub = sim.add_subparsers(dest="sim_command", metavar="ACTION")

    up = sub.add_parser(
        "up",
        help="start the simulated core with the components of a recipe folder",
        description=(
            "Deploy every recipe in --recipes (artifacts from --artifacts, as 'edgeinfer build' writes "
            "them) on a local Greengrass nucleus with its own mosquitto as IoT Core, and show the "
            "components' states until Ctrl-C. With --detach it returns once the core runs; then "
            "'edgeinfer sim status | logs COMPONENT | down' find it through --work-dir."
        ),
        epilog=(
            "examples:\n"
            "  # the bundle built by 'edgeinfer build', on this project's venv (the installer links\n"
            "  # it instead of installing); back once the runtime is warm\n"
            "  edgeinfer sim up --detach --recipes greengrass-build/recipes \\\n"
            r'      --config-merge "com.edgeinfer.RuntimeInstaller={\"existingVenv\": \"$PWD/.venv\"}"'
            " \\\n"
            "      --wait com.edgeinfer.InferenceRuntime\n"
            "  # one component (and its dependencies) in the foreground\n"
            "  edgeinfer sim up --recipes greengrass-build/recipes --component com.edgeinfer.Telemetry \\\n"
            r'      --config-merge "com.edgeinfer.RuntimeInstaller={\"existingVenv\": \"$PWD/.venv\"}"'
            " \\\n"
            "      --config-merge 'com.edgeinfer.Telemetry={\"windowSeconds\": 1}'\n"
            "  mosquitto_sub -p PORT -t 'edgeinfer/edgeinfer-sim/#'   (PORT: see 'edgeinfer sim status')"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    up.add_argument("--recipes", default="recipes", type=Path, help="recipe folder (default: recipes)")
    up.add_argument(
        "--artifacts", type=Path, help="artifact folder (default: ./artifacts, when there is one)"
    )
    up.add_argument(
        "--thing",
        default="edgeinfer-sim",
        type=_thing_name,
        help="the core device's thing name: topics are edgeinfer/THING/... (default: edgeinfer-sim)",
    )
    up.add_argument(
        "--component",
        action="append",
        dest="components",
        metavar="NAME[=VERSION]",
        help="deploy only these components (and their dependencies); repeatable",
    )
    up.add_argument(
        "--config-merge",
        action="append",
        default=[],
        metavar="COMPONENT=JSON",
        help="deployment-time configuration merge for one component, e.g. "
        "com.edgeinfer.InferenceRuntime='{\"maxBatchSize\": 4}'; repeatable",
    )
    up.add_argument(
        "--broker", metavar="HOST:PORT", help="use this MQTT broker instead of starting mosquitto"
    )
    up.add_argument("--region", default="us-east-1", help="AWS_REGION given to components")
    up.add_argument(
        "--nucleus",
        choices=("classic", "lite"),
        default="classic",
        help="which Greengrass nucleus to behave as: the Java nucleus or nucleus lite (default: classic)",
    )
    up.add_argument(
        "--component-user",
        metavar="USER[:GROUP]",
        help="run components as this user (default when run as root: ggc_user:ggc_group on classic, "
        "gg_component on lite, created if missing; otherwise the invoking user)",
    )
    up.add_argument("--detach", action="store_true", help="start in the background and return")
    up.add_argument(
        "--wait",
        action="append",
        default=[],
        metavar="COMPONENT",
        help="with --detach, return only once COMPONENT has reported RUNNING itself (UpdateState), "
        "e.g. com.edgeinfer.InferenceRuntime after its warm-up, or has FINISHED; repeatable",
    )
    up.add_argument(
        "--wait-timeout",
        type=float,
        default=180.0,
        metavar="S",
        help="seconds to wait for the core and the --wait components (default 180)",
    )
    _work_dir_arg(up)
    up.set_defaults(func=_up)

    status = sub.add_parser("status", help="components and their states")
    status.add_argument("--json", action="store_true", help="print status.json")
    _work_dir_arg(status)
    status.set_defaults(func=_status)

    logs = sub.add_parser("logs", help="a component's log (stdout, stderr and lifecycle events)")
    logs.add_argument("component", help="component name, e.g. com.edgeinfer.InferenceRuntime")
    logs.add_argument(
        "-n", "--lines", type=_lines, help="only the last N lines (default: all; 0 with -f: only new ones)"
    )
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    _work_dir_arg(logs)
    logs.set_defaults(func=_logs)

    down = sub.add_parser("down", help="stop a detached simulated core")
    _work_dir_arg(down)
    down.set_defaults(func=_down)

    sim.set_defaults(func=lambda _args: (sim.print_help(sys.stderr), 2)[1])


def _work_dir_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=Path(os.environ.get("EDGEINFER_SIM_DIR", DEFAULT_WORK_DIR)),
        help=f"the core's root (logs, work, status.json; default: $EDGEINFER_SIM_DIR or {DEFAULT_WORK_DIR})",
    )


def _read_status(work_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((work_dir / "status.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _running(work_dir: Path) -> dict[str, Any] | None:
    status = _read_status(work_dir)
    if status and status.get("running") and _alive(int(status.get("pid", 0))):
        return status
    return None


def _status_line(states: dict[str, str]) -> str:
    return "  ".join(f"{name} {state}" for name, state in states.items())


def _up(args: argparse.Namespace) -> int:
    from edgeinfer.sim.simulator import Simulator
    from edgeinfer_cloud.deploy import parse_config_merge

    work_dir: Path = args.work_dir
    running = _running(work_dir)
    if running:
        raise EdgeinferError(
            f"a simulated core already runs from {work_dir} (pid {running['pid']}): "
            "`edgeinfer sim down` first"
        )
    merges = parse_config_merge(args.config_merge)
    if args.wait and not args.detach:
        raise EdgeinferError("--wait needs --detach (in the foreground the status line shows the states)")
    if not args.wait_timeout > 0:
        raise EdgeinferError(f"--wait-timeout must be a positive number of seconds, not {args.wait_timeout}")
    if not args.recipes.is_dir():
        raise EdgeinferError(f"{args.recipes}: recipe folder not found")
    if args.artifacts is not None and not args.artifacts.is_dir():
        raise EdgeinferError(f"{args.artifacts}: artifact folder not found")
    if args.artifacts is None:  # the default: ./artifacts when there is one (a recipe may need none)
        args.artifacts = Path("artifacts")
    try:
        work_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EdgeinferError(f"cannot create the work folder {work_dir}: {exc.strerror or exc}") from None
    if args.detach:
        return _detach(args, work_dir)

    sim = Simulator(
        args.recipes,
        args.artifacts if args.artifacts.is_dir() else None,
        thing=args.thing,
        components=args.components,
        config_merge=merges,
        work_dir=work_dir,
        broker=args.broker,
        region=args.region,
        nucleus=args.nucleus,
        component_user=args.component_user,
    )

    def terminate(_sig: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminate)
    sim.start()
    try:
        _foreground(sim)
    except KeyboardInterrupt:
        pass
    finally:
        print("edgeinfer sim: stopping", file=sys.stderr)
        sim.stop()
    return 0


def _foreground(sim: Any) -> None:
    header = (
        f"simulated core '{sim.thing}' ({sim.nucleus.name} nucleus) · "
        f"broker {sim.broker[0]}:{sim.broker[1]} · root {sim.root} · Ctrl-C stops"
    )
    if not sys.stderr.isatty():
        print(header, file=sys.stderr, flush=True)
        last = ""
        while True:
            line = _status_line(sim.states())
            if line != last:
                print(line, file=sys.stderr, flush=True)
                last = line
            time.sleep(0.2)
    from rich.console import Console
    from rich.live import Live

    console = Console(stderr=True)
    console.print(header)
    with Live(console=console, refresh_per_second=4, transient=False) as live:
        while True:
            states = sim.states()
            colored = "  ".join(f"[bold]{n}[/] {_color(s)}" for n, s in states.items())
            live.update(colored)
            time.sleep(0.25)


def _color(state: str) -> str:
    color = {"RUNNING": "green", "FINISHED": "cyan", "ERRORED": "yellow", "BROKEN": "red"}.get(state, "dim")
    return f"[{color}]{state}[/]"


def _detach(args: argparse.Namespace, work_dir: Path) -> int:
    with contextlib.suppress(FileNotFoundError):
        (work_dir / "status.json").unlink()
    argv = [sys.executable, "-m", "edgeinfer", "sim", "up", "--work-dir", str(work_dir)]
    argv += ["--recipes", str(args.recipes), "--thing", args.thing]
    if args.artifacts.is_dir():
        argv += ["--artifacts", str(args.artifacts)]
    argv += ["--region", args.region, "--nucleus", args.nucleus]
    if args.component_user:
        argv += ["--component-user", args.component_user]
    for item in args.config_merge:
        argv += ["--config-merge", item]
    for name in args.components or []:
        argv += ["--component", name]
    if args.broker:
        argv += ["--broker", args.broker]
    out_path = work_dir / "sim.out"
    with out_path.open("wb") as out:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
        )
    deadline = time.monotonic() + args.wait_timeout
    status: dict[str, Any] | None = None
    try:
        while time.monotonic() < deadline:
            status = _read_status(work_dir)
            up = bool(status and status.get("running") and status.get("pid") == proc.pid)
            if up and status is not None and _ready(status, args.wait):
                print(
                    f"simulated core '{status['thing']}' running (pid {proc.pid}), broker "
                    f"{status['broker']}, root {status['root']}; "
                    "`edgeinfer sim status`, `edgeinfer sim down`"
                )
                return 0
            if proc.poll() is not None:
                lines = out_path.read_text(errors="replace").strip().splitlines()
                last = lines[-1] if lines else ""
                error = next((ln for ln in reversed(lines) if "error" in ln.lower()), last)
                raise EdgeinferError(
                    f"the simulated core did not start: {error.removeprefix('edgeinfer: error: ')}"
                )
            time.sleep(0.05)
        waiting = [n for n in args.wait if not _ready(status or {}, [n])]
        what = (
            f"{', '.join(waiting)} did not report RUNNING"
            if waiting and status
            else "the simulated core did not report"
        )
        raise EdgeinferError(f"{what} in {args.wait_timeout:g} s; see {out_path} and `edgeinfer sim logs`")
    except BaseException:
        # Nothing half-started is left behind: the core goes, and so does its status.
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:  # its components' stop timeouts: do not leave it
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        with contextlib.suppress(FileNotFoundError):
            (work_dir / "status.json").unlink()
        raise


def _ready(status: dict[str, Any], wait: list[str]) -> bool:
    """Every `wait` component has reported RUNNING itself (or, without a Run step, FINISHED); one
    that is BROKEN ends the wait (an ERRORED one is restarted by the nucleus, so it may yet come)."""
    comps = status.get("components", {})
    for name in wait:
        info = comps.get(name)
        if info is None:
            if status.get("components"):
                raise EdgeinferError(f"--wait {name}: not a component of this core ({', '.join(comps)})")
            return False
        if info.get("state") == "BROKEN":
            raise EdgeinferError(f"{name} is BROKEN: see `edgeinfer sim logs {name}`")
        if info.get("reported") != "RUNNING" and info.get("state") != "FINISHED":
            return False
    return True


def _status(args: argparse.Namespace) -> int:
    status = _read_status(args.work_dir)
    if status is None:
        raise EdgeinferError(f"no simulated core in {args.work_dir}: start one with `edgeinfer sim up`")
    running = bool(status.get("running")) and _alive(int(status.get("pid", 0)))
    if args.json:
        print(json.dumps({**status, "running": running}, indent=2))
        return 0
    print(
        f"thing {status['thing']}  nucleus {status.get('nucleus', 'classic')}  broker {status['broker']}  "
        f"{'running, pid ' + str(status['pid']) if running else 'stopped'}"
    )
    comps = status.get("components", {})
    width = max((len(n) for n in comps), default=10)
    for name, info in comps.items():
        print(f"  {name:<{width}}  {info.get('version', ''):<10} {info.get('state', '')}")
    return 0 if running else 1


def _logs(args: argparse.Namespace) -> int:
    path = args.work_dir / "logs" / f"{args.component}.log"
    if not path.exists():
        status = _read_status(args.work_dir) or {}
        known = ", ".join(status.get("components", {})) or "none"
        raise EdgeinferError(f"no log for {args.component} in {args.work_dir} (components: {known})")
    with path.open("r", encoding="utf-8", errors="replace") as f:
        lines = f.readlines()
        if args.lines is not None:
            lines = lines[len(lines) - args.lines :]
        sys.stdout.writelines(lines)
        sys.stdout.flush()
        while args.follow:
            line = f.readline()
            if line:
                sys.stdout.write(line)
                sys.stdout.flush()
            else:
                time.sleep(0.2)
    return 0


def _down(args: argparse.Namespace) -> int:
    status = _running(args.work_dir)
    if status is None:
        print(f"no simulated core running from {args.work_dir}")
        return 0
    pid = int(status["pid"])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while _alive(pid) and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.05)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
        print(f"simulated core (pid {pid}) did not stop in 60s: killed")
        return 1
    print(f"simulated core (pid {pid}) stopped")
    return 0
