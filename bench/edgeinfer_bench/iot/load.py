"""One load of `edgeinfer bench iot`: its sender started, its answers awaited, fresh probes until the
device answers one in time again, and its figures; and each load's label."""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from typing import Any

from edgeinfer import procfs
from edgeinfer.errors import EdgeinferError
from edgeinfer_bench.iot.accounting import ANSWER_WINDOW_S, PROBE_FIELDS, Answers, rounded, summarize
from edgeinfer_bench.iot.broker_sys import BrokerSys
from edgeinfer_bench.iot.processes import THING, Core, Sampler
from edgeinfer_bench.iot.report import seconds_text
from edgeinfer_bench.iot.sender import ACK_TIMEOUT_S, LoadSpec, Sender, request_properties
from edgeinfer_bench.requests import Template

PROBE_INTERVAL_S = 0.1


def progress(text: str) -> None:
    print(f"bench iot: {text}", file=sys.stderr, flush=True)


def loadavg() -> list[float]:
    text = procfs.read(procfs.PROC / "loadavg") or ""
    try:
        return [float(x) for x in text.split()[:3]]
    except ValueError:
        return []


def load_labels(rates: list[float], flood: float) -> list[tuple[str, float]]:
    """(label, rate) per load; a label prefixes its request ids, so a rate given twice gets `-2`."""
    loads: list[tuple[str, float]] = []
    for name, rate in [(f"r{r:g}", r) for r in rates] + ([("flood", flood)] if flood > 0 else []):
        taken = sum(1 for label, _ in loads if label == name or label.startswith(f"{name}-"))
        loads.append((f"{name}-{taken + 1}" if taken else name, rate))
    return loads


class Prober:
    """Fresh requests every PROBE_INTERVAL_S from this process's client, until one is answered ok
    within its deadline; each with the requests' message expiry (`properties`)."""

    def __init__(
        self,
        client: Any,
        topic: str,
        part: Template,
        answers: Answers,
        deadline_ms: float,
        *,
        properties: Any = None,
    ) -> None:
        self.client, self.topic, self.part, self.answers = client, topic, part, answers
        self.deadline_ms = deadline_ms
        self.properties = properties
        self.sent: list[tuple[str, float]] = []
        self.recovered_at: float | None = None

    def step(self, label: str) -> None:
        """Check the probes so far; send the next one unless one was answered ok in time."""
        from edgeinfer.transport import TransportError

        for rid, sent_at in self.sent:
            got = self.answers.first(rid)
            if got is not None and got[1].status == "ok" and (got[0] - sent_at) * 1000 <= self.deadline_ms:
                self.recovered_at = got[0] if self.recovered_at is None else min(self.recovered_at, got[0])
        if self.recovered_at is not None:
            return
        rid = f"probe-{label}-{len(self.sent)}"
        sent_at = time.time()
        with contextlib.suppress(TransportError):  # a refused hand-off: the next probe tries again
            self.client.publish(
                self.topic, self.part.body(rid, sent_at), qos=1, wait=False, properties=self.properties
            )
            self.sent.append((rid, sent_at))


def run_load(
    args: argparse.Namespace,
    *,
    core: Core,
    client: Any,
    answers: Answers,
    sampler: Sampler,
    broker_sys: BrokerSys,
    parts: list[Template],
    label: str,
    rate: float,
) -> dict[str, Any]:
    from edgeinfer.messages import infer_topic

    topic = infer_topic(THING)
    expiry_s = args.expiry_s
    spec = LoadSpec(core.address, topic, parts, label, rate, args.seconds, args.all_requests, expiry_s)
    sender = Sender(spec)
    try:
        sender.ready()
        load_avg_before = loadavg()
        sys_start = broker_sys.snapshot()
        progress(f"{label}: {rate:g} req/s for {args.seconds:g} s")
        start = time.time()
        load_end = sender.go()
        prober = Prober(
            client, topic, parts[0], answers, args.deadline_ms, properties=request_properties(expiry_s)
        )
        report: dict[str, Any] | None = None
        ids: list[str] = []
        # Until every request is answered (or its window is over) and a probe came back ok in time
        # (or the recovery timeout): probing from the load's end on, while the sender still waits
        # for its PUBACKs (it names the requests it sent once they are in).
        next_line = time.time() + 5
        while True:
            core.check()
            now = time.time()
            if report is None:
                report = sender.report()
                if report is None and now > load_end + ACK_TIMEOUT_S + 30:
                    raise EdgeinferError("the sender process did not report its requests")
                ids = [rid for rid, _ in report["sent"]] if report is not None else []
            if prober.recovered_at is None and now < load_end + args.recovery_timeout:
                prober.step(label)
            got = answers.count(ids)
            drained = report is not None and (got >= len(ids) or now >= load_end + ANSWER_WINDOW_S)
            if drained and (prober.recovered_at is not None or now >= load_end + args.recovery_timeout):
                break
            if now >= next_line:
                state = "recovered" if prober.recovered_at is not None else "not yet recovered"
                if report is None:
                    state += ", the sender still waits for PUBACKs"
                progress(
                    f"{label}: {got} of {len(ids)} answered {now - load_end:.0f} s after the load, {state}"
                )
                next_line = now + 5
            time.sleep(PROBE_INTERVAL_S)
        time.sleep(1.0)  # a duplicate, if any, would come now
        settled = time.time()
    finally:
        sender.close()
    assert report is not None  # the loop ends only once the sender reported
    snapshot = answers.snapshot()
    summary = summarize(report["sent"], snapshot, load_end, args.deadline_ms, expiry_s=expiry_s)
    probes = summarize(prober.sent, snapshot, load_end, args.deadline_ms, math.inf, expiry_s=expiry_s)
    duration = max(1e-9, report["end"] - report["start"])
    out = {
        "label": label,
        "target_rps": rate,
        "reached_rps": round(len(report["sent"]) / duration, 1),
        "seconds": round(duration, 3),
        "requests_due": report["target"],
        "not_handed_off": report["not_sent"],
        "puback_failed": report["puback_failed"],
        "puback_missing": report["puback_missing"],
        "last_puback_after_load_s": round(report["last_puback"] - load_end, 3),
        "sender_most_behind_s": round(report["most_behind_s"], 3),
        "sender_cpu_s": round(report["cpu_s"], 2),
        "sender_rss_peak_mb": round(report["rss_peak_mb"], 1),
        **summary,
        "fresh_request_ok_after_s": rounded(prober.recovered_at - load_end)
        if prober.recovered_at is not None
        else None,
        # answered: by the time the load was settled (the last probes may still be on their way)
        # the same from the broker's last PUBACK: what the sender's own client queue held is not
        # the device's backlog (the target above counts it, this does not)
        "fresh_request_ok_after_last_puback_s": rounded(prober.recovered_at - report["last_puback"])
        if prober.recovered_at is not None
        else None,
        "probes": {k: probes[k] for k in PROBE_FIELDS},
        "processes": sampler.between(start, settled),
        "broker_sys_at_start": sys_start,
        "broker_sys_settled": broker_sys.snapshot(),
        "loadavg_before": load_avg_before,
        "loadavg_after": loadavg(),
    }
    out["_sent"] = (report["sent"], prober.sent, load_end)
    progress(
        f"{label}: {out['answered']}/{out['sent']} answered, {out['duplicates']} duplicates, "
        f"{out['ok_in_time']} ok in time, {out['ok_late']} ok late, fresh ok after "
        f"{seconds_text(out['fresh_request_ok_after_s'])}"
    )
    return out
