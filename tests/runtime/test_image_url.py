"""A request's `image_url`: an S3 object read with the token exchange service's credentials, a presigned
URL, and every way a fetch fails answered once, BAD_IMAGE or BAD_REQUEST with the reason."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from edgeinfer.messages import ErrorCode, MessageError, Result, parse_request, result_topic
from edgeinfer.runtime.config import RuntimeConfig, default_recipe_configuration
from edgeinfer.runtime.engine import Engine
from edgeinfer.runtime.image_url import ImageFetcher, url_allowed
from edgeinfer.runtime.server import InferenceServer
from edgeinfer.sim.tes import TokenExchangeServer
from edgeinfer.transport import MemoryBus, Target
from tests.helpers.images import solid_jpeg
from tests.helpers.s3 import boto3_client, running_s3, tes_server
from tests.helpers.wait import eventually

THING = "dev1"
INFER = f"edgeinfer/{THING}/infer"
BUCKET = "edgeinfer-images"
TOKEN = "runtime-token"


def _boto3(endpoint: str) -> Any:
    return boto3_client(endpoint)


@pytest.fixture
def moto_s3() -> Iterator[str]:
    """The endpoint URL of a fresh moto S3 server holding an empty BUCKET."""
    with running_s3(BUCKET) as server:
        yield server.endpoint


@pytest.fixture
def tes() -> Iterator[TokenExchangeServer]:
    with tes_server({TOKEN: "com.edgeinfer.InferenceRuntime"}) as server:
        yield server


class Device:
    """The runtime as a Greengrass component sees it: the TES's variables in its environment."""

    def __init__(self, engine: Engine, cfg: RuntimeConfig, env: dict[str, str], timeout_s: float) -> None:
        self.bus = MemoryBus()
        self.server = InferenceServer(self.bus, engine, cfg, THING)
        self.fetched_on: list[str] = []
        fetcher = ImageFetcher(env, timeout_s=timeout_s)
        fetch = fetcher.fetch

        def recording(url: str, max_bytes: int) -> bytes:
            self.fetched_on.append(threading.current_thread().name)
            return fetch(url, max_bytes)

        fetcher.fetch = recording  # type: ignore[method-assign]
        self.server.image_fetcher = fetcher
        self.server.start()

    def send(self, doc: dict[str, Any], target: Target = "iot") -> None:
        self.bus.publish(INFER, json.dumps(doc).encode(), target=target)

    def answers(self, n: int) -> dict[str, Result]:
        def read() -> list[Result]:
            return [Result.parse(m.payload) for m in self.bus.messages_on(result_topic(THING))]

        eventually(lambda: len(read()) >= n)
        time.sleep(0.2)  # and nothing more arrives
        got = read()
        assert len(got) == n, [r.id for r in got]
        return {r.id or "": r for r in got}


@pytest.fixture
def device(
    make_engine: Callable[..., Engine], moto_s3: str, tes: TokenExchangeServer
) -> Iterator[Callable[..., Device]]:
    made: list[Device] = []

    def make(prefixes: list[str], *, max_payload_bytes: int = 64 * 1024, timeout_s: float = 5.0) -> Device:
        cfg = RuntimeConfig(max_batch_size=2, max_payload_bytes=max_payload_bytes, image_urls=prefixes)
        env = {
            "AWS_CONTAINER_CREDENTIALS_FULL_URI": tes.uri,
            "AWS_CONTAINER_AUTHORIZATION_TOKEN": TOKEN,
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL_S3": moto_s3,
        }
        dev = Device(make_engine(cfg), cfg, env, timeout_s)
        made.append(dev)
        return dev

    yield make
    for dev in made:
        dev.server.stop()


@pytest.mark.devtool  # moto's S3 server and the simulator's token exchange service
def test_an_s3_object_is_read_with_the_token_exchange_services_credentials(
    device: Callable[..., Device], moto_s3: str, tes: TokenExchangeServer
) -> None:
    _boto3(moto_s3).put_object(Bucket=BUCKET, Key="cam/1.jpg", Body=solid_jpeg((240, 5, 5), (640, 480)))
    dev = device([f"s3://{BUCKET}/cam/"])
    dev.send({"id": "s3", "image_url": f"s3://{BUCKET}/cam/1.jpg"})
    res = dev.answers(1)["s3"]
    assert res.status == "ok", res.error
    assert res.predictions[0].label == "red"
    assert tes.served["com.edgeinfer.InferenceRuntime"] >= 1
    # on a decode worker, never the transport's thread (an idle runtime would otherwise run it inline)
    assert dev.fetched_on
    assert all(name.startswith("edgeinfer-decode") for name in dev.fetched_on)


@pytest.mark.devtool  # moto's S3 server and the simulator's token exchange service
def test_a_presigned_url_is_fetched_with_a_plain_get(device: Callable[..., Device], moto_s3: str) -> None:
    s3 = _boto3(moto_s3)
    s3.put_object(Bucket=BUCKET, Key="g.jpg", Body=solid_jpeg((5, 240, 5)))
    url = s3.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": "g.jpg"}, ExpiresIn=300)
    gone = s3.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": "x.jpg"}, ExpiresIn=300)
    dev = device([f"{moto_s3}/{BUCKET}/"])
    dev.send({"id": "signed", "image_url": url})
    dev.send({"id": "gone", "image_url": gone})
    res = dev.answers(2)
    assert res["signed"].status == "ok", res["signed"].error
    assert res["signed"].predictions[0].label == "green"
    err = res["gone"].error
    assert err is not None
    assert err.code == ErrorCode.BAD_IMAGE
    assert "404" in err.message
    assert "X-Amz-Signature" not in err.message  # a presigned URL's query is a credential


@pytest.mark.devtool  # moto's S3 server and the simulator's token exchange service
def test_each_failed_fetch_is_answered_once_with_its_reason(
    device: Callable[..., Device], moto_s3: str
) -> None:
    s3 = _boto3(moto_s3)
    s3.put_object(Bucket=BUCKET, Key="big.jpg", Body=solid_jpeg((9, 9, 9), (640, 480)) + b"\0" * 8000)
    s3.put_object(Bucket=BUCKET, Key="text.jpg", Body=b"not an image")
    silent = socket.socket()  # accepts, never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    slow = f"http://127.0.0.1:{silent.getsockname()[1]}/a.jpg"
    dev = device([f"s3://{BUCKET}/", slow], max_payload_bytes=8000, timeout_s=0.5)
    try:
        dev.send({"id": "missing", "image_url": f"s3://{BUCKET}/nope.jpg"})
        dev.send({"id": "refused", "image_url": "s3://someone-elses-bucket/a.jpg"})
        dev.send({"id": "big", "image_url": f"s3://{BUCKET}/big.jpg"})
        dev.send({"id": "text", "image_url": f"s3://{BUCKET}/text.jpg"})
        dev.send({"id": "slow", "image_url": slow})
        res = dev.answers(5)
    finally:
        silent.close()
    want = {
        "missing": (ErrorCode.BAD_IMAGE, "NoSuchKey"),
        "refused": (ErrorCode.BAD_REQUEST, "image_url is not allowed: 's3://someone-elses-bucket/a.jpg'"),
        "big": (ErrorCode.BAD_IMAGE, "over the limit of 8000"),
        "text": (ErrorCode.BAD_IMAGE, "not a supported image"),
        "slow": (ErrorCode.BAD_IMAGE, "timed out"),
    }
    for rid, (code, why) in want.items():
        err = res[rid].error
        assert err is not None, rid
        assert (err.code, "\n" in err.message) == (code, False), (rid, err)
        assert why in err.message, (rid, err.message)


@pytest.mark.devtool  # moto's S3 server and the simulator's token exchange service
def test_with_no_image_urls_configured_every_url_is_refused(device: Callable[..., Device]) -> None:
    dev = device([])
    dev.send({"id": "u", "image_url": f"s3://{BUCKET}/a.jpg"}, target="local")
    err = dev.answers(1)["u"].error
    assert err is not None
    assert err.code == ErrorCode.BAD_REQUEST
    assert err.message.startswith("image_url is not allowed: ")


# ------------------------------------------------------------------------------ contract and setting


def test_the_request_carries_image_url_and_exactly_one_image() -> None:
    req = parse_request({"id": "a", "image_url": "s3://b/k.jpg"}, allow_image_path=False)
    assert (req.image, req.image_path, req.image_url) == (None, None, "s3://b/k.jpg")
    assert req.to_dict()["image_url"] == "s3://b/k.jpg"
    assert parse_request(req.to_dict()).image_url == "s3://b/k.jpg"
    for doc in (
        {"id": "a", "image_url": "s3://b/k", "image": "aGk="},
        {"id": "a", "image_url": "ftp://b/k"},
        {"id": "a", "image_url": 7},
        {"id": "a"},
    ):
        with pytest.raises(MessageError) as info:
            parse_request(doc)
        assert info.value.code == ErrorCode.BAD_REQUEST, doc


def test_image_urls_is_shipped_in_code_and_checked() -> None:
    assert "imageUrls" not in default_recipe_configuration()
    assert RuntimeConfig.from_recipe({"imageUrls": ["s3://b/"]}).image_urls == ["s3://b/"]
    bad = RuntimeConfig(image_urls=["s3://", "file:///etc/", "https://host/x/"]).check()
    assert [key for key, _ in bad] == ["imageUrls", "imageUrls"]
    assert url_allowed("s3://b/cam/1.jpg", ["s3://a/", "s3://b/cam/"])
    assert not url_allowed("s3://b/other.jpg", ["s3://b/cam/", ""])


@pytest.mark.parametrize(
    ("url", "prefix"),
    [
        ("https://img.example.com.evil.net/x.jpg", "https://img.example.com"),
        ("s3://cams-other/x.jpg", "s3://cams"),
        ("http://10.0.0.1:22/x.jpg", "http://10.0.0.1"),
        ("http://10.0.0.12/x.jpg", "http://10.0.0.1"),
        ("http://127.0.0.1:8000/x.jpg", "http://127.0.0.1:800"),
        ("http://attacker@img.example.com/x.jpg", "http://img.example.com/"),
        ("https://img.example.com/x.jpg", "http://img.example.com/"),
    ],
)
def test_a_prefix_allows_its_own_host_port_or_bucket_only(url: str, prefix: str) -> None:
    assert not url_allowed(url, [prefix])


def test_a_prefix_allows_what_is_under_it() -> None:
    assert url_allowed(
        "https://IMG.example.com/cams/1.jpg?X-Amz-Signature=s", ["https://img.example.com/cams/"]
    )
    assert url_allowed("s3://cams/a/b.jpg", ["s3://cams"])
    assert url_allowed("http://127.0.0.1:8000/cat.jpg", ["http://127.0.0.1:8000/"])


def test_a_fetch_error_that_quotes_the_url_never_shows_its_query() -> None:
    fetcher = ImageFetcher({})
    with pytest.raises(MessageError) as caught:
        fetcher.fetch("http://127.0.0.1:1/x y?X-Amz-Signature=SECRET", 1000)
    assert caught.value.code is ErrorCode.BAD_IMAGE
    assert "SECRET" not in caught.value.message
