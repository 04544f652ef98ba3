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


@dataclass
class _Done:
    record: FieldRecord
    fetched: int = 0
    skipped: int = 0
    bytes: int = 0


def _pull_one(s3: Any, bucket: str, record: StoredRecord, folder: Path, tick: Callable[[int], None]) -> _Done:
    """One record's two files, the image first: a record is whole once its document is."""
    done = _Done(
        FieldRecord(
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
    )
    for (size, etag), ext in ((record.image, ".jpg"), (record.document, ".json")):
        path = folder / f"{record.rel}{ext}"
        if _whole(path, size, etag):
            done.skipped += 1
        else:
            done.bytes += _fetch(s3, bucket, record.key + ext, path, size)
            done.fetched += 1
        tick(size)
    return done


def pull(
    s3: Any,
    query: Query,
    records: list[StoredRecord],
    folder: Path,
    *,
    jobs: int = 8,
    tick: Callable[[int], None] = lambda _n: None,
) -> PullReport:
    """Download `records` into `folder`, `jobs` records at a time (boto3's clients are thread-safe;
    a record is a few small objects, so a pull waits on round trips, not bandwidth). The manifest is
    written also when a download fails, naming the records whole by then; the first failure is
    raised once the downloads under way have ended. `tick` counts bytes (downloaded or found whole)."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    field_set = _open_folder(folder)
    known = {
        r.key: r
        for r in field_set.records
        if (folder / r.image).is_file() and (folder / r.document).is_file()
    }
    report = PullReport()
    pulled_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    pool = ThreadPoolExecutor(max(1, jobs), thread_name_prefix="capture-pull")
    futures = [pool.submit(_pull_one, s3, query.bucket, r, folder, tick) for r in records]
    failure: BaseException | None = None
    try:
        for future in as_completed(futures):
            if future.exception() is not None:
                break  # the first failure stops what has not started
    finally:
        # also on Ctrl-C: nothing new starts, what is under way ends whole, the manifest names it
        pool.shutdown(wait=True, cancel_futures=True)
        for future in futures:
            if future.cancelled():
                continue
            exc = future.exception()
            if exc is not None:
                failure = failure or exc
                continue
            done = future.result()
            known[done.record.key] = done.record
            report.fetched += done.fetched
            report.skipped += done.skipped
            report.bytes += done.bytes
        complete = failure is None and not any(f.cancelled() for f in futures)
        field_set.records = list(known.values())
        field_set.pulls.append(
            {**query.to_dict(), "at": pulled_at, "records": len(records), "complete": complete}
        )
        field_set.save()
    if failure is not None:
        raise failure
    report.records = len(known)
    return report
