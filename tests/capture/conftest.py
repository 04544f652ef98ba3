"""moto's S3 server and the simulator's token exchange service, as a device's capture sees them."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from edgeinfer.capture.credentials import CredentialChain
from edgeinfer.capture.s3 import S3Client
from edgeinfer.sim.tes import TokenExchangeServer

BUCKET = "edgeinfer-capture-test"


@pytest.fixture
def moto_s3() -> Iterator[str]:
    """The endpoint URL of a fresh moto S3 server holding an empty BUCKET."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    # moto's backends live in the process, across servers: start each test from an empty store
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=10)
    s3 = boto3_client(endpoint)
    s3.create_bucket(Bucket=BUCKET)
    try:
        yield endpoint
    finally:
        server.stop()


def boto3_client(endpoint: str) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def all_objects(endpoint: str) -> dict[str, bytes]:
    s3 = boto3_client(endpoint)
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        for obj in page.get("Contents", []):
            out[obj["Key"]] = s3.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"].read()
    return out


@pytest.fixture
def tes() -> Iterator[TokenExchangeServer]:
    server = TokenExchangeServer({"tok": "com.edgeinfer.InferenceRuntime"}.get).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def chain(tes: TokenExchangeServer) -> CredentialChain:
    """The SDKs' chain as a TES dependant's environment sets it up (no static keys)."""
    env = {"AWS_CONTAINER_CREDENTIALS_FULL_URI": tes.uri, "AWS_CONTAINER_AUTHORIZATION_TOKEN": "tok"}
    return CredentialChain(env)


@pytest.fixture
def client(moto_s3: str, chain: CredentialChain) -> S3Client:
    return S3Client(BUCKET, "us-east-1", chain, endpoint=moto_s3, timeout_s=5)
