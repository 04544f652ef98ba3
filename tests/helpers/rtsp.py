"""The RTSP server fixture: GStreamer's RTSP server (`edgeinfer_bench.rtsp`, shared with `edgeinfer bench
streams`) with four 10 fps streams, skipped where Debian's packages for it are not installed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from edgeinfer_bench.rtsp import RtspServer, available

__all__ = ["RtspServer", "rtsp_server"]


@pytest.fixture
def rtsp_server() -> Iterator[RtspServer]:
    """Four 10 fps streams, started (skipped where GStreamer's RTSP server is not installed)."""
    why = available()
    if why is not None:
        pytest.skip(why)
    server = RtspServer(4, 10)
    server.start()
    try:
        yield server
    finally:
        server.stop()
