"""moto's S3 server and the simulator's token exchange service, as a device's capture sees them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from edgeinfer.capture.credentials import CredentialChain
from edgeinfer.capture.s3 import S3Client
from edgeinfer.sim.tes import TokenExchangeServer
from tests.helpers.s3 import boto3_client, running_s3, tes_server

BUCKET = "edgeinfer-capture-test"


@pytest.fixture
def moto_s3() -> Iterator[str]:
    """The endpoint URL of a fresh moto S3 server holding an empty BUCKET."""
    with running_s3(BUCKET) as server:
        yield server.endpoint


def all_objects(endpoint: str) -> dict[str, bytes]:
    s3 = boto3_client(endpoint)
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        for obj in page.get("Contents", []):
            out[obj["Key"]] = s3.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"].read()
    return out


@pytest.fixture
def tes() -> Iterator[TokenExchangeServer]:
    with tes_server({"tok": "com.edgeinfer.InferenceRuntime"}) as server:
        yield server


@pytest.fixture
def chain(tes: TokenExchangeServer) -> CredentialChain:
    """The SDKs' chain as a TES dependant's environment sets it up (no static keys)."""
    env = {"AWS_CONTAINER_CREDENTIALS_FULL_URI": tes.uri, "AWS_CONTAINER_AUTHORIZATION_TOKEN": "tok"}
    return CredentialChain(env)


@pytest.fixture
def client(moto_s3: str, chain: CredentialChain) -> S3Client:
    return S3Client(BUCKET, "us-east-1", chain, endpoint=moto_s3, timeout_s=5)
