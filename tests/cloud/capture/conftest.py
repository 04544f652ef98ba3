"""moto's server as the cloud side sees it: S3 holding what devices captured, IoT with thing groups.

Records are put by the device's own S3 client (`edgeinfer.capture.s3`) under `object_key`'s keys, as
the capture uploader puts them: the pull reads what devices write, not a copy of its layout.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from edgeinfer.capture.credentials import CredentialChain
from edgeinfer.capture.record import Record, make_id, object_key
from edgeinfer.capture.s3 import S3Client

BUCKET = "field-capture"
PREFIX = "edgeinfer-capture"
REGION = "eu-central-1"
DAY = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def jpeg(seed: int, size: tuple[int, int] = (40, 32)) -> bytes:
    import cv2

    image = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    ok, buf = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 90])
    assert ok
    return bytes(buf)


@dataclass
class Cloud:
    endpoint: str

    def client(self, service: str) -> Any:
        import boto3

        session: Any = boto3.Session(region_name=REGION)
        return session.client(service, endpoint_url=self.endpoint)

    def group(self, name: str, things: list[str]) -> None:
        iot = self.client("iot")
        iot.create_thing_group(thingGroupName=name)
        for thing in things:
            iot.create_thing(thingName=thing)
            iot.add_thing_to_thing_group(thingGroupName=name, thingName=thing)

    def capture(self, thing: str, model: str, version: str, wall: float, seed: int = 0) -> Record:
        """One record as a device's capture uploads it: the image first, the document last."""
        record_id = make_id(wall, f"req-{seed}")
        key = object_key(PREFIX, thing, model=model, version=version, wall=wall, record_id=record_id)
        record = Record(
            record_id,
            key,
            jpeg(seed),
            {
                "id": record_id,
                "thing": thing,
                "model": {"name": model, "version": version},
                "reason": "random",
            },
        )
        chain = CredentialChain({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"})
        s3 = S3Client(BUCKET, REGION, chain, endpoint=self.endpoint, timeout_s=10)
        s3.put(f"{key}.jpg", record.image, "image/jpeg")
        s3.put(f"{key}.json", record.document(), "application/json")
        return record


@pytest.fixture
def cloud(monkeypatch: pytest.MonkeyPatch) -> Iterator[Cloud]:
    """A fresh moto server holding an empty BUCKET; boto3's IoT calls go to it (the SDKs'
    AWS_ENDPOINT_URL_IOT), S3's through the command's --s3-endpoint."""
    from moto.server import ThreadedMotoServer

    for key in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    monkeypatch.setenv("AWS_ENDPOINT_URL_IOT", endpoint)
    # moto's backends live in the process, across servers: start each test from an empty store
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=10)
    cloud = Cloud(endpoint)
    cloud.client("s3").create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
    try:
        yield cloud
    finally:
        server.stop()
