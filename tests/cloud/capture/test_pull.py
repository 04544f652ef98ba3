"""A pull: every record's files under their keys, the manifest, a second pull that skips what is whole."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from edgeinfer.errors import EdgeinferError
from edgeinfer.model.field import FIELD_MANIFEST, FieldSet
from edgeinfer_cloud.capture.pull import pull
from edgeinfer_cloud.capture.query import Query, list_records
from tests.cloud.capture.conftest import BUCKET, DAY, PREFIX, Cloud

QUERY = Query(BUCKET, PREFIX, ("cam-a", "cam-b"), "lite0", group="cams")


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_a_pull_writes_each_record_and_the_manifest_and_resumes(cloud: Cloud, tmp_path: Path) -> None:
    made = [cloud.capture(t, "lite0", "1.0.0", DAY + i, seed=i) for i, t in enumerate(["cam-a", "cam-b"] * 2)]
    s3 = cloud.client("s3")
    records, _ = list_records(s3, QUERY)
    out = tmp_path / "field"
    ticks: list[int] = []
    report = pull(s3, QUERY, records, out, tick=ticks.append)
    assert (report.records, report.fetched, report.skipped) == (4, 8, 0)
    assert report.bytes == sum(len(r.image) + len(r.document()) for r in made) == sum(ticks)
    below_prefix = [r.key.removeprefix(f"{PREFIX}/") for r in made]
    assert _files(out) == sorted([FIELD_MANIFEST] + [k + e for k in below_prefix for e in (".jpg", ".json")])
    for r, rel in zip(made, below_prefix, strict=True):
        assert (out / f"{rel}.jpg").read_bytes() == r.image
        assert json.loads((out / f"{rel}.json").read_bytes()) == r.doc
    field_set = FieldSet.load(out)
    assert field_set is not None
    assert sorted(x.key for x in field_set.records) == sorted(r.key for r in made)
    assert field_set.summary()["things"] == ["cam-a", "cam-b"]
    assert field_set.summary()["models"] == ["lite0 1.0.0"]
    assert field_set.pulls[0]["group"] == "cams"
    assert field_set.pulls[0]["complete"] is True

    # a second pull skips what is there whole; a torn file is fetched again, and a new record added
    (out / f"{below_prefix[0]}.jpg").write_bytes(made[0].image[:10])
    newer = cloud.capture("cam-a", "lite0", "1.0.0", DAY + 10, seed=10)
    records, _ = list_records(s3, QUERY)
    again = pull(s3, QUERY, records, out)
    assert (again.records, again.fetched, again.skipped) == (5, 3, 7)
    assert (out / f"{below_prefix[0]}.jpg").read_bytes() == made[0].image
    reloaded = FieldSet.load(out)
    assert reloaded is not None
    assert len(reloaded.records) == 5
    assert len(reloaded.pulls) == 2
    assert newer.key in {x.key for x in reloaded.records}


def test_a_file_of_the_same_size_but_other_bytes_is_fetched_again(cloud: Cloud, tmp_path: Path) -> None:
    made = cloud.capture("cam-a", "lite0", "1.0.0", DAY, seed=1)
    s3 = cloud.client("s3")
    records, _ = list_records(s3, QUERY)
    out = tmp_path / "field"
    pull(s3, QUERY, records, out)
    image = out / f"{made.key.removeprefix(PREFIX + '/')}.jpg"
    image.write_bytes(b"\0" * len(made.image))
    assert pull(s3, QUERY, records, out).fetched == 1
    assert image.read_bytes() == made.image


class _Failing:
    """S3 that stops answering after `left` downloads, as a network does mid-pull."""

    def __init__(self, s3: Any, left: int) -> None:
        self.s3, self.left = s3, left

    def get_object(self, **kw: Any) -> Any:
        if self.left == 0:
            raise ConnectionError("the network went away")
        self.left -= 1
        return self.s3.get_object(**kw)


def test_a_failed_pull_leaves_whole_files_only_and_a_manifest_of_them(cloud: Cloud, tmp_path: Path) -> None:
    for i in range(3):
        cloud.capture("cam-a", "lite0", "1.0.0", DAY + i, seed=i)
    s3 = cloud.client("s3")
    records, _ = list_records(s3, QUERY)
    out = tmp_path / "field"
    with pytest.raises(ConnectionError):
        pull(_Failing(s3, 3), QUERY, records, out, jobs=1)  # the second record's document never comes
    field_set = FieldSet.load(out)
    assert field_set is not None
    assert [r.key for r in field_set.records] == [records[0].key]
    assert field_set.pulls[-1]["complete"] is False
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    documents = [p for p in out.rglob("*.json") if p.name != FIELD_MANIFEST]
    assert len(list(out.rglob("*.jpg"))) == 2
    assert len(documents) == 1
    report = pull(s3, QUERY, records, out)
    assert (report.records, report.fetched, report.skipped) == (3, 3, 3)


def test_a_folder_with_other_files_is_refused(cloud: Cloud, tmp_path: Path) -> None:
    cloud.capture("cam-a", "lite0", "1.0.0", DAY)
    s3 = cloud.client("s3")
    records, _ = list_records(s3, QUERY)
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "mine.jpg").write_bytes(b"x")
    with pytest.raises(EdgeinferError, match="is not empty and holds no capture manifest"):
        pull(s3, QUERY, records, tmp_path / "photos")
    (tmp_path / "file").write_text("x")
    with pytest.raises(EdgeinferError, match="is a file, not a folder"):
        pull(s3, QUERY, records, tmp_path / "file")


class _FailingTogether(_Failing):
    """`_Failing` for several threads at once."""

    def __init__(self, s3: Any, left: int) -> None:
        import threading

        super().__init__(s3, left)
        self.lock = threading.Lock()

    def get_object(self, **kw: Any) -> Any:
        with self.lock:
            if self.left == 0:
                raise ConnectionError("the network went away")
            self.left -= 1
        return self.s3.get_object(**kw)


def test_a_parallel_pull_that_fails_names_only_whole_records(cloud: Cloud, tmp_path: Path) -> None:
    made = {r.key: r for r in (cloud.capture("cam-a", "lite0", "1.0.0", DAY + i, seed=i) for i in range(12))}
    s3 = cloud.client("s3")
    records, _ = list_records(s3, QUERY)
    out = tmp_path / "field"
    with pytest.raises(ConnectionError):
        pull(_FailingTogether(s3, 9), QUERY, records, out, jobs=4)
    field_set = FieldSet.load(out)
    assert field_set is not None
    assert field_set.pulls[-1]["complete"] is False
    assert 1 <= len(field_set.records) <= 4
    for r in field_set.records:
        assert (out / r.image).read_bytes() == made[r.key].image
        assert json.loads((out / r.document).read_bytes()) == made[r.key].doc
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    report = pull(s3, QUERY, records, out, jobs=4)
    assert report.records == 12
    assert report.fetched + report.skipped == 24
    assert report.skipped >= 2 * len(field_set.records)
