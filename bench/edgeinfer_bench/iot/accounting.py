"""Exactly-once accounting of `edgeinfer bench iot`, client side: the answers received per request id,
each load's counts (answered, lost, duplicates, ok in time or late, expired in the broker), the
final wait for what is still unanswered, and which of #19's targets a run met."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from edgeinfer.stats import quantile

ANSWER_WINDOW_S = 30.0  # an answer later than this after the load's end counts as lost
RECOVERY_TARGET_S = 5.0
OK_LATE_SHARE = 0.01  # ok answers past their deadline allowed per load (those computing at expiry)
FINAL_WAIT_S = 30.0  # at the run's end, for whatever is still unanswered
LOST_MEANS = "no answer within answer_window_s of the load's end"
LOST_MEANS_EXPIRY = (
    "no answer within answer_window_s of the load's end, less the unanswered requests the broker may "
    "have discarded at their message expiry (expired_in_broker: no later request of the load was "
    "answered within message_expiry_s of their sending)"
)
PROBE_FIELDS = ("sent", "answered", "duplicates", "ok_in_time", "codes", "expired_in_broker")


@dataclass
class Answers:
    """Every result received, per request id, with the wall time it arrived."""

    by_id: dict[str, list[tuple[float, Any]]] = field(default_factory=dict)
    unreadable: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handler(self, message: Any) -> None:
        from edgeinfer.messages import Result

        now = time.time()
        try:
            result = Result.parse(message.payload)
        except Exception:
            with self.lock:
                self.unreadable += 1
            return
        with self.lock:
            self.by_id.setdefault(result.id or "", []).append((now, result))

    def first(self, rid: str) -> tuple[float, Any] | None:
        with self.lock:
            got = self.by_id.get(rid)
            return got[0] if got else None

    def count(self, ids: list[str]) -> int:
        with self.lock:
            return sum(1 for rid in ids if rid in self.by_id)

    def snapshot(self) -> dict[str, list[tuple[float, Any]]]:
        with self.lock:
            return {k: list(v) for k, v in self.by_id.items()}


def summarize(
    sent: list[tuple[str, float]],
    answers: dict[str, list[tuple[float, Any]]],
    load_end: float,
    deadline_ms: float,
    window_s: float = ANSWER_WINDOW_S,
    *,
    expiry_s: int | None = None,
) -> dict[str, Any]:
    """Exactly-once accounting of one load, client side: `answered` within `window_s` of the load's
    end, `lost` otherwise (`answered_after_window` of those came later), `duplicates` every answer
    beyond the first, ok in time / late by answer time minus `sent_at`. `sent` is in sending order,
    one publisher's requests.

    With `expiry_s` (the requests' MQTT 5 message expiry) an unanswered request counts as
    `expired_in_broker` unless a later request of `sent` was answered within `expiry_s` of this one's
    `sent_at`: the broker hands one publisher's messages to a subscriber in order, so that later
    answer proves this one was handed on before its expiry ran out (the broker received it no earlier
    than `sent_at`), and it counts as `lost`. The broker's discards themselves are not observable:
    `expired_in_broker` means "unanswered, and the broker may have discarded it as the sender
    instructed". Without expiry every unanswered request is lost."""
    answered = lost = after_window = duplicates = ok_in_time = ok_late = unanswered = 0
    expired = 0
    codes: dict[str, int] = {}
    ok_ms: list[float] = []
    last = None
    # per request, the earliest first answer of any request sent after it (sending order)
    later_answer = [math.inf] * len(sent)
    earliest = math.inf
    for i in range(len(sent) - 1, -1, -1):
        later_answer[i] = earliest
        got = answers.get(sent[i][0])
        if got:
            earliest = min(earliest, got[0][0])
    for (rid, sent_at), later in zip(sent, later_answer, strict=True):
        got = answers.get(rid)
        if not got:
            unanswered += 1
            if expiry_s is not None and later - sent_at > expiry_s:
                expired += 1
            else:
                lost += 1
            continue
        duplicates += len(got) - 1
        at, result = got[0]
        if at > load_end + window_s:
            lost += 1
            after_window += 1
            continue
        answered += 1
        last = at if last is None else max(last, at)
        latency_ms = (at - sent_at) * 1000
        if result.status == "ok":
            ok_ms.append(latency_ms)
            if latency_ms <= deadline_ms:
                ok_in_time += 1
            else:
                ok_late += 1
        else:
            code = result.error.code.value if result.error is not None else "UNKNOWN"
            codes[code] = codes.get(code, 0) + 1
    return {
        "sent": len(sent),
        "answered": answered,
        "lost": lost,
        "answered_after_window": after_window,
        "unanswered": unanswered,
        "expiry_s": expiry_s,
        "expired_in_broker": expired if expiry_s is not None else None,
        "duplicates": duplicates,
        "exactly_once": lost == 0 and duplicates == 0,
        "ok_in_time": ok_in_time,
        "ok_late": ok_late,
        "codes": dict(sorted(codes.items())),
        "ok_p50_ms": rounded(quantile(ok_ms, 0.5)),
        "ok_p99_ms": rounded(quantile(ok_ms, 0.99)),
        "last_answer_after_load_s": rounded(last - load_end) if last is not None else None,
    }


def rounded(value: float, digits: int = 3) -> float | None:
    return None if math.isnan(value) else round(value, digits)  # no samples: null in the JSON


def final_accounting(
    loads: list[dict[str, Any]], answers: Answers, deadline_ms: float, expiry_s: int | None
) -> dict[str, int]:
    """Requests and probes with no answer at all, per load, after waiting up to FINAL_WAIT_S more for
    them: `lost` counts an answer later than the window too; this tells the two apart. Each load's
    accounting is then redone on every answer received (duplicates that came late included), so its
    `unanswered` and `expired_in_broker` are those after the final wait."""
    sent: dict[str, tuple[list[tuple[str, float]], list[tuple[str, float]], float]] = {
        r["label"]: r.pop("_sent") for r in loads
    }
    ids = {label: [rid for rid, _ in s[0] + s[1]] for label, s in sent.items()}

    def missing() -> dict[str, int]:
        return {label: len(v) - answers.count(v) for label, v in ids.items()}

    limit = time.monotonic() + FINAL_WAIT_S
    while time.monotonic() < limit and any(missing().values()):
        time.sleep(0.2)
    snapshot = answers.snapshot()
    for r in loads:
        requests, probes, load_end = sent[r["label"]]
        r.update(summarize(requests, snapshot, load_end, deadline_ms, expiry_s=expiry_s))
        again = summarize(probes, snapshot, load_end, deadline_ms, math.inf, expiry_s=expiry_s)
        r["probes"] = {k: again[k] for k in PROBE_FIELDS}
    return missing()


def targets(loads: list[dict[str, Any]], rss_limit_mb: float) -> dict[str, bool]:
    out: dict[str, bool] = {}
    for r in loads:
        name = r["label"]
        # with expiry, what the broker may have discarded on the sender's instruction is not lost
        once = "exactly_once" if r.get("expiry_s") is None else "exactly_once_or_expired"
        out[f"{name}_{once}_within_{ANSWER_WINDOW_S:g}s"] = r["exactly_once"]
        fresh = r["fresh_request_ok_after_s"]
        out[f"{name}_fresh_request_ok_within_{RECOVERY_TARGET_S:g}s"] = (
            fresh is not None and fresh <= RECOVERY_TARGET_S
        )
        out[f"{name}_ok_late_at_most_{100 * OK_LATE_SHARE:g}pct"] = r["ok_late"] <= OK_LATE_SHARE * max(
            1, r["sent"]
        )
        for what, names in (("device", ("nucleus", "runtime")), ("broker", ("broker",))):
            peaks = [r["processes"][n]["rss_peak_mb"] for n in names]
            out[f"{name}_{what}_rss_peak_under_{rss_limit_mb:g}mb"] = (
                None not in peaks and max(peaks) <= rss_limit_mb
            )
    return out
