"""Which records a query names: the group's things (every page), the model, version and time range."""

from __future__ import annotations

import datetime as dt

import boto3
import pytest
from botocore.stub import Stubber

from edgeinfer.errors import EdgeinferError
from edgeinfer_cloud.capture.query import Query, group_things, list_records, parse_time, summarize
from tests.cloud.capture.conftest import BUCKET, DAY, PREFIX, REGION, Cloud

UTC = dt.timezone.utc


def test_times_are_dates_or_iso_times_in_utc() -> None:
    assert parse_time("2026-01-05", "--since") == dt.datetime(2026, 1, 5, tzinfo=UTC)
    assert parse_time("2026-01-05", "--until", end=True) == dt.datetime(2026, 1, 6, tzinfo=UTC)
    assert parse_time("2026-01-05T14:30Z", "--since") == dt.datetime(2026, 1, 5, 14, 30, tzinfo=UTC)
    assert parse_time("2026-01-05T14:30", "--since") == dt.datetime(2026, 1, 5, 14, 30, tzinfo=UTC)
    plus2 = parse_time("2026-01-05T14:30+02:00", "--since")
    assert plus2 == dt.datetime(2026, 1, 5, 12, 30, tzinfo=UTC)
    with pytest.raises(EdgeinferError, match=r"^--since: not a date or an ISO time: 'yesterday'"):
        parse_time("yesterday", "--since")
    with pytest.raises(EdgeinferError, match="is not before --until"):
        Query(BUCKET, PREFIX, (), "m", since=plus2, until=plus2).check()


def test_a_groups_things_come_from_every_page() -> None:
    iot = boto3.client("iot", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(iot) as stub:
        stub.add_response(
            "list_things_in_thing_group",
            {"things": ["cam-b", "cam-a"], "nextToken": "t1"},
            {"thingGroupName": "cams", "recursive": True},
        )
        stub.add_response(
            "list_things_in_thing_group",
            {"things": ["cam-c"]},
            {"thingGroupName": "cams", "recursive": True, "nextToken": "t1"},
        )
        assert group_things(iot, "cams", recursive=True) == ["cam-a", "cam-b", "cam-c"]
        stub.add_response(
            "list_things_in_thing_group", {"things": []}, {"thingGroupName": "empty", "recursive": False}
        )
        with pytest.raises(EdgeinferError, match="thing group 'empty' has no things"):
            group_things(iot, "empty")


def test_records_by_thing_model_version_and_time(cloud: Cloud) -> None:
    hour = 3600.0
    a1 = cloud.capture("cam-a", "lite0", "1.0.0", DAY + hour, seed=1)
    a2 = cloud.capture("cam-a", "lite0", "1.1.0", DAY + 30 * hour, seed=2)
    b1 = cloud.capture("cam-b", "lite0", "1.0.0", DAY + 2 * hour, seed=3)
    cloud.capture("cam-b", "yolo", "1.0.0", DAY + hour, seed=4)  # another model
    cloud.capture("cam-z", "lite0", "1.0.0", DAY + hour, seed=5)  # a thing not asked for
    s3 = cloud.client("s3")
    everything = Query(BUCKET, PREFIX, ("cam-a", "cam-b"), "lite0")
    records, orphans = list_records(s3, everything)
    assert [r.key for r in records] == [a1.key, b1.key, a2.key]  # oldest first
    assert orphans == 0
    assert records[0].image[0] == len(a1.image)
    assert records[0].document[0] == len(a1.document())
    assert records[0].captured_at == "2026-01-01T01:00:00.000Z"
    v1 = Query(BUCKET, PREFIX, ("cam-a", "cam-b"), "lite0", version="1.0.0")
    assert [r.key for r in list_records(s3, v1)[0]] == [a1.key, b1.key]
    day1 = Query(
        BUCKET,
        PREFIX,
        ("cam-a", "cam-b"),
        "lite0",
        since=parse_time("2026-01-01T01:30Z", "--since"),
        until=parse_time("2026-01-01", "--until", end=True),
    )
    assert [r.key for r in list_records(s3, day1)[0]] == [b1.key]
    lines = summarize(records)
    assert [(x.thing, x.version, x.records) for x in lines] == [
        ("cam-a", "1.0.0", 1),
        ("cam-a", "1.1.0", 1),
        ("cam-b", "1.0.0", 1),
    ]
    assert sum(x.bytes for x in lines) == sum(r.bytes for r in records)


def test_a_document_without_its_image_is_left_out_and_counted(cloud: Cloud) -> None:
    whole = cloud.capture("cam-a", "lite0", "1.0.0", DAY, seed=1)
    half = cloud.capture("cam-a", "lite0", "1.0.0", DAY + 1, seed=2)
    s3 = cloud.client("s3")
    s3.delete_object(Bucket=BUCKET, Key=f"{half.key}.jpg")
    s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/cam-a/lite0/1.0.0/notes.json", Body=b"{}")  # not a record
    records, orphans = list_records(s3, Query(BUCKET, PREFIX, ("cam-a",), "lite0"))
    assert [r.key for r in records] == [whole.key]
    assert orphans == 1


def test_the_listing_reads_only_the_days_asked_for_and_the_edges_are_exact(cloud: Cloud) -> None:
    from edgeinfer_cloud.capture.query import _objects

    day = 86400.0
    made = [cloud.capture("cam-a", "lite0", "1.0.0", DAY + d * day, seed=d) for d in range(5)]
    at_until = cloud.capture("cam-a", "lite0", "1.0.0", DAY + 3 * day - 0.001, seed=9)  # 23:59:59.999
    query = Query(
        BUCKET,
        PREFIX,
        ("cam-a",),
        "lite0",
        since=parse_time("2026-01-02", "--since"),
        until=parse_time("2026-01-03", "--until", end=True),
    )
    records, _ = list_records(cloud.client("s3"), query)
    assert [r.key for r in records] == [made[1].key, made[2].key, at_until.key]
    listed = _objects(cloud.client("s3"), query, f"{PREFIX}/cam-a/lite0/1.0.0/")
    assert {k.rsplit(".", 1)[0] for k in listed} == {made[1].key, made[2].key, at_until.key}
    exclusive = Query(BUCKET, PREFIX, ("cam-a",), "lite0", until=parse_time("2026-01-02T00:00Z", "--until"))
    assert [r.key for r in list_records(cloud.client("s3"), exclusive)[0]] == [made[0].key]


def test_a_key_that_would_climb_out_of_the_pulled_folder_is_not_a_record(cloud: Cloud) -> None:
    whole = cloud.capture("cam-a", "lite0", "1.0.0", DAY, seed=1)
    s3 = cloud.client("s3")
    for version in ("..", "."):
        # a bucket anyone else may write to: `..` as the version would put the record above the folder
        climbing = whole.key.replace("/lite0/1.0.0/", f"/lite0/{version}/")
        for ext in (".json", ".jpg"):
            s3.put_object(Bucket=BUCKET, Key=climbing + ext, Body=b"{}")
    records, orphans = list_records(s3, Query(BUCKET, PREFIX, ("cam-a",), "lite0"))
    assert [r.key for r in records] == [whole.key]
    assert orphans == 0
