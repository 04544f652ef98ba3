"""How `edgeinfer bench iot` prints a run: one table row per load, then each target met or not."""

from __future__ import annotations

from typing import Any

from edgeinfer_bench.iot.processes import PROCESSES


def seconds_text(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


def print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"bench iot: deadline {report['deadline_ms']:g} ms, QoS 1, "
        f"load average {report['machine']['loadavg_start']}"
    )
    columns = ("rate", "sent / answered", "dup", "ok in time (p50)", "ok late", "errors",
               "last answer after load", "fresh ok after", "RSS peak MB nucleus/runtime/broker")  # fmt: skip
    for col in columns:
        table.add_column(col, justify="right")
    for r in report["loads"]:
        rate = f"{r['target_rps']:g}"
        if r["reached_rps"] < 0.95 * r["target_rps"]:
            rate += f" (reached {r['reached_rps']:.0f})"
        p50 = f" ({r['ok_p50_ms']:.0f} ms)" if r["ok_p50_ms"] is not None else ""
        rss = " / ".join(
            "-" if r["processes"][n]["rss_peak_mb"] is None else f"{r['processes'][n]['rss_peak_mb']:.0f}"
            for n in PROCESSES
        )
        counts = f"{r['sent']:,} / {r['answered']:,}" + (f" ({r['lost']} lost)" if r["lost"] else "")
        if r.get("expired_in_broker"):
            counts += f" ({r['expired_in_broker']:,} unanswered, expiry {r['expiry_s']} s)"
        table.add_row(
            rate,
            counts,
            str(r["duplicates"]),
            f"{r['ok_in_time']:,}{p50}",
            f"{r['ok_late']:,}",
            ", ".join(f"{k} {v}" for k, v in r["codes"].items()) or "-",
            seconds_text(r["last_answer_after_load_s"]),
            seconds_text(r["fresh_request_ok_after_s"]),
            rss,
        )
    Console(width=200).print(table)
    for name, ok in report["targets"].items():
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
