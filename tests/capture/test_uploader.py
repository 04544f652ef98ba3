"""The uploader against moto's S3 server, with the token exchange service's credentials: an outage,
a crash mid-upload, pacing — every record arrives once."""

from __future__ import annotations

import http.client
import json
import threading
from pathlib import Path

import pytest

from edgeinfer.capture.credentials import CredentialChain
from edgeinfer.capture.record import Record, make_id
from edgeinfer.capture.s3 import S3Client, S3Error
from edgeinfer.capture.spool import Spool
from edgeinfer.capture.uploader import Uploader
from tests.capture.conftest import BUCKET, all_objects
from tests.helpers.wait import wait_for


def _fill(spool: Spool, n: int) -> list[str]:
    keys = []
    for i in range(n):
        rid = make_id(1_700_000_000.0 + i, f"req{i}")
        rec = Record(rid, f"cap/thing/m/1/2023/11/14/{rid}", b"\xff\xd8\xff" + bytes([i]) * 100, {"id": rid})
        spool.put(rec)
        keys += [rec.key + ".jpg", rec.key + ".json"]
    return keys


def test_an_outage_then_everything_arrives_once(tmp_path: Path, moto_s3: str, chain: CredentialChain) -> None:
    spool = Spool(tmp_path / "spool", max_bytes=10**7, max_age_s=10**9)
    keys = _fill(spool, 5)
    down = Uploader(
        spool, S3Client(BUCKET, "us-east-1", chain, endpoint="http://127.0.0.1:9"), bytes_per_s=10**7
    )
    with pytest.raises(S3Error):
        down.drain()
    assert len(spool) == 5  # kept through the outage
    up = Uploader(spool, S3Client(BUCKET, "us-east-1", chain, endpoint=moto_s3), bytes_per_s=10**7)
    assert up.drain() == 5
    objects = all_objects(moto_s3)
    assert sorted(objects) == sorted(keys)
    assert len(spool) == 0
    assert up.uploaded == 5
    doc = json.loads(objects[keys[1]])
    assert doc["key"] == keys[1].removesuffix(".json")


class _CrashAfter(S3Client):
    """Dies (as a killed process would, for the spool) after `n` successful PUTs."""

    def __init__(self, n: int, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.left = n

    def put(self, key: str, body: bytes, content_type: str) -> None:
        if self.left == 0:
            raise SystemExit("killed")
        super().put(key, body, content_type)
        self.left -= 1


def test_killed_mid_upload_and_restarted_nothing_lost_or_duplicated(
    tmp_path: Path, moto_s3: str, chain: CredentialChain
) -> None:
    folder = tmp_path / "spool"
    keys = _fill(Spool(folder, max_bytes=10**7, max_age_s=10**9), 4)
    crashing = _CrashAfter(3, BUCKET, "us-east-1", chain, endpoint=moto_s3)  # 1 record and a half
    with pytest.raises(SystemExit):
        Uploader(Spool(folder, max_bytes=10**7, max_age_s=10**9), crashing, bytes_per_s=10**7).drain()
    restarted = Spool(folder, max_bytes=10**7, max_age_s=10**9)  # a new process reads the spool
    assert len(restarted) == 3
    client = S3Client(BUCKET, "us-east-1", chain, endpoint=moto_s3)
    assert Uploader(restarted, client, bytes_per_s=10**7).drain() == 3
    assert sorted(all_objects(moto_s3)) == sorted(keys)  # the half-sent record's keys written again


class _BrokenOnce(S3Client):
    """The first PUT's response is cut short: an HTTPException, which is not an OSError nor an S3Error."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.broken = False

    def put(self, key: str, body: bytes, content_type: str) -> None:
        if not self.broken:
            self.broken = True
            raise http.client.IncompleteRead(b"")
        super().put(key, body, content_type)


def test_an_unexpected_error_backs_off_and_the_thread_goes_on(
    tmp_path: Path, moto_s3: str, chain: CredentialChain
) -> None:
    spool = Spool(tmp_path / "spool", max_bytes=10**7, max_age_s=10**9)
    keys = _fill(spool, 1)
    client = _BrokenOnce(BUCKET, "us-east-1", chain, endpoint=moto_s3)
    uploader = Uploader(spool, client, bytes_per_s=10**7, idle_s=0.01, max_backoff_s=0.01).start()
    try:
        assert wait_for(lambda: uploader.uploaded == 1)
    finally:
        uploader.stop()
    assert uploader.failures == 1
    assert "IncompleteRead" in uploader.last_error
    assert sorted(all_objects(moto_s3)) == sorted(keys)
    assert len(spool) == 0


def test_stop_ends_a_long_pacing_wait_and_the_record_stays_spooled(
    tmp_path: Path, client: S3Client, moto_s3: str
) -> None:
    spool = Spool(tmp_path / "spool", max_bytes=10**7, max_age_s=10**9)
    _fill(spool, 3)
    # one byte a second: the first record passes on the full bucket and leaves a debt of minutes
    uploader = Uploader(spool, client, bytes_per_s=1, idle_s=0.01).start()
    assert wait_for(lambda: any(k.endswith(".jpg") for k in all_objects(moto_s3)))
    stopping = threading.Thread(target=uploader.stop, kwargs={"timeout": 600}, daemon=True)
    stopping.start()
    stopping.join(60)  # a bound far under the debt, not a measurement
    assert not stopping.is_alive()
    assert uploader.uploaded == 0
    assert len(spool) == 3  # nothing left the spool unsent


def test_uploads_drops_and_failures_are_counted_once_each(tmp_path: Path, chain: CredentialChain) -> None:
    spool = Spool(tmp_path / "spool", max_bytes=250, max_age_s=10**9)
    _fill(spool, 3)  # 103-byte images and small documents: only the newest fits
    assert spool.counts["dropped_size"] == 2
    down = Uploader(
        spool,
        S3Client(BUCKET, "us-east-1", chain, endpoint="http://127.0.0.1:9"),
        bytes_per_s=10**7,
        idle_s=0.01,
        max_backoff_s=0.01,
    ).start()
    try:
        assert wait_for(lambda: spool.counts["upload_failures"] >= 2)
    finally:
        down.stop()
    assert spool.counts["uploaded"] == 0
    assert len(spool) == 1


def test_records_age_out_during_an_outage_and_are_counted(tmp_path: Path, chain: CredentialChain) -> None:
    now = [1_700_000_000.0]
    spool = Spool(tmp_path / "spool", max_bytes=10**7, max_age_s=3600, wall=lambda: now[0])
    _fill(spool, 3)  # captured at 1_700_000_000 + i
    down = S3Client(BUCKET, "us-east-1", chain, endpoint="http://127.0.0.1:9")
    uploader = Uploader(spool, down, bytes_per_s=10**7)
    with pytest.raises(S3Error):
        uploader.drain()  # within the age cap: kept, and tried
    assert len(spool) == 3
    now[0] += 3600 + 1.5  # no record is added meanwhile: the next pass applies the cap itself
    with pytest.raises(S3Error):
        uploader.drain()  # two aged out, the third still tried
    assert len(spool) == 1
    assert spool.counts["dropped_age"] == 2
    now[0] += 10
    assert uploader.drain() == 0  # all aged out: nothing left to try
    assert spool.counts["dropped_age"] == 3
    assert Spool(tmp_path / "spool", max_bytes=10**7, max_age_s=3600).dropped["age"] == 3  # kept on disk
