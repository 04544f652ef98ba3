"""moto's S3 server for the tests that need a real S3 endpoint, and the simulator's token exchange
service beside it: capture's uploads, image_url's reads, the e2e capture tests.

`running_s3` is the one server the fixtures yield: fresh, on a free port, holding empty buckets. It
can be stopped and started again on the same port (`outage()`), which is how a device sees S3 go away
and come back; moto keeps its objects in this process, across the restart. `versioned` buckets let a
test see a retried upload replace an object (a second version of one key) rather than add one.
"""

from __future__ import annotations

import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from edgeinfer.sim.tes import TokenExchangeServer

__all__ = ["REGION", "MotoS3", "boto3_client", "running_s3", "tes_server"]

REGION = "us-east-1"


def boto3_client(endpoint: str) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


class MotoS3:
    """A moto S3 server on 127.0.0.1; `endpoint` stays the same across `stop()` and `start()`."""

    def __init__(self) -> None:
        self.port = 0
        self._server: Any = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> MotoS3:
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()
        self.port = self._server.get_host_and_port()[1]
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.stop()
        # moto's stop() leaves its socket open: a client would connect and wait; closed, it is refused
        # (S3 unreachable) and the port is free for start() again
        self._server._server.server_close()
        self._server = None

    @contextmanager
    def outage(self) -> Iterator[None]:
        """S3 unreachable inside the block, back (same endpoint, same objects) after it."""
        self.stop()
        try:
            yield
        finally:
            self.start()

    def reset(self) -> None:
        """Empty the store: moto's backends live in the process, across servers."""
        request = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        urllib.request.urlopen(request, timeout=10).close()

    def client(self) -> Any:
        return boto3_client(self.endpoint)

    def create_bucket(self, bucket: str, *, versioned: bool = False) -> None:
        s3 = self.client()
        s3.create_bucket(Bucket=bucket)
        if versioned:
            s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        s3 = self.client()
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(obj["Key"] for page in pages for obj in page.get("Contents", []))

    def objects(self, bucket: str, prefix: str = "") -> dict[str, bytes]:
        s3 = self.client()
        return {k: s3.get_object(Bucket=bucket, Key=k)["Body"].read() for k in self.keys(bucket, prefix)}

    def versions(self, bucket: str, prefix: str = "") -> Counter[str]:
        """Per key, how many versions a versioned bucket holds (a retried upload: two of one key)."""
        s3 = self.client()
        pages = s3.get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix=prefix)
        return Counter(v["Key"] for page in pages for v in page.get("Versions", []))


@contextmanager
def running_s3(*buckets: str, versioned: bool = False) -> Iterator[MotoS3]:
    """A fresh moto S3 server holding `buckets`, empty (what a fixture yields)."""
    server = MotoS3().start()
    try:
        server.reset()
        for bucket in buckets:
            server.create_bucket(bucket, versioned=versioned)
        yield server
    finally:
        server.stop()


@contextmanager
def tes_server(tokens: dict[str, str]) -> Iterator[TokenExchangeServer]:
    """The simulator's token exchange service, answering the given tokens (token -> component)."""
    server = TokenExchangeServer(tokens.get).start()
    try:
        yield server
    finally:
        server.stop()
