"""The simulated core's token exchange service (`aws.greengrass.TokenExchangeService`).

A component that depends on the token exchange service finds `AWS_CONTAINER_CREDENTIALS_FULL_URI`
(this server's URL) and `AWS_CONTAINER_AUTHORIZATION_TOKEN` (its own SVCUID) in its environment, so
any AWS SDK's container-credentials provider reads its credentials from here, as on a device.

Shapes follow the classic nucleus's `com.aws.greengrass.tes` package:
- `HttpServerImpl`: served on loopback (127.0.0.1), on a port the system picks (`port` 0), at
  `/2016-11-01/credentialprovider/`; the URI is `http://localhost:<port>/2016-11-01/credentialprovider/`
  (`TokenExchangeService.setEnvVariablesForDependencies`);
- `CredentialRequestHandler.handle`: GET only (405 otherwise), that exact path (400 otherwise), the
  `Authorization` header authenticated as a component's token and authorized for `getCredentials`
  (403 otherwise; the nucleus's default policy grants it to every component), then the credentials as
  `{"AccessKeyId", "SecretAccessKey", "Token", "Expiration"}` — the IoT credentials provider's answer
  translated to the AWS SDK's container format (`translateToAwsSdkFormat`).
Nucleus lite's `tesd` / `tes-http-serverd` serve the same shape at the same path.

Where the credentials come from is the simulator's choice (`CredentialSource`): fixed test
credentials by default (moto's S3 accepts any), or whatever a test hands in.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = [
    "DEPENDENCY",
    "PATH",
    "CredentialSource",
    "Credentials",
    "StaticCredentials",
    "TokenExchangeServer",
]

log = logging.getLogger(__name__)

DEPENDENCY = "aws.greengrass.TokenExchangeService"
PATH = "/2016-11-01/credentialprovider/"
URI_VARIABLE = "AWS_CONTAINER_CREDENTIALS_FULL_URI"
TOKEN_VARIABLE = "AWS_CONTAINER_AUTHORIZATION_TOKEN"


@dataclass(frozen=True)
class Credentials:
    access_key_id: str
    secret_access_key: str
    token: str
    expiration: dt.datetime  # aware, UTC

    def to_json(self) -> bytes:
        """The AWS SDK container-credentials document."""
        return json.dumps(
            {
                "AccessKeyId": self.access_key_id,
                "SecretAccessKey": self.secret_access_key,
                "Token": self.token,
                "Expiration": self.expiration.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        ).encode()


class CredentialSource:
    """Where the service's credentials come from. The base hands out none (the service answers 500,
    as the classic nucleus does when the cloud cannot be reached)."""

    def credentials(self) -> Credentials | None:
        return None


class StaticCredentials(CredentialSource):
    """The same keys every time, valid for `ttl_s` from each request (a test's, or moto's)."""

    def __init__(
        self,
        access_key_id: str = "testing",
        secret_access_key: str = "testing",
        token: str = "testing",
        ttl_s: float = 3600.0,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc),
    ) -> None:
        self.access_key_id = access_key_id
        self.secret_access_key = secret_access_key
        self.token = token
        self.ttl_s = ttl_s
        self.clock = clock
        self.requests = 0

    def credentials(self) -> Credentials:
        self.requests += 1
        expiration = self.clock() + dt.timedelta(seconds=self.ttl_s)
        return Credentials(self.access_key_id, self.secret_access_key, self.token, expiration)


class TokenExchangeServer:
    """The HTTP endpoint. `authenticate(token)` names the component a token belongs to, or None."""

    def __init__(
        self,
        authenticate: Callable[[str], str | None],
        source: CredentialSource | None = None,
        port: int = 0,
    ) -> None:
        self.authenticate = authenticate
        self.source = source if source is not None else StaticCredentials()
        self.served: dict[str, int] = {}  # component -> credentials handed out
        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def uri(self) -> str:
        return f"http://localhost:{self.port}{PATH}"

    def start(self) -> TokenExchangeServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="ggsim-tes", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(5)
            self._thread = None
        self._httpd.server_close()

    def answer(self, method: str, path: str, authorization: str | None) -> tuple[int, bytes]:
        """The status and body for a request (the handler's decisions, testable without HTTP)."""
        if method != "GET":
            return 405, b""
        if path.split("?", 1)[0] != PATH:
            return 400, b""
        component = self.authenticate(authorization or "") if authorization else None
        if component is None:
            return 403, b""
        try:
            creds = self.source.credentials()
        except Exception as exc:  # the source's failure is the caller's 500, never the server's end
            log.warning("token exchange service: no credentials: %s", exc)
            creds = None
        if creds is None:
            return 500, b"Failed to get credentials from TES"
        self.served[component] = self.served.get(component, 0) + 1
        return 200, creds.to_json()


def _handler(server: TokenExchangeServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            status, body = server.answer(self.command, self.path, self.headers.get("Authorization"))
            self.send_response(status)
            if body:
                self.send_header("Content-Type", "application/json" if status == 200 else "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if body:
                self.wfile.write(body)

        def do_GET(self) -> None:
            self._serve()

        def do_PUT(self) -> None:
            self._serve()

        def do_POST(self) -> None:
            self._serve()

        def log_message(self, format: str, *args: object) -> None:
            log.debug("tes: " + format, *args)

    return Handler
