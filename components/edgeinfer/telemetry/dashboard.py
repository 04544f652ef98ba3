"""The state and rendering of `edgeinfer watch`, kept apart from the terminal and the broker.

`Dashboard.add_window()` / `add_result()` take what arrives from the broker (on the MQTT client's
thread); `render()` builds a `rich` renderable of everything seen. Tests render it to a string with a
`rich.console.Console(file=StringIO())`; the command shows it in a `rich.live.Live`. `FleetDashboard`
is the same for `watch --fleet`: one row per thing (the figures and order of `telemetry.fleet`).
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from edgeinfer.messages import Result, TelemetryWindow, parse_iso_utc
from edgeinfer.telemetry.fleet import (
    DEFAULT_STALE_WINDOWS,
    WORST_FIRST,
    ThingFigures,
    figures_of,
    worst_first,
)
from edgeinfer.telemetry.histogram import Histogram
from edgeinfer.telemetry.window import STAGES

__all__ = ["Dashboard", "FleetDashboard", "sparkline"]

_BLOCKS = "▁▂▃▄▅▆▇█"
_SEEN = 1000  # how far back duplicates are recognised


def sparkline(values: list[float]) -> str:
    if not values:
        return ""
    top = max(values)
    if top <= 0:
        return _BLOCKS[0] * len(values)
    return "".join(_BLOCKS[min(len(_BLOCKS) - 1, int(v / top * (len(_BLOCKS) - 1) + 0.5))] for v in values)


@dataclass
class _ResultEvent:
    at: float
    ok: bool
    cloud: bool
    code: str | None
    total_ms: float


@dataclass
class _Device:
    thing: str
    window: TelemetryWindow | None = None
    history: deque[TelemetryWindow] = field(default_factory=lambda: deque(maxlen=40))
    window_at: float = 0.0
    missing: int = 0  # windows whose seq has not arrived (yet)
    restarts: int = 0  # seq began again (component restarted without its spool state)
    duplicates: int = 0
    seen: dict[int, str] = field(default_factory=dict)  # seq -> timestamp
    results: deque[_ResultEvent] = field(default_factory=lambda: deque(maxlen=100_000))


class Dashboard:
    """Everything `watch` has seen, per thing. Thread-safe; `clock` makes rates testable."""

    def __init__(
        self, *, source: str = "", result_span_s: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.source = source
        self.result_span_s = result_span_s
        self._clock = clock
        self._devices: dict[str, _Device] = {}
        self._lock = threading.Lock()
        self.bad_messages = 0
        self.windows_received = 0

    def _device(self, thing: str) -> _Device:
        dev = self._devices.get(thing)
        if dev is None:
            dev = self._devices[thing] = _Device(thing)
        return dev

    # ---------------------------------------------------------------------------------------- input

    def add_window(self, window: TelemetryWindow) -> None:
        """Windows arrive at least once and, after an outage, possibly late: `seq` sorts it out."""
        with self._lock:
            dev = self._device(window.thing)
            last = dev.window
            seq = window.seq
            if last is not None:
                stamp = dev.seen.get(seq)
                if stamp == window.timestamp:
                    dev.duplicates += 1  # the nucleus delivered it and the spool resent it too
                    return
                if seq > last.seq and stamp is None:
                    dev.missing += seq - last.seq - 1
                elif stamp is not None or seq < last.seq - _SEEN:
                    dev.restarts += 1  # the component lost its spool state and began again
                    dev.seen.clear()
                    dev.missing = 0
                else:
                    dev.missing = max(0, dev.missing - 1)  # a late window fills its gap
                    dev.seen[seq] = window.timestamp
                    dev.history.append(window)
                    return
            dev.seen[seq] = window.timestamp
            if len(dev.seen) > 2 * _SEEN:
                dev.seen = {k: v for k, v in dev.seen.items() if k > seq - _SEEN}
            dev.window = window
            dev.history.append(window)
            dev.window_at = self._clock()
            self.windows_received += 1

    def add_result(self, thing: str, result: Result) -> None:
        with self._lock:
            dev = self._device(thing)
            dev.results.append(
                _ResultEvent(
                    at=self._clock(),
                    ok=result.status == "ok",
                    cloud=result.placement == "cloud",
                    code=result.error.code.value if result.error else None,
                    total_ms=result.latency_ms.total,
                )
            )

    @property
    def things(self) -> list[str]:
        with self._lock:
            return sorted(self._devices)

    # --------------------------------------------------------------------------------------- output

    def render(self) -> RenderableType:
        with self._lock:
            now = self._clock()
            parts: list[RenderableType] = [
                Text.assemble(
                    ("edgeinfer watch", "bold"),
                    f"  {self.source}  ",
                    (f"{len(self._devices)} device(s)", "cyan"),
                )
            ]
            if not self._devices:
                parts.append(Text("waiting for telemetry and results …", style="dim"))
            for thing in sorted(self._devices):
                parts.append(self._render_device(self._devices[thing], now))
            return Group(*parts)

    def _render_device(self, dev: _Device, now: float) -> RenderableType:
        rows: list[RenderableType] = []
        window = dev.window
        if window is None:
            rows.append(Text("no telemetry window yet", style="dim"))
        else:
            rows.append(self._latency_table(window))
            rows.append(self._window_summary(dev, window, now))
            if window.models:
                rows.append(_models_summary(window))
            if window.sources:
                rows.append(_sources_summary(window))
            if window.capture:
                rows.append(_capture_summary(window))
        rows.append(self._results_summary(dev, now))
        return Panel(Group(*rows), title=f"[bold]{dev.thing}[/]", title_align="left")

    @staticmethod
    def _latency_table(window: TelemetryWindow) -> Table:
        table = Table(
            title=f"latency (ms), window #{window.seq} ({window.window_s:g} s)", title_justify="left"
        )
        table.add_column("stage")
        for col in ("p50", "p90", "p99", "max"):
            table.add_column(col, justify="right")
        for stage in STAGES:
            q = window.latency_ms.get(stage)
            if q is None:
                continue
            table.add_row(stage, *(f"{getattr(q, c):.2f}" for c in ("p50", "p90", "p99", "max")))
        return table

    def _window_summary(self, dev: _Device, w: TelemetryWindow, now: float) -> Text:
        share = w.offloaded / w.count if w.count else 0.0
        errors = sum(w.errors.values())
        text = Text()
        text.append(f"throughput {w.throughput_rps:.1f}/s", style="bold")
        text.append(f"  requests {w.count}  offloaded {w.offloaded} ({share:.0%})  cascaded {w.cascaded}")
        text.append(f"  dropped {w.dropped}\n")
        text.append("errors ", style="bold")
        if errors:
            text.append(", ".join(f"{code} {n}" for code, n in sorted(w.errors.items())), style="red")
        else:
            text.append("none", style="green")
        text.append(
            f"  batch {w.batch.get('mean_size', 0):.2f} mean of {int(w.batch.get('executions', 0))} runs"
            f"  queue depth {w.queue_depth.get('mean', 0):.1f} mean / {w.queue_depth.get('max', 0):g} max"
            f"  provider {w.provider or '-'}\n"
        )
        system = w.system
        figures = []
        if "cpu_percent" in system:
            figures.append(f"cpu {system['cpu_percent']:.0f}%")
        if "rss_mb" in system:
            figures.append(f"rss {system['rss_mb']:.0f} MB")
        if "gpu_util_percent" in system:
            figures.append(f"gpu {system['gpu_util_percent']:.0f}% {system.get('gpu_mem_used_mb', 0):.0f} MB")
        spool = system.get("spool")
        if isinstance(spool, dict) and (spool.get("pending") or spool.get("dropped")):
            figures.append(f"spool {spool.get('pending', 0)} waiting, {spool.get('dropped', 0)} lost")
        if dev.missing:
            figures.append(f"{dev.missing} window(s) missing")
        if dev.restarts:
            figures.append(f"{dev.restarts} restart(s)")
        figures.append(f"updated {max(0.0, now - dev.window_at):.0f}s ago")
        text.append("  ".join(figures), style="dim")
        rates = [h.throughput_rps for h in dev.history]
        if len(rates) > 1:
            text.append(f"\nthroughput {sparkline(rates)}")
        return text

    def _results_summary(self, dev: _Device, now: float) -> Text:
        span = self.result_span_s
        while dev.results and now - dev.results[0].at > span:
            dev.results.popleft()
        recent = list(dev.results)
        text = Text()
        text.append(f"results (last {span:g} s) ", style="bold")
        if not recent:
            text.append("none seen", style="dim")
            return text
        hist = Histogram()
        for r in recent:
            if r.ok:
                hist.record(r.total_ms)
        codes = Counter(r.code or "?" for r in recent if not r.ok)
        cloud = sum(r.cloud for r in recent)
        p50, p99 = hist.quantiles((0.5, 0.99))
        text.append(
            f"{len(recent) / span:.1f}/s  ok {len(recent) - sum(codes.values())}  "
            f"cloud {cloud / len(recent):.0%}  total p50 {p50:.2f} ms  p99 {p99:.2f} ms"
        )
        if codes:
            text.append("  errors " + ", ".join(f"{c} {n}" for c, n in sorted(codes.items())), style="red")
        return text


_SHOWN_CLASSES = 3


def _models_summary(window: TelemetryWindow) -> Text:
    """One line per model that answered in the window: identity, answers, low confidence, top classes."""
    text = Text()
    for i, m in enumerate(window.models):
        if i:
            text.append("\n")
        text.append(f"model {m.name} {m.version}", style="bold")
        text.append(f" ({m.variant or '-'}, {m.provider or '-'})  answers {m.count}  ")
        share = m.low_confidence_share
        text.append(
            f"low confidence {m.low_confidence} ({share:.0%})",
            style="yellow" if m.low_confidence else "green",
        )
        top = sorted(m.classes.items(), key=lambda item: -item[1])[:_SHOWN_CLASSES]
        if top:
            text.append("  top " + ", ".join(f"{label} {n}" for label, n in top), style="dim")
        if m.counts and sum(m.counts):
            text.append(f"  scores {sparkline([float(n) for n in m.counts])}")
    return text


def _sources_summary(window: TelemetryWindow) -> Text:
    """One line per frame source in the window: frames served and dropped, and its outages."""
    text = Text()
    for i, (name, c) in enumerate(sorted(window.sources.items())):
        if i:
            text.append("\n")
        text.append(f"source {name}", style="bold")
        text.append(f"  served {c.get('served', 0)}  dropped {c.get('dropped', 0)}")
        if c.get("reconnects", 0) or c.get("outage_ms", 0):
            text.append(
                f"  reconnects {c.get('reconnects', 0)}  outage {c.get('outage_ms', 0) / 1000:.1f} s",
                style="yellow",
            )
    return text


def _capture_summary(window: TelemetryWindow) -> Text:
    """Capture's counters in the window: what was chosen, where it went, what was lost and why."""
    c = window.capture
    text = Text()
    text.append("capture ", style="bold")
    text.append(
        f"chosen {c.get('chosen', 0)}  spooled {c.get('spooled', 0)}  uploaded {c.get('uploaded', 0)}"
    )
    lost = {
        "busy": c.get("busy", 0),
        "dropped (size)": c.get("dropped_size", 0),
        "dropped (age)": c.get("dropped_age", 0),
        "upload failures": c.get("upload_failures", 0),
        "bad image": c.get("bad_image", 0) + c.get("no_image", 0),
    }
    shown = [f"{name} {n}" for name, n in lost.items() if n]
    if shown:
        text.append("  " + "  ".join(shown), style="yellow")
    return text


# -------------------------------------------------------------------------------------------- fleet

NONE = "–"


def _window_time(window: TelemetryWindow) -> float | None:
    try:
        return parse_iso_utc(window.timestamp)
    except ValueError:
        return None


@dataclass
class _Thing:
    window: TelemetryWindow
    model: str | None
    heard_at: float  # our clock, when any window of it last arrived


class FleetDashboard:
    """The latest window of every thing. Thread-safe; `clock` makes staleness testable.

    The latest window is the one stamped last, not the one that arrived last: a spool replays old
    windows after an outage, and a restarted component counts `seq` from 0 again.
    """

    def __init__(
        self,
        *,
        source: str = "",
        stale_windows: float = DEFAULT_STALE_WINDOWS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.stale_windows = stale_windows
        self._clock = clock
        self._things: dict[str, _Thing] = {}
        self._lock = threading.Lock()
        self.bad_messages = 0
        self.windows_received = 0

    def add_window(self, window: TelemetryWindow, model: str | None = None) -> None:
        with self._lock:
            now = self._clock()
            self.windows_received += 1
            known = self._things.get(window.thing)
            if known is None:
                self._things[window.thing] = _Thing(window, model, now)
                return
            known.heard_at = now  # even a replayed window says the thing is back
            new, old = _window_time(window), _window_time(known.window)
            if new is None or old is None or new >= old:
                known.window, known.model = window, model

    def _is_stale(self, thing: _Thing, now: float) -> bool:
        return now - thing.heard_at > self.stale_windows * thing.window.window_s

    def rows(self) -> list[tuple[ThingFigures, bool, float]]:
        """(figures, stale, seconds since heard) per thing, worst first."""
        with self._lock:
            now = self._clock()
            rows = [
                (figures_of(t.window, t.model), self._is_stale(t, now), max(0.0, now - t.heard_at))
                for t in self._things.values()
            ]
        rows.sort(key=lambda row: worst_first(row[0], row[1]))
        return rows

    @property
    def things(self) -> list[str]:
        with self._lock:
            return sorted(self._things)

    def render(self) -> RenderableType:
        rows = self.rows()
        stale = sum(1 for _, is_stale, _ in rows if is_stale)
        header = Text.assemble(
            ("edgeinfer watch --fleet", "bold"),
            f"  {self.source}  ",
            (f"{len(rows)} thing(s)", "cyan"),
            (f"  {stale} stale", "yellow") if stale else "",
            (f"  sorted worst first: {WORST_FIRST}", "dim"),
        )
        if not rows:
            return Group(header, Text("waiting for telemetry …", style="dim"))
        table = Table(show_edge=False, pad_edge=False)
        table.add_column("thing")
        table.add_column("model")
        for col in ("p50 ms", "p99 ms", "errors", "offloads", "req/s", "heard"):
            table.add_column(col, justify="right")
        for figures, is_stale, ago in rows:
            table.add_row(*_cells(figures, is_stale, ago), style="dim" if is_stale else None)
        return Group(header, table)


def _ms(value: float | None) -> str:
    return NONE if value is None else f"{value:.2f}"


def _cells(f: ThingFigures, stale: bool, ago: float) -> list[str | Text]:
    errors = Text(f"{f.errors} ({f.error_share:.1%})", style="red" if f.errors else "green")
    heard = Text(f"stale {ago:.0f}s", style="yellow") if stale else f"{ago:.0f}s ago"
    return [
        f.thing,
        f.model or NONE,
        _ms(f.p50_ms),
        _ms(f.p99_ms),
        errors,
        f"{f.offloaded} ({f.offload_share:.0%})",
        f"{f.throughput_rps:.1f}",
        heard,
    ]
