"""An optional Prometheus text endpoint on the device (off by default; loopback unless configured).

Serves `GET /metrics` in the Prometheus text exposition format 0.0.4 with the stdlib `http.server`:
per-stage latency quantiles of the last closed window (a `summary` without sum/count, as Prometheus
allows), the window's throughput and queue depth, counters accumulated since the component started
(requests, errors by code, dropped, offloaded, cascaded, executions, inferences), the provider as an
info-style gauge, and the numeric system figures. Per model (`model`, `version` labels): answers and
low-confidence answers since start (counters), and the last window's low-confidence share and an
info-style gauge naming the variant and provider of each model it saw. Capture's counters since start,
by event (chosen, spooled, uploaded, dropped_size, dropped_age, upload_failures, ...), when capture is on.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from edgeinfer.messages import TelemetryWindow

__all__ = ["MetricsState", "ModelTotals", "PrometheusExporter", "render_metrics"]

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_QUANTILES = (("p50", "0.5"), ("p90", "0.9"), ("p99", "0.99"))


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(value: float) -> str:
    return repr(float(value))


class MetricsState:
    """The last window plus counters summed over every window since start."""

    def __init__(self) -> None:
        self.last: TelemetryWindow | None = None
        self.totals: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.models = ModelTotals()
        self.capture: Counter[str] = Counter()
        self.sources: Counter[tuple[str, str]] = Counter()  # (source, counter)
        self._lock = threading.Lock()

    def update(self, window: TelemetryWindow) -> None:
        with self._lock:
            self.last = window
            self.totals["requests"] += window.count
            self.totals["dropped"] += window.dropped
            self.totals["offloaded"] += window.offloaded
            self.totals["cascaded"] += window.cascaded
            self.totals["batch_executions"] += int(window.batch.get("executions", 0))
            self.totals["inferences"] += int(window.batch.get("inferences", 0))
            self.errors.update(window.errors)
            self.capture.update(window.capture)
            for name, counts in window.sources.items():
                self.sources.update({(name, key): n for key, n in counts.items()})
            for model in window.models:
                key = (model.name, model.version)
                self.models.requests[key] += model.count
                self.models.low_confidence[key] += model.low_confidence

    def render(self) -> str:
        with self._lock:
            return render_metrics(
                self.last, self.totals, self.errors, self.models, capture=self.capture, sources=self.sources
            )


@dataclass
class ModelTotals:
    """Per (model name, version), summed over every window since start."""

    requests: Counter[tuple[str, str]] = field(default_factory=Counter)
    low_confidence: Counter[tuple[str, str]] = field(default_factory=Counter)


def _model_labels(name: str, version: str) -> str:
    return f'model="{_label(name)}",version="{_label(version)}"'


def _model_lines(window: TelemetryWindow | None, models: ModelTotals) -> list[str]:
    lines: list[str] = []

    def family(name: str, kind: str, help_text: str) -> None:
        lines.append(f"# HELP edgeinfer_{name} {help_text}")
        lines.append(f"# TYPE edgeinfer_{name} {kind}")

    if models.requests:
        family("model_requests_total", "counter", "Answers per model and version (ok, from the model).")
        for (name, version), n in sorted(models.requests.items()):
            lines.append(f"edgeinfer_model_requests_total{{{_model_labels(name, version)}}} {n}")
        family("model_low_confidence_total", "counter", "Answers whose top score was below lowConfidence.")
        for (name, version), n in sorted(models.low_confidence.items()):
            lines.append(f"edgeinfer_model_low_confidence_total{{{_model_labels(name, version)}}} {n}")
    if window is None or not window.models:
        return lines
    thing = _label(window.thing)
    family("model_low_confidence_share", "gauge", "Share of low-confidence answers in the last window.")
    for m in window.models:
        labels = f'thing="{thing}",{_model_labels(m.name, m.version)}'
        lines.append(f"edgeinfer_model_low_confidence_share{{{labels}}} {_num(m.low_confidence_share)}")
    family("model_info", "gauge", "The models that answered in the last window, their variant and provider.")
    for m in window.models:
        labels = (
            f'thing="{thing}",{_model_labels(m.name, m.version)},variant="{_label(m.variant)}",'
            f'provider="{_label(m.provider or "")}"'
        )
        lines.append(f"edgeinfer_model_info{{{labels}}} 1")
    return lines


def _capture_lines(capture: Counter[str]) -> list[str]:
    if not capture:  # capture off: no family at all
        return []
    lines = [
        "# HELP edgeinfer_capture_total Capture's counters by event (docs/capture.md).",
        "# TYPE edgeinfer_capture_total counter",
    ]
    for event, n in sorted(capture.items()):
        lines.append(f'edgeinfer_capture_total{{event="{_label(event)}"}} {n}')
    return lines


def _source_lines(sources: Counter[tuple[str, str]]) -> list[str]:
    if not sources:  # no frame source: no family at all
        return []
    lines = [
        "# HELP edgeinfer_source_total Each frame source's counters: frames served and dropped, "
        "reconnects, milliseconds of outage (docs/sources.md).",
        "# TYPE edgeinfer_source_total counter",
    ]
    for (name, event), n in sorted(sources.items()):
        lines.append(f'edgeinfer_source_total{{source="{_label(name)}",event="{_label(event)}"}} {n}')
    return lines


def render_metrics(
    window: TelemetryWindow | None,
    totals: Counter[str],
    errors: Counter[str],
    models: ModelTotals | None = None,
    *,
    capture: Counter[str] | None = None,
    sources: Counter[tuple[str, str]] | None = None,
) -> str:
    lines: list[str] = []

    def family(name: str, kind: str, help_text: str) -> None:
        lines.append(f"# HELP edgeinfer_{name} {help_text}")
        lines.append(f"# TYPE edgeinfer_{name} {kind}")

    descriptions = {
        "requests": "Requests answered (ok and error).",
        "dropped": "Frames dropped before inference.",
        "offloaded": "Requests answered by the cloud.",
        "cascaded": "Requests sent to the cloud's heavier model for low confidence.",
        "batch_executions": "Engine executions (batches run).",
        "inferences": "Images run by the engine.",
    }
    for key, text in descriptions.items():
        family(f"{key}_total", "counter", text)
        lines.append(f"edgeinfer_{key}_total {totals.get(key, 0)}")
    family("errors_total", "counter", "Error results by stable error code.")
    for code, n in sorted(errors.items()):
        lines.append(f'edgeinfer_errors_total{{code="{_label(code)}"}} {n}')
    lines += _model_lines(window, models or ModelTotals())
    lines += _capture_lines(capture or Counter())
    lines += _source_lines(sources or Counter())
    if window is None:
        return "\n".join(lines) + "\n"
    thing = _label(window.thing)
    family("latency_ms", "summary", "Per-stage latency of the last window in milliseconds.")
    for stage, q in window.latency_ms.items():
        for attr, quantile in _QUANTILES:
            value = getattr(q, attr)
            lines.append(
                f'edgeinfer_latency_ms{{thing="{thing}",stage="{_label(stage)}",quantile="{quantile}"}} '
                f"{_num(value)}"
            )
    family("latency_max_ms", "gauge", "Per-stage maximum latency of the last window in milliseconds.")
    for stage, q in window.latency_ms.items():
        lines.append(f'edgeinfer_latency_max_ms{{thing="{thing}",stage="{_label(stage)}"}} {_num(q.max)}')
    family("throughput_rps", "gauge", "Requests answered per second in the last window.")
    lines.append(f'edgeinfer_throughput_rps{{thing="{thing}"}} {_num(window.throughput_rps)}')
    family("batch_mean_size", "gauge", "Mean batch size in the last window.")
    lines.append(f'edgeinfer_batch_mean_size{{thing="{thing}"}} {_num(window.batch.get("mean_size", 0.0))}')
    family("queue_depth", "gauge", "Queue depth seen by requests in the last window.")
    for stat in ("mean", "max"):
        value = window.queue_depth.get(stat, 0.0)
        lines.append(f'edgeinfer_queue_depth{{thing="{thing}",stat="{stat}"}} {_num(value)}')
    family("window_seq", "gauge", "Sequence number of the last telemetry window.")
    lines.append(f'edgeinfer_window_seq{{thing="{thing}"}} {window.seq}')
    if window.provider:
        family("provider_info", "gauge", "The ONNX Runtime execution provider that ran the last window.")
        lines.append(f'edgeinfer_provider_info{{thing="{thing}",provider="{_label(window.provider)}"}} 1')
    for key, value in sorted(window.system.items()):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        family(f"system_{key}", "gauge", f"System figure {key} at the end of the last window.")
        lines.append(f'edgeinfer_system_{key}{{thing="{thing}"}} {_num(value)}')
    return "\n".join(lines) + "\n"


class PrometheusExporter:
    """`GET /metrics` on `bind:port` (port 0 picks a free one; see `.port`) from a daemon thread."""

    def __init__(self, state: MetricsState, *, bind: str = "127.0.0.1", port: int = 9464) -> None:
        self.state = state
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] not in ("/metrics", "/"):
                    self.send_error(404, "only /metrics is served")
                    return
                body = outer.state.render().encode("utf-8")
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("prometheus: " + format, *args)

        self._server = ThreadingHTTPServer((bind, port), Handler)
        self._server.daemon_threads = True
        self.bind = bind
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="prometheus", daemon=True)
        self._thread.start()
        log.info("Prometheus metrics on http://%s:%d/metrics", bind, self.port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
