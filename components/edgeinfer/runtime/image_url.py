"""A request's `image_url`: whether the runtime may fetch it, and the fetch (on a decode worker).

Why by reference: on nucleus lite, IoT Core → device messages over 5,000 bytes are dropped and IPC
messages are capped at 10,000 bytes, so a camera-sized image cannot travel in the request itself.

- `s3://bucket/key`: GetObject with the device's credentials (the SDKs' chain: on a Greengrass core the
  token exchange service), signed by `edgeinfer.capture.s3` — the project's one S3 client. The region
  is `AWS_REGION` (the nucleus sets it); `AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL` (the SDKs' own
  variables) point it at an S3-compatible store.
- `https://…` (a presigned URL, say) and `http://…`: one plain GET, no redirects followed.
Either way the body is capped at `maxPayloadBytes` and the fetch at a short timeout; every failure is
`MessageError(BAD_IMAGE)` with a one-line reason.
"""

from __future__ import annotations

import http.client
import os
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence

from edgeinfer.capture.credentials import CredentialChain
from edgeinfer.capture.s3 import S3Client, S3Error
from edgeinfer.messages import ErrorCode, MessageError

__all__ = ["FETCH_TIMEOUT_S", "ImageFetcher", "url_allowed"]

FETCH_TIMEOUT_S = 5.0


def url_allowed(url: str, prefixes: Sequence[str]) -> bool:
    """`url` is under one of `prefixes` (the runtime's `imageUrls`): the same scheme and the very same
    host, port or bucket, and a path that starts with the prefix's. A plain string prefix would let
    `https://img.example.com` allow `https://img.example.com.evil.net/…`, `s3://cams` allow
    `s3://cams-other/…`, and `http://10.0.0.1` allow port 22."""
    try:
        u = urllib.parse.urlsplit(url)
    except ValueError:
        return False
    if "@" in u.netloc:  # a user part before the host: never ours to send
        return False
    for prefix in prefixes:
        if not prefix:
            continue
        p = urllib.parse.urlsplit(prefix)
        same_place = (u.scheme.lower(), u.netloc.lower()) == (p.scheme.lower(), p.netloc.lower())
        if same_place and u.path.startswith(p.path):
            return True
    return False


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect could lead outside the allowed prefixes: it is answered as the error it is."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


class ImageFetcher:
    """Fetches `image_url`s; one per runtime (S3 clients and credentials are kept between requests)."""

    def __init__(
        self,
        environ: Mapping[str, str] | None = None,
        *,
        timeout_s: float = FETCH_TIMEOUT_S,
    ) -> None:
        self.environ = environ if environ is not None else os.environ
        self.timeout_s = timeout_s
        self.credentials = CredentialChain(self.environ, timeout_s=timeout_s)
        self._clients: dict[str, S3Client] = {}
        self._lock = threading.Lock()
        self._opener = urllib.request.build_opener(_NoRedirects)

    def fetch(self, url: str, max_bytes: int) -> bytes:
        """The image's bytes. Raises MessageError(BAD_IMAGE) saying why not."""
        if url.startswith("s3://"):
            return self._fetch_s3(url, max_bytes)
        return self._fetch_http(url, max_bytes)

    def _client(self, bucket: str) -> S3Client:
        with self._lock:
            client = self._clients.get(bucket)
            if client is None:
                env = self.environ
                client = S3Client(
                    bucket,
                    env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
                    self.credentials,
                    endpoint=env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or "",
                    timeout_s=self.timeout_s,
                )
                self._clients[bucket] = client
            return client

    def _fetch_s3(self, url: str, max_bytes: int) -> bytes:
        bucket, _, key = url[len("s3://") :].partition("/")
        if not bucket or not key:
            raise MessageError(ErrorCode.BAD_IMAGE, f"image_url {url!r} names no object (s3://bucket/key)")
        try:
            return self._client(bucket).get(key, max_bytes)  # a literal key, as the AWS CLI reads one
        except S3Error as exc:
            raise _bad(url, _one_line(exc)) from None

    def _fetch_http(self, url: str, max_bytes: int) -> bytes:
        shown = url.split("?", 1)[0]  # a presigned URL's query is a credential: never echoed
        try:
            with self._opener.open(urllib.request.Request(url), timeout=self.timeout_s) as resp:
                length = resp.headers.get("Content-Length")
                if length is not None and length.isdigit() and int(length) > max_bytes:
                    why = f"it is {length} bytes, over the limit of {max_bytes}"
                    raise _bad(shown, why)
                body: bytes = resp.read(max_bytes + 1)
        except urllib.error.HTTPError as exc:
            why = f"the server answered {exc.code} {exc.reason}"
            raise _bad(shown, why) from None
        except (OSError, ValueError, OverflowError, http.client.HTTPException) as exc:
            # Some of these quote the request target: never with a presigned URL's query in it.
            query = url.partition("?")[2]
            why = _one_line(exc).replace(query, "…") if query else _one_line(exc)
            raise _bad(shown, f"{type(exc).__name__}: {why}") from None
        if len(body) > max_bytes:
            why = f"it is over the limit of {max_bytes} bytes"
            raise _bad(shown, why)
        return body


def _bad(url: str, why: str) -> MessageError:
    return MessageError(ErrorCode.BAD_IMAGE, f"cannot read image_url {url}: {why}")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__
