"""Progress bars for long commands: `rich.progress` on stderr, one task per step (a no-op when quiet).

    with Progress(quiet) as progress:
        with progress.step("calibration", len(batches)) as tick:
            for batch in batches:
                ...
                tick(1)

`unit="bytes"` shows sizes, speed and time left (uploads); `tick` is safe to call from other threads
(boto3's transfer callbacks). rich is imported only when a bar is shown.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any, Literal

__all__ = ["Progress"]

Tick = Callable[[int], None]


class Progress:
    """rich progress bars on stderr (or `file`), one task per step; a no-op when `quiet`."""

    def __init__(
        self, quiet: bool = False, *, unit: Literal["items", "bytes"] = "items", file: IO[str] | None = None
    ) -> None:
        self._bar: Any = None
        if quiet:
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            MofNCompleteColumn,
            ProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )
        from rich.progress import Progress as RichProgress

        columns: list[ProgressColumn] = [TextColumn("{task.description:<24}"), BarColumn()]
        if unit == "bytes":
            columns += [DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn()]
        else:
            columns += [MofNCompleteColumn(), TimeElapsedColumn()]
        console = Console(file=file) if file is not None else Console(stderr=True)
        self._bar = RichProgress(*columns, console=console)

    @classmethod
    def on_terminal(cls, *, unit: Literal["items", "bytes"] = "items") -> Progress:
        """Bars when stderr is a terminal, quiet otherwise (logs, CI, pipes)."""
        return cls(quiet=not sys.stderr.isatty(), unit=unit)

    def __enter__(self) -> Progress:
        if self._bar is not None:
            self._bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)

    @contextmanager
    def step(self, description: str, total: int) -> Iterator[Tick]:
        """A task of `total` units; the step's end marks it complete."""
        if self._bar is None:
            yield lambda _n: None
            return
        task = self._bar.add_task(description, total=max(total, 1))
        yield lambda n: self._bar.advance(task, n)
        self._bar.update(task, completed=max(total, 1))
