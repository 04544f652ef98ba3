"""Which captured records a query names: a thing group's things (IoT), a model and version, a time
range; and the records under their keys in S3 (`edgeinfer.capture.record.object_key`'s layout)."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from edgeinfer.capture.record import object_key
from edgeinfer.errors import EdgeinferError

__all__ = ["Query", "StoredRecord", "group_things", "list_records", "parse_time", "summarize"]

_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_ID = re.compile(r"^(\d{13})-")
# a record's key below the capture prefix: thing, model, version, yyyy, mm, dd, <id>.<ext>
_KEY_PARTS = 7


def parse_time(text: str, option: str, *, end: bool = False) -> dt.datetime:
    """A date (`2026-01-05`: its midnight, UTC; with `end`, the next midnight, so the day is in) or an
    ISO 8601 time (UTC unless it says otherwise)."""
    try:
        if _DAY.match(text):
            day = dt.datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=dt.timezone.utc)
            return day + dt.timedelta(days=1) if end else day
        moment = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise EdgeinferError(
            f"{option}: not a date or an ISO time: {text!r} (e.g. 2026-01-05 or 2026-01-05T14:30Z)"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.timezone.utc)


@dataclass(frozen=True)
class Query:
    bucket: str
    prefix: str
    things: tuple[str, ...]
    model: str
    version: str | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None  # exclusive
    group: str | None = None

    def check(self) -> None:
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise EdgeinferError(f"--since {_iso(self.since)} is not before --until {_iso(self.until)}")
        if not self.model.strip():
            raise EdgeinferError("--model must name a model")

    def admits(self, wall: float) -> bool:
        moment = dt.datetime.fromtimestamp(wall, dt.timezone.utc)
        return (self.since is None or moment >= self.since) and (self.until is None or moment < self.until)

    def to_dict(self) -> dict[str, Any]:
        return {
            "bucket": self.bucket,
            "prefix": self.prefix,
            "group": self.group,
            "things": list(self.things),
            "model": self.model,
            "version": self.version,
            "since": _iso(self.since) if self.since else None,
            "until": _iso(self.until) if self.until else None,
        }


def _iso(moment: dt.datetime) -> str:
    return moment.astimezone(dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class StoredRecord:
    """A whole record in S3: its `.json` (uploaded last) and its `.jpg`."""

    key: str  # without the extension
    rel: str  # the key below the capture prefix: where the record lands in a pulled folder
    thing: str
    model: str
    version: str
    id: str
    wall: float
    image: tuple[int, str]  # size, ETag
    document: tuple[int, str]

    @property
    def bytes(self) -> int:
        return self.image[0] + self.document[0]

    @property
    def captured_at(self) -> str:
        return _iso(dt.datetime.fromtimestamp(self.wall, dt.timezone.utc))


def group_things(iot: Any, group: str, *, recursive: bool = False) -> list[str]:
    """Every thing in the group (each page of ListThingsInThingGroup), sorted."""
    things: set[str] = set()
    pages = iot.get_paginator("list_things_in_thing_group").paginate(
        thingGroupName=group, recursive=recursive
    )
    for page in pages:
        things.update(page.get("things", []))
    if not things:
        raise EdgeinferError(f"thing group {group!r} has no things")
    return sorted(things)


def _listing_prefix(query: Query, thing: str) -> str:
    """Where a thing's records of the model (and version) are: `object_key`'s own path, cut before the
    version (or before the date) so the capture's naming of things and models is not written twice."""
    key = object_key(
        query.prefix, thing, model=query.model, version=query.version or "_", wall=0.0, record_id="_"
    )
    parts = key.split("/")
    return "/".join(parts[: len(parts) - (4 if query.version else 5)]) + "/"


def _base(prefix: str) -> str:
    return f"{prefix.strip('/')}/" if prefix.strip("/") else ""


def _version_prefixes(s3: Any, query: Query, thing: str) -> list[str]:
    """The folders of the thing's model versions the query names (S3's common prefixes at `/`)."""
    prefix = _listing_prefix(query, thing)
    if query.version:
        return [prefix]
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=query.bucket, Prefix=prefix, Delimiter="/")
    return [p["Prefix"] for page in pages for p in page.get("CommonPrefixes", [])]


def _objects(s3: Any, query: Query, prefix: str) -> dict[str, tuple[int, str]]:
    """Size and ETag of each object of one version's folder in the query's days. Its keys go by day
    (`yyyy/mm/dd/`), so the listing starts at --since's day and stops after --until's."""
    kwargs: dict[str, Any] = {"Bucket": query.bucket, "Prefix": prefix}
    if query.since is not None:
        kwargs["StartAfter"] = prefix + query.since.astimezone(dt.timezone.utc).strftime("%Y/%m/%d/")
    last_day = None
    if query.until is not None:
        last = query.until.astimezone(dt.timezone.utc) - dt.timedelta(microseconds=1)
        last_day = last.strftime("%Y/%m/%d")
    found: dict[str, tuple[int, str]] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(**kwargs):
        for obj in page.get("Contents", []):
            key = obj["Key"]
            if last_day is not None and key[len(prefix) : len(prefix) + len(last_day)] > last_day:
                return found
            found[key] = (int(obj["Size"]), str(obj.get("ETag", "")))
    return found


def list_records(s3: Any, query: Query) -> tuple[list[StoredRecord], int]:
    """The whole records the query names, oldest first, and how many `.json`s had no `.jpg`."""
    base = _base(query.prefix)
    records: list[StoredRecord] = []
    orphans = 0
    for thing in query.things:
        for prefix in _version_prefixes(s3, query, thing):
            objects = _objects(s3, query, prefix)
            for key, document in objects.items():
                record = _record(key, base, document, objects.get(key[: -len(".json")] + ".jpg"), query)
                if record is None:
                    continue
                if record.image[0] < 0:
                    orphans += 1
                    continue
                records.append(record)
    records.sort(key=lambda r: (r.wall, r.key))
    return records, orphans


def _record(
    key: str, base: str, document: tuple[int, str], image: tuple[int, str] | None, query: Query
) -> StoredRecord | None:
    """The record whose `.json` is `key`, when it is one in the query's range (image size -1: no
    `.jpg`)."""
    if not key.endswith(".json") or not key.startswith(base):
        return None
    rel = key[len(base) : -len(".json")]
    parts = rel.split("/")
    match = _ID.match(parts[-1])
    if len(parts) != _KEY_PARTS or match is None or any(part in ("", ".", "..") for part in parts):
        return None  # not a key a device writes; `..` would also land above the pulled folder
    wall = int(match.group(1)) / 1000
    if not query.admits(wall):
        return None
    return StoredRecord(
        key=key[: -len(".json")],
        rel=rel,
        thing=parts[0],
        model=parts[1],
        version=parts[2],
        id=parts[-1],
        wall=wall,
        image=image if image is not None else (-1, ""),
        document=document,
    )


@dataclass
class Line:
    thing: str
    model: str
    version: str
    records: int = 0
    bytes: int = 0
    first: str = ""
    last: str = ""


def summarize(records: Iterable[StoredRecord]) -> list[Line]:
    """Per thing, model and version: the count, the bytes, the first and last capture."""
    lines: dict[tuple[str, str, str], Line] = {}
    for r in records:
        line = lines.setdefault((r.thing, r.model, r.version), Line(r.thing, r.model, r.version))
        line.records += 1
        line.bytes += r.bytes
        line.first = min(line.first or r.captured_at, r.captured_at)
        line.last = max(line.last, r.captured_at)
    return [lines[k] for k in sorted(lines)]
