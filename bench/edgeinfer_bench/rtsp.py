"""A real RTSP server: GStreamer's rtsp-server (Debian's gir1.2-gst-rtsp-server-1.0), run by Debian's
/usr/bin/python3 (which has python3-gi) in a subprocess of its own: the cameras of the stream tests
and of `edgeinfer bench streams`.

`RtspServer(streams, fps)` serves `rtsp://127.0.0.1:PORT/s0` … `/sN-1`, each a live test pattern
(H.264, small frames, a key frame every second) from a pipeline of its own, started when its first
client plays it: the streams' frames come at unrelated instants, as separate cameras' do. `stop()`
kills the server (clients see the stream drop); `start()` again serves the same URLs on the same port.
The `make test` target installs the packages (the Makefile's `mosquitto` target); without them the
tests that need it are skipped (`available` says why).
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time

__all__ = ["DEBIAN_PYTHON", "RtspServer", "available"]

DEBIAN_PYTHON = "/usr/bin/python3"

SERVER = """
import sys
import gi
gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer

Gst.init(None)
port, streams, fps, width, height = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
server = GstRtspServer.RTSPServer()
server.set_service(port)
mounts = server.get_mount_points()
for i in range(streams):
    factory = GstRtspServer.RTSPMediaFactory()
    factory.set_launch(
        f"( videotestsrc is-live=true pattern={i % 20} ! video/x-raw,width={width},height={height},"
        f"framerate={fps}/1 ! x264enc tune=zerolatency speed-preset=ultrafast key-int-max={fps} "
        "bitrate=300 ! rtph264pay name=pay0 pt=96 config-interval=-1 )"
    )
    factory.set_shared(True)  # one encoder per stream, whoever watches it
    mounts.add_factory(f"/s{i}", factory)
if server.attach(None) == 0:
    sys.exit("cannot listen on port " + port)
print("ready", flush=True)
GLib.MainLoop().run()
"""


def available() -> str | None:
    """None when the server can run here, else why not."""
    if not os.access(DEBIAN_PYTHON, os.X_OK):
        return f"{DEBIAN_PYTHON} is missing"
    probe = subprocess.run(
        [
            DEBIAN_PYTHON,
            "-c",
            "import gi; gi.require_version('GstRtspServer', '1.0'); from gi.repository import GstRtspServer;"
            "from gi.repository import Gst; Gst.init(None);"
            "assert Gst.ElementFactory.find('x264enc') and Gst.ElementFactory.find('rtph264pay')",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if probe.returncode != 0:
        return "GStreamer's RTSP server is not installed (make setup installs it): " + probe.stderr[-300:]
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RtspServer:
    def __init__(self, streams: int, fps: int = 10, *, width: int = 160, height: int = 120) -> None:
        self.streams = streams
        self.fps = fps
        self.size = (width, height)
        self.port = free_port()
        self.proc: subprocess.Popen[str] | None = None
        self.log: list[str] = []

    @property
    def urls(self) -> list[str]:
        return [f"rtsp://127.0.0.1:{self.port}/s{i}" for i in range(self.streams)]

    def start(self, timeout: float = 60.0) -> None:
        """Start serving, and return once the server listens (bounded by `timeout`)."""
        args = [str(self.streams), str(self.fps), str(self.size[0]), str(self.size[1])]
        deadline = time.monotonic() + timeout
        while True:  # the port may still be held a moment by the server just killed
            proc = subprocess.Popen(
                [DEBIAN_PYTHON, "-c", SERVER, str(self.port), *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            assert proc.stdout is not None
            first = proc.stdout.readline().strip()  # "ready", or the error it exits with
            if first == "ready":
                self.proc = proc
                threading.Thread(target=self._drain, args=(proc,), daemon=True).start()
                return
            proc.wait(timeout=10)
            self.log.append(first + (proc.stdout.read() or ""))
            if time.monotonic() > deadline:
                raise RuntimeError(f"the RTSP server did not start: {self.log[-1][-500:]}")
            time.sleep(0.2)  # a port in the kernel's hands: poll until it is free again

    def _drain(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.log.append(line.rstrip())

    def stop(self) -> None:
        """Kill the server at once, as a camera that loses power: its clients' streams drop."""
        proc, self.proc = self.proc, None
        if proc is not None:
            proc.kill()
            proc.wait(timeout=30)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None
