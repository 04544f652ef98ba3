"""User-facing errors: the command line prints these as one line and exits non-zero, no traceback."""

from __future__ import annotations


class EdgeinferError(Exception):
    """An error the user can act on. `str(err)` is the whole one-line message."""

    exit_code = 2


class GateFailedError(EdgeinferError):
    """A quantized model fell below the accuracy gate."""

    exit_code = 3
