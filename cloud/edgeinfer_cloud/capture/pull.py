"""Bring records home: each object into the folder under its key below the capture prefix, through a
temporary file and a rename (`edgeinfer.files.atomic_write`), and the folder's manifest
(`edgeinfer.model.field`) listing every complete record. A second pull skips each file already there
whole (its size, and its MD5 where the ETag is one) and adds what is new."""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeinfer.errors import EdgeinferError
from edgeinfer.files import atomic_write
from edgeinfer.model.field import FieldRecord, FieldSet
from edgeinfer_cloud.capture.query import Query, StoredRecord

__all__ = ["PullReport", "pull"]


@dataclass
class PullReport:
    records: int = 0  # whole on disk after the pull
    fetched: int = 0  # files downloaded
    skipped: int = 0  # files already there whole
    bytes: int = 0  # downloaded


def _whole(path: Path, size: int, etag: str) -> bool:
    """`path` holds the object: its size, and its MD5 where the ETag is a single part's MD5."""
    try:
        if path.stat().st_size != size:
            return False
    except OSError:
        return False
    digest = etag.strip('"')
    if len(digest) != 32 or "-" in digest:  # a multipart ETag is not the content's MD5
        return True
    return hashlib.md5(path.read_bytes(), usedforsecurity=False).hexdigest() == digest


def _fetch(s3: Any, bucket: str, key: str, path: Path, size: int) -> int:
    body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    if len(body) != size:
        raise EdgeinferError(
            f"s3://{bucket}/{key} changed while it was pulled ({len(body)} bytes, not {size})"
        )
    try:
        atomic_write(path, body)
    except OSError as exc:
        raise EdgeinferError(f"cannot write {path}: {exc.strerror or exc}") from None
    return len(body)


def _open_folder(folder: Path) -> FieldSet:
    if folder.exists() and not folder.is_dir():
        raise EdgeinferError(f"{folder} is a file, not a folder")
    existing = FieldSet.load(folder)
    if existing is not None:
        return existing
    if folder.is_dir() and any(folder.iterdir()):
        raise EdgeinferError(f"{folder} is not empty and holds no capture manifest: pull into a new folder")
    field_set = FieldSet(folder)
    try:
        field_set.save()  # the folder is a capture folder from its first file on: a killed pull resumes
    except OSError as exc:
        raise EdgeinferError(f"cannot write {folder}: {exc.strerror or exc}") from None
    return field_set


def pull(
    s3: Any,
    query: Query,
    records: list[StoredRecord],
    folder: Path,
    *,
    tick: Callable[[int], None] = lambda _n: None,
) -> PullReport:
    """Download `records` into `folder`; the manifest is written also when a download fails, naming
    the records whole by then. `tick` counts bytes (downloaded or found whole)."""
    field_set = _open_folder(folder)
    known = {r.key: r for r in field_set.records if (folder / r.image).is_file()}
    report = PullReport()
    pulled_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    finished = False
    try:
        for record in records:
            for (size, etag), ext in ((record.image, ".jpg"), (record.document, ".json")):
                path = folder / f"{record.rel}{ext}"
                if _whole(path, size, etag):
                    report.skipped += 1
                else:
                    report.bytes += _fetch(s3, query.bucket, record.key + ext, path, size)
                    report.fetched += 1
                tick(size)
            known[record.key] = FieldRecord(
                id=record.id,
                key=record.key,
                thing=record.thing,
                model=record.model,
                version=record.version,
                captured_at=record.captured_at,
                image=f"{record.rel}.jpg",
                document=f"{record.rel}.json",
                bytes=record.bytes,
            )
        finished = True
    finally:
        field_set.records = list(known.values())
        field_set.pulls.append(
            {**query.to_dict(), "at": pulled_at, "records": len(records), "complete": finished}
        )
        field_set.save()
    report.records = len(known)
    return report
