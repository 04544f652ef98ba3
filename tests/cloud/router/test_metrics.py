"""The scaling signal: BusyShare and Backlog to CloudWatch, every call checked against the service model."""

from __future__ import annotations

import datetime as dt
from typing import Any

import boto3
from botocore.stub import ANY, Stubber

from edgeinfer.transport import MemoryBus
from edgeinfer_cloud.router.metrics import CloudWatchMetrics
from edgeinfer_cloud.router.router import Router, RouterConfig
from tests.helpers.router import FakeBackend
from tests.helpers.wait import wait_for


def test_load_goes_out_with_the_fleet_dimension_only() -> None:
    client = boto3.client("cloudwatch", region_name="eu-west-1")
    stamp = dt.datetime(2026, 12, 3, tzinfo=dt.timezone.utc)
    metrics = CloudWatchMetrics(
        client, namespace="edgeinfer/test", router="grp", fleet="f1", now=lambda: stamp
    )
    metrics.record_load(0.5, 3)
    metrics.record_load(0.755, 7)  # the newest reading wins
    fleet = [{"Name": "Fleet", "Value": "f1"}]  # what the fleet template scales on
    expected = [
        {
            "MetricName": "BusyShare",
            "Dimensions": fleet,
            "Timestamp": stamp,
            "Value": 75.5,
            "Unit": "Percent",
        },
        {"MetricName": "Backlog", "Dimensions": fleet, "Timestamp": stamp, "Value": 7, "Unit": "Count"},
    ]
    with Stubber(client) as stub:
        stub.add_response("put_metric_data", {}, {"Namespace": "edgeinfer/test", "MetricData": expected})
        assert metrics.flush() == 2
        stub.assert_no_pending_responses()
    assert metrics.flush() == 0  # a reading goes out once


def test_a_router_with_metrics_publishes_its_load_on_the_interval() -> None:
    client = boto3.client("cloudwatch", region_name="eu-west-1")
    metrics = CloudWatchMetrics(client, namespace="edgeinfer/test", router="grp")
    calls: list[dict[str, Any]] = []

    def seen(params: dict[str, Any], **_: Any) -> None:
        calls.append(params)

    client.meta.events.register("provide-client-params.cloudwatch.PutMetricData", seen)
    with Stubber(client) as stub:
        for _ in range(50):  # validated against the model; any number of intervals may pass
            stub.add_response("put_metric_data", {}, {"Namespace": "edgeinfer/test", "MetricData": ANY})
        r = Router(
            MemoryBus(), FakeBackend(), RouterConfig(group="", metrics_interval_s=0.05), metrics=metrics
        )
        r.start()
        try:
            assert wait_for(lambda: len(calls) >= 2)
        finally:
            r.stop()
    load = [d for call in calls for d in call["MetricData"] if d["MetricName"] in ("BusyShare", "Backlog")]
    assert {d["MetricName"] for d in load} == {"BusyShare", "Backlog"}
    assert all(d["Dimensions"] == [{"Name": "Fleet", "Value": "grp"}] for d in load)  # default: the group
