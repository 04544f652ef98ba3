"""`python -m edgeinfer.runtime.echo`: a component that answers each request at once, with no decode
and no inference. `edgeinfer bench runtime` uses it to measure the transport's floor.

The echo takes the runtime's path through the transport: the same IPC client, an inline
subscription, the request's JSON and base64 parsed by `parse_request`, and a result-sized answer
published without waiting. Its round trip is what a runtime with zero compute would take through the
same nucleus. So the runtime's end-to-end latency minus the echo's is what the runtime itself adds.

It listens on `edgeinfer/{thing}/echo/infer` and answers on `edgeinfer/{thing}/echo/result` (its
recipe grants no other topic, so `reply_to` is not followed). A bad request gets its error result, as
the runtime gives.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
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

log = logging.getLogger(__name__)

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
        max_bytes: int = 16 * 1024 * 1024,
        wall: Callable[[], float] | None = None,
    ) -> None:
        import time

        self.bus = bus
        self.thing = thing
        self.max_bytes = max_bytes
        self.wall = wall or time.time
        self.answered = 0
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
        self.answered += 1

    @staticmethod
    def _published(exc: Exception | None) -> None:
        if exc is not None:
            log.warning("answer not published: %s", exc)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m edgeinfer.runtime.echo",
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
    echo.start()
    bus.update_state("RUNNING")
    log.info("echo RUNNING on %s", echo_infer_topic(thing))
    stop.wait()
    echo.stop()
    bus.close()
    log.info("echo stopped after %d answers", echo.answered)
    return 0


if __name__ == "__main__":
    sys.exit(main())
