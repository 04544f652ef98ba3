"""`edgeinfer watch` (live dashboard from the broker) and `edgeinfer report` (latency plots as PNG)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from edgeinfer.errors import EdgeinferError
from edgeinfer.telemetry.fleet import DEFAULT_STALE_WINDOWS, WORST_FIRST

if TYPE_CHECKING:
    from edgeinfer.messages import TelemetryWindow

log = logging.getLogger(__name__)

DEFAULT_BROKER = "localhost:1883"


def register(subparsers: Any) -> None:
    watch = subparsers.add_parser(
        "watch",
        help="live terminal dashboard of a device's telemetry and results",
        description=(
            "Subscribe to edgeinfer/THING/telemetry and edgeinfer/THING/result on an MQTT broker (the "
            "simulated core's, or AWS IoT Core with --endpoint/--cert/--key) and show rates, p50/p99 by "
            "stage, offload share and errors, live."
        ),
    )
    watch.add_argument("--thing", default="+", help="the device's thing name (default: every device)")
    watch.add_argument(
        "--fleet",
        action="store_true",
        help="one row per thing under edgeinfer/+/telemetry (its latest window: model, total p50/p99, "
        f"errors, offloads, throughput), sorted worst first: {WORST_FIRST}",
    )
    watch.add_argument(
        "--stale",
        type=float,
        default=DEFAULT_STALE_WINDOWS,
        metavar="N",
        help="with --fleet: mark a thing stale when no window of it came for N of its windows "
        f"(default: {DEFAULT_STALE_WINDOWS})",
    )
    watch.add_argument(
        "--broker",
        default=os.environ.get("EDGEINFER_BROKER", DEFAULT_BROKER),
        metavar="HOST:PORT",
        help=f"plain-TCP MQTT broker (default: $EDGEINFER_BROKER or {DEFAULT_BROKER})",
    )
    watch.add_argument("--endpoint", help="AWS IoT Core data endpoint (mutual TLS instead of --broker)")
    watch.add_argument("--cert", help="client certificate (PEM) for --endpoint")
    watch.add_argument("--key", help="client private key (PEM) for --endpoint")
    watch.add_argument("--ca", help="CA bundle (PEM) for --endpoint (default: the system's)")
    watch.add_argument("--no-results", action="store_true", help="do not subscribe to the result topic")
    watch.add_argument(
        "--record", type=Path, metavar="FILE", help="append every telemetry window to FILE (JSON Lines)"
    )
    watch.add_argument(
        "--duration", type=float, metavar="S", help="stop after S seconds (default: until Ctrl-C)"
    )
    watch.add_argument("--once", action="store_true", help="print one frame after --duration and exit")
    watch.set_defaults(func=_watch)

    report = subparsers.add_parser(
        "report",
        help="latency plots (PNG) from benchmark JSON or recorded telemetry",
        description=(
            "Plot p50/p99 latency from telemetry windows (JSON list or JSON Lines, e.g. from "
            "'edgeinfer watch --record') or from any benchmark JSON with p50/p99 figures. "
            "Writes one PNG per input (per device for telemetry)."
        ),
    )
    report.add_argument(
        "files",
        nargs="+",
        type=Path,
        metavar="FILE",
        help="telemetry windows (e.g. from watch --record) or a benchmark JSON with p50 and p99 "
        "figures (e.g. bench/results/runtime.json, sim.json, offload.json)",
    )
    report.add_argument(
        "--out", type=Path, default=Path("."), metavar="DIR", help="output folder (default: .)"
    )
    report.add_argument(
        "--fleet",
        action="store_true",
        help="one PNG of every device in the telemetry inputs (fleet.png): total p99 and error share "
        "per device over time, and the devices over the whole recording, worst first "
        "(by error share, then total p99)",
    )
    report.set_defaults(func=_report)


# ------------------------------------------------------------------------------------------- watch


def _connect(args: argparse.Namespace) -> tuple[Any, str]:
    from edgeinfer.transport.mqtt import connect_client

    return connect_client(
        broker=args.broker, endpoint=args.endpoint, cert=args.cert, key=args.key, ca=args.ca
    )


def _thing_of(topic: str) -> str:
    parts = topic.split("/")
    return parts[1] if len(parts) > 2 else "?"


class _Watcher:
    """Feeds broker messages into the dashboard (and the record file); never raises on bad input."""

    def __init__(self, dashboard: Any, record: IO[str] | None) -> None:
        self.dashboard = dashboard
        self.record = record
        self._lock = threading.Lock()

    def add_window(self, window: TelemetryWindow, doc: dict[str, Any]) -> None:
        self.dashboard.add_window(window)

    def on_telemetry(self, message: Any) -> None:
        from edgeinfer.messages import MessageError, TelemetryWindow

        try:
            doc = json.loads(message.payload)
            window = TelemetryWindow.from_dict(doc)
        except (ValueError, MessageError) as exc:  # not JSON, or not a window
            self.dashboard.bad_messages += 1
            log.debug("bad telemetry on %s: %s", message.topic, exc)
            return
        self.add_window(window, doc)
        if self.record is not None:
            with self._lock:
                self.record.write(json.dumps(doc, separators=(",", ":")) + "\n")
                self.record.flush()

    def on_result(self, message: Any) -> None:
        from edgeinfer.messages import MessageError, Result

        try:
            result = Result.parse(message.payload)
        except MessageError as exc:
            self.dashboard.bad_messages += 1
            log.debug("bad result on %s: %s", message.topic, exc)
            return
        self.dashboard.add_result(_thing_of(message.topic), result)


class _FleetWatcher(_Watcher):
    """`watch --fleet`: the window's model identity goes with it, when the window carries one."""

    def add_window(self, window: TelemetryWindow, doc: dict[str, Any]) -> None:
        from edgeinfer.telemetry.fleet import model_label

        self.dashboard.add_window(window, model_label(doc))


def _check_watch_args(args: argparse.Namespace) -> None:
    from edgeinfer.messages import is_thing_name

    if args.fleet and args.thing != "+":
        raise EdgeinferError("--fleet watches every thing: leave out --thing")
    if args.thing != "+" and not is_thing_name(args.thing):
        raise EdgeinferError(f"--thing {args.thing!r} is not a thing name")
    if args.duration is not None and not args.duration > 0:
        raise EdgeinferError(f"--duration must be a positive number of seconds, got {args.duration}")
    if not args.stale > 0:
        raise EdgeinferError(f"--stale must be a positive number of windows, got {args.stale}")
    if args.once and args.duration is None:
        args.duration = 12.0  # a little over one default telemetry window


def _open_record(path: Path | None) -> IO[str] | None:
    if path is None:
        return None
    try:
        return path.open("a", encoding="utf-8")
    except OSError as exc:
        raise EdgeinferError(f"cannot write {path}: {exc.strerror or exc}") from None


def _subscribe(client: Any, args: argparse.Namespace, where: str, record: IO[str] | None) -> _Watcher:
    from edgeinfer.messages import result_topic, telemetry_topic
    from edgeinfer.telemetry.dashboard import Dashboard, FleetDashboard

    if args.fleet:
        fleet = _FleetWatcher(FleetDashboard(source=where, stale_windows=args.stale), record)
        client.subscribe(telemetry_topic("+"), fleet.on_telemetry, target="iot", qos=1)
        return fleet
    watcher = _Watcher(Dashboard(source=where), record)
    client.subscribe(telemetry_topic(args.thing), watcher.on_telemetry, target="iot", qos=1)
    if not args.no_results:
        client.subscribe(result_topic(args.thing) + "/#", watcher.on_result, target="iot")  # + reply_to
    return watcher


class _Interrupt:
    """Whether Ctrl-C came. A plain attribute the handler sets: the handler runs in the main thread
    between any two of its bytecodes, so one that took a lock (an Event's) could find the main
    thread holding it already and wait on itself forever."""

    def __init__(self) -> None:
        self.came = False

    def wait(self, seconds: float, step_s: float = 0.05) -> bool:
        """Sleep up to `seconds`, in short steps; True as soon as Ctrl-C came."""
        until = time.monotonic() + seconds
        while not self.came and time.monotonic() < until:
            time.sleep(min(step_s, max(0.0, until - time.monotonic())))
        return self.came


@contextlib.contextmanager
def _ctrl_c() -> Iterator[_Interrupt]:
    """Ctrl-C ends the views' waits, and is raised as KeyboardInterrupt only once the view has drawn
    its last frame: raised wherever the main thread happened to be (inside the dashboard's lock,
    inside rich's), it could leave that lock held and the final frame waiting on it forever."""
    stop = _Interrupt()
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield stop
        return

    def handler(_signum: int, _frame: object) -> None:
        stop.came = True

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)
    if stop.came:
        raise KeyboardInterrupt


def _show(dashboard: Any, args: argparse.Namespace) -> None:
    with _ctrl_c() as stop:
        _draw(dashboard, args, stop)


def _draw(dashboard: Any, args: argparse.Namespace, stop: _Interrupt) -> None:
    from rich.console import Console
    from rich.live import Live

    deadline = None if args.duration is None else time.monotonic() + args.duration

    def running(every_s: float) -> bool:
        return not stop.wait(every_s) and (deadline is None or time.monotonic() < deadline)

    console = Console(stderr=False)
    if args.once:
        stop.wait(args.duration)
        console.print(dashboard.render())
        return
    if not console.is_terminal:
        # no live screen (a pipe, a log file): print a frame whenever a new window arrived
        printed = 0
        while running(0.2):
            if dashboard.windows_received != printed:
                printed = dashboard.windows_received
                console.print(dashboard.render())
        return
    with Live(dashboard.render(), console=console, refresh_per_second=4, screen=False) as live:
        while running(0.25):
            live.update(dashboard.render())


def _watch(args: argparse.Namespace) -> int:
    _check_watch_args(args)
    client, where = _connect(args)
    record: IO[str] | None = None
    try:
        record = _open_record(args.record)
        watcher = _subscribe(client, args, where, record)
        _show(watcher.dashboard, args)
        return 0
    finally:
        client.close()
        if record is not None:
            record.close()


# ------------------------------------------------------------------------------------------ report


def _report(args: argparse.Namespace) -> int:
    from edgeinfer.telemetry.report import load, plot_loaded

    if args.out.exists() and not args.out.is_dir():
        raise EdgeinferError(f"--out {args.out} is not a folder")
    # Every input read before the first chart is written: a bad file leaves no partial output.
    loaded = [(path, *load(path)) for path in args.files]
    written: list[Path] = []
    if args.fleet:
        written = _report_fleet(loaded, args.out)
    else:
        for path, kind, data in loaded:
            written += plot_loaded(path, kind, data, args.out)
    for out in written:
        print(out)
    if not written:
        print("edgeinfer: nothing to plot", file=sys.stderr)
        return 1
    return 0


def _report_fleet(loaded: list[tuple[Path, str, Any]], out: Path) -> list[Path]:
    from edgeinfer.telemetry.report import plot_fleet

    windows = []
    for path, kind, data in loaded:
        if kind != "telemetry":
            raise EdgeinferError(f"--fleet plots telemetry windows; {path} holds benchmark figures")
        windows += data
    return plot_fleet(windows, out)
