"""The spool: atomic records that survive a restart, caps that drop the oldest and count them."""

from __future__ import annotations

from pathlib import Path

from edgeinfer.capture.record import Record, make_id
from edgeinfer.capture.spool import Spool


def _record(wall: float, size: int = 1000, rid: str = "req") -> Record:
    record_id = make_id(wall, rid)
    return Record(
        record_id, f"p/thing/m/1/{record_id}", b"\xff\xd8\xff" + b"x" * (size - 3), {"id": record_id}
    )


def test_records_survive_a_restart_in_age_order(tmp_path: Path) -> None:
    now = [1_700_000_000.0]
    spool = Spool(tmp_path, max_bytes=10**6, max_age_s=3600, wall=lambda: now[0])
    ids = []
    for i in range(3):
        rec = _record(now[0] + i)
        ids.append(rec.id)
        spool.put(rec)
    again = Spool(tmp_path, max_bytes=10**6, max_age_s=3600, wall=lambda: now[0])
    assert [p.id for p in again.pending()] == ids
    assert [p.key for p in again.pending()] == [f"p/thing/m/1/{i}" for i in ids]
    again.remove(ids[0])
    assert [p.id for p in Spool(tmp_path, max_bytes=10**6, max_age_s=3600).pending()] == ids[1:]


def test_a_half_written_record_is_removed_at_start(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=10**6, max_age_s=10**9)
    rec = _record(1_700_000_000.0)
    spool.put(rec)
    (tmp_path / "1700000000001-orphan-00.jpg").write_bytes(b"jpeg")  # crashed before its document
    (tmp_path / ".1700000000002-x.json.abc.tmp").write_bytes(b"{")  # crashed inside atomic_write
    again = Spool(tmp_path, max_bytes=10**6, max_age_s=10**9)
    assert [p.id for p in again.pending()] == [rec.id]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"{rec.id}.jpg", f"{rec.id}.json"])


def test_the_size_cap_drops_the_oldest_and_counts_them_across_restarts(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=5500, max_age_s=10**9)
    recs = [_record(1_700_000_000.0 + i) for i in range(8)]
    for rec in recs:
        spool.put(rec)
    kept = [p.id for p in spool.pending()]
    assert kept == [r.id for r in recs[-len(kept) :]]  # the newest kept, in order
    assert spool.bytes <= 5500
    assert spool.dropped["size"] == 8 - len(kept) > 0
    assert Spool(tmp_path, max_bytes=5500, max_age_s=10**9).dropped["size"] == spool.dropped["size"]


def test_the_age_cap_drops_what_waited_too_long(tmp_path: Path) -> None:
    now = [1_700_000_000.0]
    spool = Spool(tmp_path, max_bytes=10**6, max_age_s=60, wall=lambda: now[0])
    old = _record(now[0] - 120)
    new = _record(now[0])
    spool.put(old)
    spool.put(new)
    assert [p.id for p in spool.pending()] == [new.id]
    assert spool.dropped == {"size": 0, "age": 1}


def test_a_record_whose_document_does_not_parse_is_dropped_at_start(tmp_path: Path) -> None:
    now = 1_700_000_000.0
    spool = Spool(tmp_path, max_bytes=10**6, max_age_s=3600, wall=lambda: now)
    good, empty, torn = _record(now), _record(now + 1, rid="empty"), _record(now + 2, rid="torn")
    for rec in (good, empty, torn):
        spool.put(rec)
    (tmp_path / f"{empty.id}.json").write_bytes(b"")  # renamed, but its content never reached the disk
    (tmp_path / f"{torn.id}.json").write_bytes(b'{"key":')
    again = Spool(tmp_path, max_bytes=10**6, max_age_s=3600, wall=lambda: now)
    assert [p.id for p in again.pending()] == [good.id]
    assert again.unreadable == 2
    assert len(again) == 1
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "state.json") == sorted(
        [f"{good.id}.jpg", f"{good.id}.json"]
    )
