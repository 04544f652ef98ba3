"""The `com.edgeinfer.Telemetry` Greengrass component.

Subscribes to the runtime's timings on local pub/sub (`edgeinfer/local/timings`), folds them into
windows (`window.WindowAggregator`), adds system figures (`system.SystemSampler`), publishes each window
to IoT Core on `edgeinfer/{thing}/telemetry` through the spool (`spool.SpoolingPublisher`), optionally
serves Prometheus text on the device (`prometheus`), and reports RUNNING once it is subscribed.

Configuration (recipe `DefaultConfiguration`, camelCase as AWS's components; read at start, and
`windowSeconds` / the spool bounds follow configuration updates live):

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
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from edgeinfer.errors import EdgeinferError
from edgeinfer.messages import TIMINGS_TOPIC, TelemetryWindow, telemetry_topic
from edgeinfer.telemetry.prometheus import MetricsState, PrometheusExporter
from edgeinfer.telemetry.spool import Spool, SpoolingPublisher
from edgeinfer.telemetry.system import SystemSampler
from edgeinfer.telemetry.window import WindowAggregator
from edgeinfer.transport import Bus, Message, Subscription, TransportError

__all__ = ["TelemetryComponent", "TelemetryConfig", "main"]

log = logging.getLogger(__name__)

COMPONENT = "com.edgeinfer.Telemetry"


class ConfigError(EdgeinferError):
    """A configuration value the component cannot use."""


@dataclass(frozen=True)
class TelemetryConfig:
    windowSeconds: float = 10.0  # noqa: N815 (recipe keys are camelCase)
    qos: int = 1
    spoolDir: str = ""  # noqa: N815
    spoolMaxWindows: int = 8640  # noqa: N815
    spoolMaxBytes: int = 50_000_000  # noqa: N815
    systemMetrics: bool = True  # noqa: N815
    gpuMetrics: bool = True  # noqa: N815
    processMatch: str = "edgeinfer."  # noqa: N815
    prometheusPort: int = 0  # noqa: N815
    prometheusBind: str = "127.0.0.1"  # noqa: N815

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> TelemetryConfig:
        """Validate configuration; unknown keys (e.g. accessControl) are ignored. Raises ConfigError."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in doc:
                continue
            raw = doc[f.name]
            kind = type(getattr(cls(), f.name))
            try:
                values[f.name] = _coerce(raw, kind)
            except (TypeError, ValueError, OverflowError):  # OverflowError: int("inf")
                raise ConfigError(
                    f"configuration {f.name}={raw!r} of {COMPONENT} must be a {kind.__name__}"
                ) from None
        config = cls(**values)
        config.check()
        return config

    def check(self) -> None:
        problems = []
        if not 0.05 <= self.windowSeconds <= 3600:
            problems.append("windowSeconds must be between 0.05 and 3600")
        if self.qos not in (0, 1):
            problems.append("qos must be 0 or 1")
        if self.spoolMaxWindows < 1:
            problems.append("spoolMaxWindows must be at least 1")
        if self.spoolMaxBytes < 1024:
            problems.append("spoolMaxBytes must be at least 1024")
        if not 0 <= self.prometheusPort <= 65535:
            problems.append("prometheusPort must be 0 (off) or a TCP port")
        if problems:
            raise ConfigError(f"bad configuration of {COMPONENT}: " + "; ".join(problems))

    def spool_path(self, work: Path | None = None) -> Path:
        return Path(self.spoolDir) if self.spoolDir else (work or Path.cwd()) / "spool"


def _coerce(raw: Any, kind: type) -> Any:
    """Greengrass configuration arrives as JSON; numbers may come as strings from the console."""
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.lower() in ("true", "false"):
            return raw.lower() == "true"
        raise TypeError
    if kind is int:
        if isinstance(raw, bool):
            raise TypeError
        value = float(raw)
        if value != int(value):
            raise ValueError
        return int(value)
    if kind is float:
        if isinstance(raw, bool):
            raise TypeError
        return float(raw)
    if not isinstance(raw, str):
        raise TypeError
    return raw


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
    ) -> None:
        self.bus = bus
        self.thing = thing
        self.config = config or TelemetryConfig()
        self._clock = clock
        cfg = self.config
        self.spool = Spool(cfg.spool_path(work), max_windows=cfg.spoolMaxWindows, max_bytes=cfg.spoolMaxBytes)
        self.publisher = SpoolingPublisher(bus, telemetry_topic(thing), self.spool, qos=cfg.qos, clock=clock)
        self._sampler: SystemSampler | None = None
        if system is None and cfg.systemMetrics:
            self._sampler = SystemSampler(
                match=tuple(m for m in cfg.processMatch.split(",") if m.strip()),
                gpu=cfg.gpuMetrics,
            )
            system = self._sampler
        self.aggregator = WindowAggregator(
            thing,
            window_s=cfg.windowSeconds,
            clock=clock,
            wall=wall,
            system=system,
            first_seq=self.publisher.next_seq,
        )
        self.metrics = MetricsState()
        self.exporter: PrometheusExporter | None = None
        self._subs: list[Subscription] = []
        self._stop = threading.Event()
        self.windows_sent: list[TelemetryWindow] = []  # the last few, for tests and `status`

    # ------------------------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self._subs.append(self.bus.subscribe(TIMINGS_TOPIC, self._on_timings, target="local"))
        self._subs.append(self.bus.on_configuration_update(self._on_config_update))
        self._subs.append(self.bus.on_validate_configuration(self._validate))
        if self.config.prometheusPort:
            try:
                self.exporter = PrometheusExporter(
                    self.metrics, bind=self.config.prometheusBind, port=self.config.prometheusPort
                )
            except OSError as exc:  # port taken: telemetry still flows to IoT Core
                log.error(
                    "cannot serve Prometheus on %s:%d: %s",
                    self.config.prometheusBind,
                    self.config.prometheusPort,
                    exc,
                )
        log.info(
            "telemetry for %s: %.3g s windows on %s, spool %s (%d waiting, next seq %d)",
            self.thing,
            self.config.windowSeconds,
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
            TelemetryConfig.from_dict(proposed)
        except ConfigError as exc:
            return str(exc)
        return None

    def _on_config_update(self, key_path: list[str]) -> None:
        try:
            doc = self.bus.get_configuration()
            new = TelemetryConfig.from_dict(doc if isinstance(doc, Mapping) else {})
        except (TransportError, ConfigError) as exc:
            log.warning("ignoring a configuration update (%s): %s", "/".join(key_path), exc)
            return
        if new.windowSeconds != self.config.windowSeconds:
            self.aggregator.set_window(new.windowSeconds)
        self.spool.max_windows = new.spoolMaxWindows
        self.spool.max_bytes = new.spoolMaxBytes
        self.publisher.qos = new.qos
        restart_needed = [
            f.name
            for f in fields(TelemetryConfig)
            if f.name not in ("windowSeconds", "spoolMaxWindows", "spoolMaxBytes", "qos")
            and getattr(new, f.name) != getattr(self.config, f.name)
        ]
        if restart_needed:
            log.warning("configuration %s changes at the next restart", ", ".join(restart_needed))
        self.config = new
        log.info("configuration updated: %s", "/".join(key_path))


def thing_name() -> str:
    thing = os.environ.get("AWS_IOT_THING_NAME", "")
    if not thing:
        raise ConfigError("AWS_IOT_THING_NAME is not set: run this component on a Greengrass core")
    return thing


def main() -> int:
    """`python -m edgeinfer.telemetry`: the component's Run step."""
    import signal

    logging.basicConfig(
        level=os.environ.get("EDGEINFER_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from edgeinfer.transport.ipc import GreengrassIpcBus

    try:
        thing = thing_name()
        bus = GreengrassIpcBus.connect()
    except (ConfigError, TransportError) as exc:
        log.error("%s", exc)
        return 1
    try:
        doc = bus.get_configuration()
        config = TelemetryConfig.from_dict(doc if isinstance(doc, Mapping) else {})
        component = TelemetryComponent(bus, thing, config)
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
