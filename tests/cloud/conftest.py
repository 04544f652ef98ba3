"""Fixtures for the cloud side's tests (the publish tests' moto and bundle are in aws_fixtures.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from tests.cloud.aws_fixtures import REGION


@pytest.fixture
def gg(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Stubber]]:
    """A greengrassv2 client with its Stubber: every call is answered as the test adds, its
    parameters validated against the service model; none left unanswered at the end."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    client = boto3.client("greengrassv2", region_name=REGION)
    with Stubber(client) as stub:
        yield client, stub
        stub.assert_no_pending_responses()
