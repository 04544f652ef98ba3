"""SigV4 as botocore signs it; PutObject on a real S3 API (moto's server) with the TES's credentials."""

from __future__ import annotations

import datetime as dt
import hashlib
from unittest import mock

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from edgeinfer.capture.credentials import AwsCredentials, CredentialChain, CredentialsError
from edgeinfer.capture.s3 import S3Client, S3Error, sign
from edgeinfer.sim.tes import TokenExchangeServer
from tests.capture.conftest import BUCKET, all_objects


@pytest.mark.parametrize("token", [None, "session-token"])
def test_the_signature_is_botocores(token: str | None) -> None:
    when = dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=dt.timezone.utc)
    body = b"hello capture"
    digest = hashlib.sha256(body).hexdigest()
    path = "/bucket/p/thing/model%20x/1.0/2024/05/06/id.jpg"
    ours = sign(
        "PUT",
        "s3.eu-west-1.amazonaws.com",
        path,
        {"Content-Type": "image/jpeg"},
        digest,
        AwsCredentials("AKID", "SECRET", token),
        "eu-west-1",
        when,
    )
    req = AWSRequest(method="PUT", url=f"https://s3.eu-west-1.amazonaws.com{path}", data=body)
    req.headers["Content-Type"] = "image/jpeg"
    req.headers["X-Amz-Content-SHA256"] = digest
    auth = S3SigV4Auth(Credentials("AKID", "SECRET", token), "s3", "eu-west-1")
    with mock.patch("botocore.auth.get_current_datetime", return_value=when.replace(tzinfo=None)):
        auth.add_auth(req)
    assert ours["Authorization"] == req.headers["Authorization"]


def test_put_lands_under_its_key_and_a_second_put_replaces_it(client: S3Client, moto_s3: str) -> None:
    client.put("p/thing/m/1/2024/01/02/a b.jpg", b"one", "image/jpeg")
    client.put("p/thing/m/1/2024/01/02/a b.jpg", b"two", "image/jpeg")
    assert all_objects(moto_s3) == {"p/thing/m/1/2024/01/02/a b.jpg": b"two"}


def test_the_credentials_came_from_the_token_exchange_service(
    client: S3Client, tes: TokenExchangeServer
) -> None:
    client.put("k.json", b"{}", "application/json")
    client.put("k2.json", b"{}", "application/json")
    assert tes.served == {"com.edgeinfer.InferenceRuntime": 1}  # fetched once, kept until near expiry


def test_an_unreachable_store_and_missing_credentials_are_s3_errors(tes: TokenExchangeServer) -> None:
    env = {"AWS_CONTAINER_CREDENTIALS_FULL_URI": tes.uri, "AWS_CONTAINER_AUTHORIZATION_TOKEN": "tok"}
    down = S3Client(BUCKET, "us-east-1", CredentialChain(env), endpoint="http://127.0.0.1:9", timeout_s=2)
    with pytest.raises(S3Error) as err:
        down.put("k", b"x", "image/jpeg")
    assert err.value.status == 0
    with pytest.raises(CredentialsError, match="TokenExchangeService"):
        CredentialChain({}).get()
    refused = CredentialChain(
        {"AWS_CONTAINER_CREDENTIALS_FULL_URI": tes.uri, "AWS_CONTAINER_AUTHORIZATION_TOKEN": "x"}
    )
    with pytest.raises(CredentialsError, match="403"):
        refused.get()
