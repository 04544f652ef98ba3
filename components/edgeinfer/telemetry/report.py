"""`edgeinfer report`: latency plots (PNG) from benchmark JSON or recorded telemetry.

Two kinds of input, told apart by their shape:

- telemetry: telemetry windows, as a JSON list, an object with a `windows` list, or JSON Lines (what
  `edgeinfer watch --record FILE` writes). One PNG per device: p50 and p99 per stage over time, and
  throughput with the offloaded share, errors and each model's low-confidence share below it.
- benchmark: any JSON in which objects carry numeric `p50` and `p99` (milliseconds), at any depth, as
  `edgeinfer bench … --json FILE` writes them. One PNG: p50 and p99 side by side per entry, labelled by
  the path of keys that leads to it.

`--fleet` puts every device of the telemetry inputs in one PNG instead: total p99 and error share per
device over time, beside a bar chart of the devices over the whole recording, worst first (the order
of `watch --fleet`). `fleet_summary()` and `fleet_series()` are its figures, apart from the drawing.

matplotlib (the `plots` extra) is imported inside the functions, with the Agg backend: no display.
"""

from __future__ import annotations

import io
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from edgeinfer.errors import EdgeinferError
from edgeinfer.files import write_output
from edgeinfer.messages import MessageError, TelemetryWindow, parse_iso_utc
from edgeinfer.stats import quantile
from edgeinfer.telemetry.fleet import ThingFigures, figures_of, worst_first

__all__ = [
    "FleetPoint",
    "Series",
    "find_quantiles",
    "fleet_figsize",
    "fleet_series",
    "fleet_summary",
    "load",
    "low_confidence_series",
    "plot_file",
    "plot_fleet",
]

Series = list[tuple[str, dict[str, float]]]


def _load_json(path: Path) -> Any:
    try:
        text = path.read_text("utf-8")
    except OSError as exc:
        raise EdgeinferError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise EdgeinferError(f"{path} is not JSON or JSON Lines (not UTF-8 text)") from None
    try:
        return json.loads(text)
    except ValueError:
        pass
    docs = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            docs.append(json.loads(line))
        except ValueError as exc:
            raise EdgeinferError(f"{path}:{number}: not JSON or JSON Lines ({exc})") from None
    return docs


def _is_window(doc: Any) -> bool:
    return isinstance(doc, dict) and "seq" in doc and "latency_ms" in doc and "thing" in doc


def load(path: Path) -> tuple[str, Any]:
    """('telemetry', [TelemetryWindow]) or ('bench', Series)."""
    doc = _load_json(path)
    items = doc.get("windows") if isinstance(doc, dict) and isinstance(doc.get("windows"), list) else doc
    if isinstance(items, list) and items and all(_is_window(d) for d in items):
        try:
            return "telemetry", [TelemetryWindow.from_dict(d) for d in items]
        except MessageError as exc:
            raise EdgeinferError(f"{path}: {exc}") from None
    series = list(find_quantiles(doc))
    if not series:
        raise EdgeinferError(
            f"{path}: no latency figures found (expected telemetry windows, or objects with p50 and p99)"
        )
    return "bench", series


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


_QKEY = re.compile(r"^(?:(?P<prefix>.+?)_)?(?P<q>p50|median|p90|p99|max|mean)(?:_ms)?$")


def find_quantiles(doc: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, dict[str, float]]]:
    """Every group of numeric p50 and p99 figures, labelled by its key path (list items by `name`).

    Both spellings that benchmarks use are found: `{"p50": …, "p99": …}` objects and flat keys
    that share a prefix, `{"local_p50_ms": …, "local_p99_ms": …}` (milliseconds either way); a
    median stands for the p50 (`{"b1_median_ms": …, "b1_p99_ms": …}`).
    """
    if isinstance(doc, dict):
        groups: dict[str, dict[str, float]] = {}
        for key, value in doc.items():
            m = _QKEY.match(str(key))
            if m and _number(value):
                q = "p50" if m.group("q") == "median" else m.group("q")  # `bench model` says median
                groups.setdefault(m.group("prefix") or "", {}).setdefault(q, float(value))
        for prefix, figures in groups.items():
            if "p50" in figures and "p99" in figures:
                yield "/".join((*path, prefix) if prefix else path) or "latency", figures
        for key, value in doc.items():
            if isinstance(value, (dict, list)):
                yield from find_quantiles(value, (*path, str(key)))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            name = (value.get("name") or value.get("scenario")) if isinstance(value, dict) else None
            yield from find_quantiles(value, (*path, str(name) if name else str(i)))


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise EdgeinferError("report needs matplotlib: pip install 'edgeinfer[plots]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, out: Path) -> None:
    png = io.BytesIO()
    fig.savefig(png, dpi=110, format="png")
    write_output(out, png.getvalue())


def plot_telemetry(windows: list[TelemetryWindow], out_dir: Path, stem: str) -> list[Path]:
    plt = _pyplot()
    written = []
    by_thing: dict[str, list[TelemetryWindow]] = {}
    for w in windows:
        by_thing.setdefault(w.thing, []).append(w)
    for thing, items in sorted(by_thing.items()):
        items.sort(key=lambda w: w.seq)
        try:
            t0 = parse_iso_utc(items[0].timestamp)
            xs = [parse_iso_utc(w.timestamp) - t0 for w in items]
            xlabel = "time (s)"
        except ValueError:
            xs = [float(w.seq) for w in items]
            xlabel = "window seq"
        fig, (ax_lat, ax_rate) = plt.subplots(2, 1, figsize=(10, 7), sharex=True, height_ratios=(3, 1.3))
        stages = [
            s for s in ("total", "inference", "queue", "decode", "postprocess") if s in items[0].latency_ms
        ]
        for i, stage in enumerate(stages):
            color = f"C{i}"
            # a window without an ok request has no latency: a gap in the line, not a drop to zero
            has = [stage in w.latency_ms and w.count > sum(w.errors.values()) for w in items]
            p50 = [w.latency_ms[stage].p50 if h else math.nan for w, h in zip(items, has, strict=True)]
            p99 = [w.latency_ms[stage].p99 if h else math.nan for w, h in zip(items, has, strict=True)]
            ax_lat.plot(xs, p50, color=color, label=f"{stage} p50")
            ax_lat.plot(xs, p99, color=color, linestyle="--", label=f"{stage} p99")
        ax_lat.set_ylabel("latency (ms)")
        ax_lat.set_title(f"{thing}: latency per stage, p50 (solid) and p99 (dashed)")
        ax_lat.grid(alpha=0.3)
        ax_lat.legend(fontsize=7, ncol=2, loc="upper left")
        ax_rate.plot(xs, [w.throughput_rps for w in items], color="C0", label="throughput (req/s)")
        errors = [sum(w.errors.values()) / w.window_s if w.window_s else 0.0 for w in items]
        ax_rate.plot(xs, errors, color="C3", label="errors (/s)")
        ax_share = ax_rate.twinx()
        ax_share.plot(
            xs, [100.0 * w.offloaded / w.count if w.count else 0.0 for w in items], color="C2", linestyle=":"
        )
        for k, (label, shares) in enumerate(low_confidence_series(items).items()):
            ax_share.plot(xs, shares, color=f"C{4 + k % 6}", linestyle="-.", label=f"low conf. {label}")
        if ax_share.get_legend_handles_labels()[0]:
            ax_share.legend(fontsize=7, loc="upper right")
        ax_share.set_ylabel("offloaded % (dotted), low confidence % (dash-dot)", color="C2")
        ax_share.set_ylim(0, 100)
        ax_rate.set_xlabel(xlabel)
        ax_rate.set_ylabel("per second")
        ax_rate.grid(alpha=0.3)
        ax_rate.legend(fontsize=7, loc="upper left")
        fig.tight_layout()
        name = stem if len(by_thing) == 1 else f"{stem}-{thing}"
        out = out_dir / f"{name}.png"
        _save(fig, out)
        plt.close(fig)
        written.append(out)
        if any(w.capture for w in items):
            written.append(plot_capture(items, xs, xlabel, out_dir / f"{name}-capture.png"))
    return written


CAPTURE_SERIES = ("chosen", "spooled", "uploaded", "dropped_size", "dropped_age", "upload_failures")


def plot_capture(windows: list[TelemetryWindow], xs: list[float], xlabel: str, out: Path) -> Path:
    """Capture's counters per window: chosen, spooled and uploaded beside what was lost."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 3.5))
    for i, event in enumerate(CAPTURE_SERIES):
        ax.plot(xs, [w.capture.get(event, 0) for w in windows], color=f"C{i}", label=event, marker=".")
    ax.set_title(f"{windows[0].thing}: capture's records per window")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("records")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=3, loc="upper left")
    fig.tight_layout()
    _save(fig, out)
    plt.close(fig)
    return out


def low_confidence_series(windows: list[TelemetryWindow]) -> dict[str, list[float]]:
    """Per model ("name version"), its low-confidence share in percent in each window; NaN (a gap) in
    a window it did not answer in, so that a model update shows as one line ending and the next
    beginning."""
    labels = list(dict.fromkeys(m.label for w in windows for m in w.models))
    series = {label: [math.nan] * len(windows) for label in labels}
    for i, w in enumerate(windows):
        for m in w.models:
            if m.count:
                series[m.label][i] = 100.0 * m.low_confidence_share
    return series


def plot_bench(series: Series, out_dir: Path, stem: str, title: str) -> list[Path]:
    plt = _pyplot()
    labels = [label for label, _ in series]
    p50 = [q["p50"] for _, q in series]
    p99 = [q["p99"] for _, q in series]
    height = max(2.5, 0.45 * len(series) + 1.2)
    fig, ax = plt.subplots(figsize=(10, height))
    ys = list(range(len(series)))
    ax.barh([y - 0.2 for y in ys], p50, height=0.4, label="p50", color="C0")
    ax.barh([y + 0.2 for y in ys], p99, height=0.4, label="p99", color="C1")
    ax.set_yticks(ys, labels, fontsize=8)
    ax.invert_yaxis()
    positive = [v for v in p50 + p99 if v > 0]
    if positive and max(positive) / min(positive) > 100:
        ax.set_xscale("log")
    ax.set_xlabel("latency (ms)")
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = out_dir / f"{stem}.png"
    _save(fig, out)
    plt.close(fig)
    return [out]


def plot_file(path: Path, out_dir: Path) -> list[Path]:
    return plot_loaded(path, *load(path), out_dir)


def plot_loaded(path: Path, kind: str, data: Any, out_dir: Path) -> list[Path]:
    """Plot what `load(path)` returned."""
    if kind == "telemetry":
        return plot_telemetry(data, out_dir, path.stem)
    return plot_bench(data, out_dir, path.stem, f"{path.name}: p50 and p99 (ms)")


# ------------------------------------------------------------------------------------------- fleet

FleetPoint = tuple[float, float | None, float]  # (x, total p99 or None, error share)
_COLOURS = ("C0", "C1", "C2", "C3", "C4", "C5", "C6", "C8")  # not C7: grey is for the rest
_LABELLED = len(_COLOURS)  # the worst devices get a colour and a legend entry; the rest are drawn in grey


def _distinct(windows: list[TelemetryWindow]) -> dict[str, list[TelemetryWindow]]:
    """Per device, each window once (a recording holds a window twice when it was delivered twice)."""
    by_thing: dict[str, dict[tuple[int, str], TelemetryWindow]] = {}
    for w in windows:
        by_thing.setdefault(w.thing, {})[(w.seq, w.timestamp)] = w
    return {thing: sorted(ws.values(), key=_order) for thing, ws in by_thing.items()}


def _order(window: TelemetryWindow) -> tuple[float, int]:
    try:
        return parse_iso_utc(window.timestamp), window.seq
    except ValueError:
        return -math.inf, window.seq  # not nan: nan compares unequal to itself and breaks the sort


def fleet_summary(windows: list[TelemetryWindow]) -> list[ThingFigures]:
    """One row per device over the whole recording, worst first: its requests, errors and offloads
    summed, throughput over the time its windows cover, the median window's total p50 and the worst
    window's total p99 (window quantiles cannot be merged into the recording's own)."""
    rows = []
    for thing, items in _distinct(windows).items():
        figures = [figures_of(w) for w in items]
        p50s = [f.p50_ms for f in figures if f.p50_ms is not None]
        p99s = [f.p99_ms for f in figures if f.p99_ms is not None]
        span = sum(w.window_s for w in items)
        requests = sum(f.requests for f in figures)
        rows.append(
            ThingFigures(
                thing=thing,
                requests=requests,
                errors=sum(f.errors for f in figures),
                offloaded=sum(f.offloaded for f in figures),
                throughput_rps=requests / span if span > 0 else 0.0,
                p50_ms=quantile(p50s, 0.5) if p50s else None,
                p99_ms=max(p99s) if p99s else None,
            )
        )
    return sorted(rows, key=worst_first)


def fleet_series(windows: list[TelemetryWindow]) -> tuple[str, dict[str, list[FleetPoint]]]:
    """(x axis label, per device its windows in order as (x, total p99, error share)). x is seconds since
    the fleet's first window when every window has a timestamp, else the window's seq."""
    by_thing = _distinct(windows)
    try:
        t0 = min(parse_iso_utc(w.timestamp) for items in by_thing.values() for w in items)
    except ValueError:
        t0 = math.nan
    label = "window seq" if math.isnan(t0) else "time (s)"
    series = {}
    for thing, items in by_thing.items():
        points = []
        for w in items:
            f = figures_of(w)
            x = float(w.seq) if math.isnan(t0) else parse_iso_utc(w.timestamp) - t0
            points.append((x, f.p99_ms, f.error_share))
        series[thing] = points
    return label, series


def fleet_figsize(things: int) -> tuple[float, float]:
    """Inches: the bar chart grows with the number of devices, so each keeps a readable row."""
    return 14.0, max(7.0, 0.28 * things + 2.0)


def plot_fleet(windows: list[TelemetryWindow], out_dir: Path, stem: str = "fleet") -> list[Path]:
    plt = _pyplot()
    summary = fleet_summary(windows)
    if not summary:
        return []
    xlabel, series = fleet_series(windows)
    fig = plt.figure(figsize=fleet_figsize(len(summary)))
    grid = fig.add_gridspec(2, 2, width_ratios=(3, 2))
    ax_p99 = fig.add_subplot(grid[0, 0])
    ax_err = fig.add_subplot(grid[1, 0], sharex=ax_p99)
    ax_bar = fig.add_subplot(grid[:, 1])
    for index in reversed(range(len(summary))):  # the worst drawn last, on top
        row = summary[index]
        points = series[row.thing]
        style: dict[str, Any] = (
            {"color": _COLOURS[index], "label": row.thing, "linewidth": 1.5}
            if index < _LABELLED
            else {"color": "0.75", "linewidth": 0.8}
        )
        xs = [x for x, _, _ in points]
        ax_p99.plot(xs, [math.nan if p is None else p for _, p, _ in points], **style)
        ax_err.plot(xs, [100.0 * e for _, _, e in points], **style)
    ax_p99.set_ylabel("total p99 (ms)")
    ax_p99.set_title(f"{len(summary)} device(s): total p99 per window (the {_LABELLED} worst in colour)")
    handles, labels = ax_p99.get_legend_handles_labels()
    ax_p99.legend(handles[::-1], labels[::-1], fontsize=7, loc="upper left")  # worst first, as drawn last
    ax_err.set_ylabel("errors (% of requests)")
    ax_err.set_xlabel(xlabel)
    for ax in (ax_p99, ax_err):
        ax.grid(alpha=0.3)
    _fleet_bars(ax_bar, summary)
    fig.tight_layout()
    out = out_dir / f"{stem}.png"
    _save(fig, out)
    plt.close(fig)
    return [out]


def _fleet_bars(ax: Any, summary: list[ThingFigures]) -> None:
    ys = list(range(len(summary)))
    ax.barh(ys, [100.0 * r.error_share for r in summary], color="C3", label="errors (% of requests)")
    ax.set_yticks(ys, [r.thing for r in summary], fontsize=7)
    ax.invert_yaxis()
    top = max((100.0 * r.error_share for r in summary), default=0.0)
    ax.set_xlim(0, max(1.0, top * 1.35))  # room for the p99 labels right of the bars
    for y, row in zip(ys, summary, strict=True):
        p99 = "–" if row.p99_ms is None else f"{row.p99_ms:.1f} ms"
        ax.annotate(
            f" p99 {p99}", (100.0 * row.error_share, y), va="center", fontsize=7, annotation_clip=False
        )
    ax.set_xlabel("errors (% of requests over the recording)")
    ax.set_title("over the recording, worst first (as watch --fleet sorts)", fontsize=9)
    ax.grid(axis="x", alpha=0.3)
