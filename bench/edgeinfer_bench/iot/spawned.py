"""A load sender in a process of its own, spoken to over a pipe (`Sender` for MQTT, `LocalFlood` for
local pub/sub): spawned, so that no thread or socket of this process goes with it. The process says
`ready`, waits to be told `go`, says `ended` at its last hand-off and `done` with its figures."""

from __future__ import annotations

import contextlib
import multiprocessing
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, TypeVar

from edgeinfer.errors import EdgeinferError

__all__ = ["SpawnedSender"]

Spec = TypeVar("Spec")


class SpawnedSender:
    """`target(conn, spec)` in a spawned process named `name`; `who` names it in errors, and `go`
    waits at most `limit` seconds for its `ended`."""

    def __init__(
        self, target: Callable[[Connection, Spec], None], spec: Spec, *, name: str, who: str, limit: float
    ) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=target, args=(child, spec), name=name, daemon=True)
        self.proc.start()
        child.close()
        self.who = who
        self.limit = limit

    @property
    def pid(self) -> int:
        return int(self.proc.pid or 0)

    def _expect(self, what: str, timeout: float) -> Any:
        if not self._conn.poll(timeout):
            raise EdgeinferError(f"{self.who} did not say {what} within {timeout:g} s")
        try:
            kind, value = self._conn.recv()
        except EOFError:
            self.proc.join(5)  # its pipe closes before it is reaped: its exit status comes with that
            raise EdgeinferError(f"{self.who} ended before {what} (exit {self.proc.exitcode})") from None
        if kind != what:
            raise EdgeinferError(f"{self.who} said {kind}, not {what}")
        return value

    def ready(self) -> None:
        self._expect("ready", 60)

    def go(self) -> float:
        """Start sending; returns the wall time of the last hand-off."""
        self._conn.send(("go", None))
        return float(self._expect("ended", self.limit))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._conn.close()
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
