"""PutObject and GetObject on S3 or an S3-compatible store, SigV4-signed by the standard library.

Why not boto3: the device install stays lean (no boto3, see pyproject), a capture needs one call (PUT
of a whole object) and a request's `image_url` another (GET of one). The signature is AWS's documented
SigV4 with the body's SHA-256 in `x-amz-content-sha256`; tests check it against botocore's own signer
and a real S3 API (moto's server). AWS S3 is addressed virtual-hosted style; an `endpoint` (MinIO,
moto) path-style, as those expect.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import http.client
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

from edgeinfer.capture.credentials import AwsCredentials, CredentialChain

__all__ = ["S3Client", "S3Error", "sign"]


class S3Error(Exception):
    """A PUT that did not store the object, or a GET that did not read it: `status` 0 when the store
    was not reached (or the object was over the GET's limit)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def sign(  # noqa: PLR0917 - the SigV4 inputs, in the order AWS's documentation names them
    method: str,
    host: str,
    path: str,
    headers: dict[str, str],
    payload_hash: str,
    creds: AwsCredentials,
    region: str,
    now: dt.datetime,
    service: str = "s3",
) -> dict[str, str]:
    """`headers` with `Host`, `X-Amz-Date`, `X-Amz-Content-SHA256`, the session token and
    `Authorization` added; every header given is signed. `path` is already URI-encoded."""
    stamp = now.strftime("%Y%m%dT%H%M%SZ")
    day = stamp[:8]
    out = dict(headers)
    out.update({"Host": host, "X-Amz-Date": stamp, "X-Amz-Content-SHA256": payload_hash})
    if creds.token:
        out["X-Amz-Security-Token"] = creds.token
    canon = {k.lower().strip(): " ".join(v.split()) for k, v in out.items()}
    names = sorted(canon)
    signed = ";".join(names)
    request = "\n".join([method, path, "", *(f"{n}:{canon[n]}" for n in names), "", signed, payload_hash])
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(request.encode()).hexdigest()])
    key = _hmac(_hmac(_hmac(_hmac(f"AWS4{creds.secret_key}".encode(), day), region), service), "aws4_request")
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    out["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={creds.access_key}/{scope}, "
        f"SignedHeaders={signed}, Signature={signature}"
    )
    return out


@dataclass(frozen=True)
class _Target:
    https: bool
    host: str  # with the port where not the default
    path_prefix: str  # "/bucket" path-style, "" virtual-hosted


class S3Client:
    def __init__(
        self,
        bucket: str,
        region: str,
        credentials: CredentialChain,
        *,
        endpoint: str = "",
        timeout_s: float = 30.0,
        now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc),
    ) -> None:
        self.bucket = bucket
        self.region = region or "us-east-1"
        self.credentials = credentials
        self.timeout_s = timeout_s
        self.now = now
        self.target = self._target(endpoint)

    def _target(self, endpoint: str) -> _Target:
        if endpoint:
            url = urllib.parse.urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
            prefix = url.path.rstrip("/") + "/" + urllib.parse.quote(self.bucket, safe="")
            return _Target(url.scheme == "https", url.netloc, prefix)
        if "." in self.bucket:  # a dotted name breaks the wildcard certificate: path-style
            return _Target(True, f"s3.{self.region}.amazonaws.com", f"/{self.bucket}")
        return _Target(True, f"{self.bucket}.s3.{self.region}.amazonaws.com", "")

    def put(self, key: str, body: bytes, content_type: str) -> None:
        """Store `body` under `key` (replacing what is there). Raises S3Error."""
        headers = {"Content-Type": content_type, "Content-Length": str(len(body))}
        status, text = self._send("PUT", key, body, headers, max_bytes=2048)
        if status != 200:
            raise S3Error(status, text.decode("utf-8", "replace").strip()[:300])

    def get(self, key: str, max_bytes: int) -> bytes:
        """The object under `key`, refused (S3Error, status 0) past `max_bytes`. Raises S3Error."""
        status, body = self._send("GET", key, b"", {}, max_bytes=max_bytes)
        if status != 200:
            raise S3Error(status, _error_code(body))
        return body

    def _send(
        self, method: str, key: str, body: bytes, headers: dict[str, str], *, max_bytes: int
    ) -> tuple[int, bytes]:
        """One signed request: its status and at most `max_bytes` of its body (a 200's longer body
        raises S3Error). Expired or rotated credentials are dropped for the next call."""
        path = self.target.path_prefix + "/" + urllib.parse.quote(key, safe="/-_.~")
        try:
            creds = self.credentials.get()
        except Exception as exc:
            raise S3Error(0, f"no credentials: {exc}") from None
        signed = sign(
            method,
            self.target.host,
            path,
            headers,
            hashlib.sha256(body).hexdigest(),
            creds,
            self.region,
            self.now(),
        )
        cls = http.client.HTTPSConnection if self.target.https else http.client.HTTPConnection
        conn = cls(self.target.host, timeout=self.timeout_s)
        try:
            conn.request(method, path, body=body or None, headers=signed)
            resp = conn.getresponse()
            length = resp.getheader("Content-Length")
            if resp.status == 200 and length is not None and length.isdigit() and int(length) > max_bytes:
                raise S3Error(0, f"the object is {length} bytes, over the limit of {max_bytes}")
            text = resp.read(max_bytes + 1)
        except (OSError, OverflowError, http.client.HTTPException) as exc:
            raise S3Error(0, f"{self.target.host}: {type(exc).__name__}: {exc}") from None
        finally:
            conn.close()
        if resp.status == 200 and len(text) > max_bytes:
            raise S3Error(0, f"the object is over the limit of {max_bytes} bytes")
        if resp.status in (400, 403) and (b"ExpiredToken" in text or b"InvalidAccessKeyId" in text):
            self.credentials.invalidate()
        return resp.status, text


def _error_code(body: bytes) -> str:
    """S3's error document's `<Code>` (NoSuchKey, AccessDenied, …), else the start of the body."""
    text = body[:2048].decode("utf-8", "replace")
    start, end = text.find("<Code>"), text.find("</Code>")
    if 0 <= start < end:
        return text[start + 6 : end]
    return " ".join(text.split())[:300] or "no body"
