"""`python -m edgeinfer_bench.echo`: a component that answers each request at once, with no decode
and no inference. `edgeinfer bench runtime` uses it to measure the transport's floor.

The echo takes the runtime's path through the transport: the same IPC client, an inline
subscription, the request's JSON and base64 parsed by `parse_request`, and a result-sized answer
published without waiting. Its round trip is what a runtime with zero compute would take through the
same nucleus: the raw pipeline's time plus the echo's round trip is the best any runtime could reach
through this transport, and the runtime's round trip less the echo's is decode, inference and what
the runtime adds to them.

It listens on `edgeinfer/{thing}/echo/infer` and answers on `edgeinfer/{thing}/echo/result` (its
recipe grants no other topic, so `reply_to` is not followed). A bad request gets its error result, as
the runtime gives.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from edgeinfer.messages import (
    ErrorCode,
    Latency,
    MessageError,
    Prediction,
    Result,
    error_result,
    iso_utc,
    parse_request,
)

# Named, not __name__: run with -m, this module is __main__.
log = logging.getLogger("edgeinfer_bench.echo")

PROVIDER = "echo"
# A result the size of the runtime's: five predictions with ImageNet-length labels.
_PREDICTIONS = [Prediction(index=i, label="echo: no inference was run", score=0.0) for i in range(5)]


def echo_infer_topic(thing: str) -> str:
    return f"edgeinfer/{thing}/echo/infer"


def echo_result_topic(thing: str) -> str:
    return f"edgeinfer/{thing}/echo/result"


class Echo:
    """Answers every request on `bus` with a result that carries no prediction of the image."""

    def __init__(
        self,
        bus: Any,
        thing: str,
        *,
        max_bytes: int = 4 * 1024 * 1024,  # the runtime's default maxPayloadBytes
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.bus = bus
        self.thing = thing
        self.max_bytes = max_bytes
        self.wall = wall
        self.sent = 0  # answers handed to the transport (a refusal comes back later, logged)
        self._sub: Any = None

    def start(self) -> None:
        self._sub = self.bus.subscribe(echo_infer_topic(self.thing), self.handle, inline=True)

    def stop(self) -> None:
        if self._sub is not None:
            self._sub.close()
            self._sub = None

    def handle(self, msg: Any) -> None:
        """Transport callback: one answer per message, never raises."""
        try:
            req = parse_request(msg.payload, max_bytes=self.max_bytes, allow_image_path=False)
        except MessageError as exc:
            result = error_result(exc.request_id, exc.code, exc.message, timestamp=iso_utc(self.wall()))
        except Exception as exc:  # the last line of defence: still one answer
            log.exception("unexpected error reading a request")
            result = error_result(
                None, ErrorCode.INTERNAL, f"internal error: {exc}", timestamp=iso_utc(self.wall())
            )
        else:
            result = Result(
                id=req.id,
                status="ok",
                timestamp=iso_utc(self.wall()),
                predictions=_PREDICTIONS[: req.top_k],
                provider=PROVIDER,
                batch_size=1,
                latency_ms=Latency(),
            )
        try:
            self.bus.publish_nowait(
                echo_result_topic(self.thing), result.to_json(), target=msg.target, on_done=self._published
            )
        except Exception as exc:
            log.warning("answer to %s not published: %s", result.id, exc)
            return
        self.sent += 1

    @staticmethod
    def _published(exc: Exception | None) -> None:
        if exc is not None:
            log.warning("answer not published: %s", exc)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m edgeinfer_bench.echo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--thing", default="", help="thing name (default: $AWS_IOT_THING_NAME)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(levelname)s %(name)s: %(message)s")
    from edgeinfer.transport.base import TransportError
    from edgeinfer.transport.ipc import GreengrassIpcBus

    thing = args.thing or os.environ.get("AWS_IOT_THING_NAME", "") or "edgeinfer-local"
    try:
        bus = GreengrassIpcBus.connect()
    except TransportError as exc:
        print(f"edgeinfer echo: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    echo = Echo(bus, thing)
    try:
        echo.start()
        bus.update_state("RUNNING")
    except TransportError as exc:
        print(f"edgeinfer echo: {exc}", file=sys.stderr)
        with contextlib.suppress(TransportError):
            bus.update_state("ERRORED")
        bus.close()
        return 1
    log.info("echo RUNNING on %s", echo_infer_topic(thing))
    stop.wait()
    echo.stop()
    bus.close()
    log.info("echo stopped after %d answers", echo.sent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
