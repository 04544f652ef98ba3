"""AWS credentials as the SDKs' default chain finds them on a Greengrass device, standard library only.

In order: `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` (+ `AWS_SESSION_TOKEN`) in the environment; then
the container-credentials provider the token exchange service serves: GET
`AWS_CONTAINER_CREDENTIALS_FULL_URI` with `Authorization: $AWS_CONTAINER_AUTHORIZATION_TOKEN` (or the
content of `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE`), answered `{"AccessKeyId", "SecretAccessKey",
"Token", "Expiration"}`. Fetched credentials are kept until five minutes before they expire, as the
SDKs' refresh window does.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from edgeinfer.errors import EdgeinferError

__all__ = ["AwsCredentials", "CredentialChain", "CredentialsError"]

_REFRESH_S = 300.0


class CredentialsError(EdgeinferError):
    """No credentials could be had (none configured, or the service refused or was unreachable)."""


@dataclass(frozen=True)
class AwsCredentials:
    access_key: str
    secret_key: str
    token: str | None = None
    expires: float | None = None  # epoch s; None: does not expire


class CredentialChain:
    def __init__(
        self,
        environ: Mapping[str, str] | None = None,
        *,
        wall: Callable[[], float] = time.time,
        timeout_s: float = 5.0,
    ) -> None:
        self.environ = environ if environ is not None else os.environ
        self.wall = wall
        self.timeout_s = timeout_s
        self._cached: AwsCredentials | None = None
        self._lock = threading.Lock()

    def get(self) -> AwsCredentials:
        """Valid credentials; raises CredentialsError."""
        with self._lock:
            cached = self._cached
            if cached is not None and (cached.expires is None or cached.expires - _REFRESH_S > self.wall()):
                return cached
            self._cached = self._resolve()
            return self._cached

    def invalidate(self) -> None:
        """The store refused them (expired early, rotated): fetch again next time."""
        with self._lock:
            self._cached = None

    def _resolve(self) -> AwsCredentials:
        env = self.environ
        if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
            return AwsCredentials(
                env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"], env.get("AWS_SESSION_TOKEN")
            )
        uri = env.get("AWS_CONTAINER_CREDENTIALS_FULL_URI", "")
        if not uri:
            raise CredentialsError(
                "no AWS credentials: no AWS_ACCESS_KEY_ID and no AWS_CONTAINER_CREDENTIALS_FULL_URI "
                "(does the component depend on aws.greengrass.TokenExchangeService?)"
            )
        return self._from_container(uri)

    def _token(self) -> str:
        path = self.environ.get("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", "")
        if path:
            try:
                with open(path, encoding="utf-8") as fh:
                    return fh.read().strip()
            except OSError as exc:
                raise CredentialsError(f"authorization token file {path}: {exc}") from None
        return self.environ.get("AWS_CONTAINER_AUTHORIZATION_TOKEN", "")

    def _from_container(self, uri: str) -> AwsCredentials:
        token = self._token()
        req = urllib.request.Request(uri, headers={"Authorization": token} if token else {})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                doc = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise CredentialsError(f"the token exchange service answered {exc.code}") from None
        except (OSError, ValueError) as exc:
            raise CredentialsError(f"the token exchange service at {uri}: {exc}") from None
        try:
            expires = dt.datetime.fromisoformat(str(doc["Expiration"]).replace("Z", "+00:00")).timestamp()
            return AwsCredentials(
                str(doc["AccessKeyId"]), str(doc["SecretAccessKey"]), doc.get("Token"), expires
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise CredentialsError(f"the token exchange service's answer lacks {exc}") from None
