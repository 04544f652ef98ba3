"""The `com.edgeinfer.Telemetry` Greengrass component.

Subscribes to the runtime's timings on local pub/sub (`edgeinfer/local/timings`), folds them into
windows (`window.WindowAggregator`), adds system figures (`system.SystemSampler`), publishes each window
to IoT Core on `edgeinfer/{thing}/telemetry` through the spool (`spool.SpoolingPublisher`), optionally
serves Prometheus text on the device (`prometheus`), and reports RUNNING once it is subscribed.

Configuration (recipe `DefaultConfiguration`, camelCase as AWS's components) is read over IPC at
start (GetConfiguration, with `-o KEY=VALUE` overrides for local runs); `windowSeconds`, `qos` and the
spool bounds follow configuration updates live. Where the nucleus validates proposed changes (the
classic nucleus) a bad one is refused with its reasons; nucleus lite does not, and a bad change is
then logged and ignored.

    windowSeconds     10          window length (s)
    qos               1           MQTT QoS of the telemetry publishes to IoT Core (0 or 1)
    spoolDir          ""          spool folder; "" = `spool/` in the component's work folder (its cwd)
    spoolMaxWindows   8640        bound of the spool in windows (24 h of 10 s windows)
    spoolMaxBytes     50000000    bound of the spool in bytes
    systemMetrics     true        CPU / memory / device-process figures from /proc
    gpuMetrics        true        GPU figures through NVML (`nvidia-ml-py`) when present
    processMatch      "edgeinfer." command-line substring of the device's processes (RSS, CPU)
    prometheusPort    0           0 = off; else serve /metrics on prometheusBind:port
    prometheusBind    "127.0.0.1" loopback by default: the device's metrics are not for the network
    lowConfidence     0.5         a model's answer whose top score is below this counts as low confidence

`lowConfidence` ships with the code, not in the recipe (nucleus lite caps a recipe's size): a
deployment may still set it, and `TelemetryConfig.to_dict()` (the recipe's defaults) leaves it out.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from edgeinfer import config
from edgeinfer.config import ConfigError
from edgeinfer.errors import EdgeinferError
from edgeinfer.messages import TIMINGS_TOPIC, TelemetryWindow, telemetry_topic
from edgeinfer.telemetry.prometheus import MetricsState, PrometheusExporter
from edgeinfer.telemetry.spool import Spool, SpoolingPublisher
from edgeinfer.telemetry.system import SystemSampler
from edgeinfer.telemetry.window import DEFAULT_LOW_CONFIDENCE, WindowAggregator
from edgeinfer.transport import Bus, Message, Subscription, TransportError

__all__ = ["ConfigError", "TelemetryComponent", "TelemetryConfig", "main"]

log = logging.getLogger(__name__)

COMPONENT = "com.edgeinfer.Telemetry"


@dataclass(frozen=True)
class TelemetryConfig:
    """The component's configuration (recipe keys: the camelCase of each field, see the table above)."""

    window_seconds: float = 10.0
    qos: int = 1
    spool_dir: str = ""
    spool_max_windows: int = 8640
    spool_max_bytes: int = 50_000_000
    system_metrics: bool = True
    gpu_metrics: bool = True
    process_match: str = "edgeinfer."
    prometheus_port: int = 0
    prometheus_bind: str = "127.0.0.1"
    low_confidence: float = DEFAULT_LOW_CONFIDENCE

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any] | None) -> TelemetryConfig:
        """Read the component's configuration (either nucleus's typing). Raises ConfigError."""
        return config.read(cls, doc, component=COMPONENT)

    def to_dict(self) -> dict[str, Any]:
        """The recipe's DefaultConfiguration: every key but those whose default ships in the code."""
        doc = config.to_recipe(self)
        for key in SHIPPED_IN_CODE:
            doc.pop(key, None)
        return doc

    def check(self) -> list[tuple[str, str]]:
        problems = []
        if not 0.05 <= self.window_seconds <= 3600:
            problems.append(("windowSeconds", "must be between 0.05 and 3600"))
        if self.qos not in (0, 1):
            problems.append(("qos", "must be 0 or 1"))
        if self.spool_max_windows < 1:
            problems.append(("spoolMaxWindows", "must be at least 1"))
        if self.spool_max_bytes < 1024:
            problems.append(("spoolMaxBytes", "must be at least 1024"))
        if not 0 <= self.prometheus_port <= 65535:
            problems.append(("prometheusPort", "must be 0 (off) or a TCP port"))
        if not 0 <= self.low_confidence <= 1:
            problems.append(("lowConfidence", "must be a score between 0 and 1"))
        return problems

    def spool_path(self, work: Path | None = None) -> Path:
        return Path(self.spool_dir) if self.spool_dir else (work or Path.cwd()) / "spool"


# Applied while running; every other key waits for the next start.
LIVE_KEYS = frozenset({"window_seconds", "spool_max_windows", "spool_max_bytes", "qos", "low_confidence"})
# Recipe keys whose default is only in the code (nucleus lite caps a recipe's size).
SHIPPED_IN_CODE = frozenset({"lowConfidence"})


class TelemetryComponent:
    """Wires bus → aggregator → spool/publisher (+ Prometheus). Drive it with `run()` or `tick()`."""

    def __init__(
        self,
        bus: Bus,
        thing: str,
        config: TelemetryConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        system: Callable[[], Mapping[str, Any]] | None = None,
        work: Path | None = None,
        overrides: Mapping[str, Any] | None = None,
    ) -> None:
        self.bus = bus
        self.overrides = dict(overrides or {})
        self.thing = thing
        self.config = config or TelemetryConfig()
        self._clock = clock
        cfg = self.config
        self.spool = Spool(
            cfg.spool_path(work), max_windows=cfg.spool_max_windows, max_bytes=cfg.spool_max_bytes
        )
        self.publisher = SpoolingPublisher(bus, telemetry_topic(thing), self.spool, qos=cfg.qos, clock=clock)
        self._sampler: SystemSampler | None = None
        if system is None and cfg.system_metrics:
            self._sampler = SystemSampler(
                match=tuple(m for m in cfg.process_match.split(",") if m.strip()),
                gpu=cfg.gpu_metrics,
            )
            system = self._sampler
        self.aggregator = WindowAggregator(
            thing,
            window_s=cfg.window_seconds,
            clock=clock,
            wall=wall,
            system=system,
            first_seq=self.publisher.next_seq,
            low_confidence=cfg.low_confidence,
        )
        self.metrics = MetricsState()
        self.exporter: PrometheusExporter | None = None
        self._subs: list[Subscription] = []
        self._stop = threading.Event()
        self.windows_sent: list[TelemetryWindow] = []  # the last few, for tests and `status`

    # ------------------------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self._subs.append(self.bus.subscribe(TIMINGS_TOPIC, self._on_timings, target="local"))
        self._subs += config.subscribe(self.bus, COMPONENT, self._on_config_update, self._validate)
        if self.config.prometheus_port:
            try:
                self.exporter = PrometheusExporter(
                    self.metrics, bind=self.config.prometheus_bind, port=self.config.prometheus_port
                )
            except OSError as exc:  # port taken: telemetry still flows to IoT Core
                log.error(
                    "cannot serve Prometheus on %s:%d: %s",
                    self.config.prometheus_bind,
                    self.config.prometheus_port,
                    exc,
                )
        log.info(
            "telemetry for %s: %.3g s windows on %s, spool %s (%d waiting, next seq %d)",
            self.thing,
            self.config.window_seconds,
            telemetry_topic(self.thing),
            self.spool.dir,
            len(self.spool),
            self.aggregator.next_seq,
        )
        self.bus.update_state("RUNNING")

    def tick(self) -> list[TelemetryWindow]:
        """Close due windows, publish or spool them, resend the spool. Returns the windows closed."""
        windows = self.aggregator.poll()
        for window in windows:
            self._emit(window)
        self.publisher.pump()
        return windows

    def _emit(self, window: TelemetryWindow) -> None:
        self.publisher.submit(window)
        self.metrics.update(window)
        self.windows_sent = [*self.windows_sent[-9:], window]

    def run(self, tick_s: float = 0.5) -> None:
        """Close windows on time until `stop()`; a sender thread publishes and resends the spool.

        Publishing waits on the nucleus (up to the IPC timeout while IoT Core is unreachable); doing it
        on its own thread keeps the windows closing on time meanwhile. Waits on events, never sleeps.
        """
        pending: queue.Queue[TelemetryWindow] = queue.Queue()
        sender = threading.Thread(target=self._send_loop, args=(pending, tick_s), name="telemetry-send")
        sender.start()
        try:
            while not self._stop.is_set():
                for window in self.aggregator.poll():
                    pending.put(window)
                self._stop.wait(min(tick_s, max(self.aggregator.seconds_left(), 0.01)))
        finally:
            self._stop.set()
            sender.join()
            while not pending.empty():  # closed but not yet handed over: spool or send them now
                self._emit(pending.get_nowait())

    def _send_loop(self, pending: queue.Queue[TelemetryWindow], tick_s: float) -> None:
        while not self._stop.is_set():
            try:
                window = pending.get(timeout=tick_s)
            except queue.Empty:
                self.publisher.pump()
                continue
            try:
                self._emit(window)
            except Exception:  # a full disk, say: log it and keep the component alive
                log.exception("could not publish or spool window %d", window.seq)

    def stop(self) -> None:
        self._stop.set()

    def close(self, flush: bool = True) -> None:
        """Unsubscribe, send (or spool) the last partial window, stop Prometheus."""
        for sub in self._subs:
            try:
                sub.close()
            except TransportError as exc:
                log.debug("closing a subscription: %s", exc)
        self._subs.clear()
        if flush:
            self._emit(self.aggregator.flush())
        if self.exporter is not None:
            self.exporter.close()
            self.exporter = None
        if self._sampler is not None:
            self._sampler.close()

    # ------------------------------------------------------------------------------------- handlers

    def _on_timings(self, message: Message) -> None:
        self.aggregator.add_payload(message.payload)

    def _validate(self, proposed: dict[str, Any]) -> str | None:
        try:
            read_config(proposed, self.overrides)
        except ConfigError as exc:
            return exc.reasons
        return None

    def _on_config_update(self, key_path: list[str]) -> None:
        try:
            new = read_config(self.bus.get_configuration(), self.overrides)
        except (TransportError, ConfigError) as exc:
            log.warning("ignoring a configuration update (%s): %s", "/".join(key_path), exc)
            return
        if new.window_seconds != self.config.window_seconds:
            self.aggregator.set_window(new.window_seconds)
        self.spool.max_windows = new.spool_max_windows
        self.spool.max_bytes = new.spool_max_bytes
        self.publisher.qos = new.qos
        self.aggregator.low_confidence = new.low_confidence
        restart_needed = [
            config.key_of(f)
            for f in fields(TelemetryConfig)
            if f.name not in LIVE_KEYS and getattr(new, f.name) != getattr(self.config, f.name)
        ]
        if restart_needed:
            log.warning("configuration %s changes at the next restart", ", ".join(restart_needed))
        self.config = new
        log.info("configuration updated: %s", "/".join(key_path))


def read_config(doc: Any, overrides: Mapping[str, Any] | None = None) -> TelemetryConfig:
    """The configuration the nucleus holds (`doc`) under the command line's overrides."""
    return TelemetryConfig.from_dict(config.merge(doc if isinstance(doc, Mapping) else {}, overrides or {}))


def thing_name() -> str:
    thing = os.environ.get("AWS_IOT_THING_NAME", "")
    if not thing:
        raise EdgeinferError("AWS_IOT_THING_NAME is not set: run this component on a Greengrass core")
    return thing


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m edgeinfer.telemetry`: the component's Run step."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(
        prog="python -m edgeinfer.telemetry",
        description="Run the com.edgeinfer.Telemetry component (its recipe's Run step).",
    )
    parser.add_argument(
        "-o",
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a configuration key over what the nucleus holds, e.g. windowSeconds=1 (local runs; repeatable)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("EDGEINFER_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from edgeinfer.transport.ipc import GreengrassIpcBus

    try:
        overrides = config.parse_overrides(args.option)
        thing = thing_name()
        bus = GreengrassIpcBus.connect()
    except (EdgeinferError, TransportError) as exc:
        log.error("%s", exc)
        return 1
    try:
        cfg = read_config(bus.get_configuration(), overrides)
        component = TelemetryComponent(bus, thing, cfg, overrides=overrides)
    except (ConfigError, TransportError, OSError) as exc:  # OSError: the spool folder is unusable
        log.error("%s", exc)
        try:
            bus.update_state("ERRORED")
        except TransportError:
            pass
        finally:
            bus.close()
        return 1

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("signal %d: stopping", signum)
        component.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        component.start()
        component.run()
    finally:
        component.close()
        bus.close()
    return 0
