"""What reads a source's frames: a camera, a video file or stream (cv2.VideoCapture), a folder.

Each returns frames ready for the model (RGB at its input size, or letterboxed for a detector) at
the source's own pace: a camera's frame rate, a stream's as it arrives, a video file's FPS in real
time, a folder at `rate_hz`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

import numpy as np

from edgeinfer.runtime.decode import (
    DecodeError,
    Letterbox,
    decode_image,
    decode_letterboxed,
    letterbox,
    to_model_input,
)

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")

# FFmpeg's defaults probe a network stream for seconds before its first frame (analyzeduration 5 s):
# a reconnect would take that long each time. A small probe opens an RTSP stream in a fraction of a
# second. OpenCV reads this variable at each open (cap_ffmpeg_impl.hpp); one set by the user wins.
FFMPEG_STREAM_OPTIONS = "analyzeduration;200000|probesize;32768"
OPEN_TIMEOUT_MS = 5000  # a stream that does not answer is tried again later, not waited on
READ_TIMEOUT_MS = 3000  # a stream that stops sending is lost after this long
_env_lock = threading.Lock()


def is_stream(uri: str) -> bool:
    """A network stream (rtsp://, http://, …), not a file or a camera."""
    return "://" in uri and not uri.startswith("file://")


def _stream_options() -> None:
    with _env_lock:
        os.environ.setdefault("OPENCV_FFMPEG_CAPTURE_OPTIONS", FFMPEG_STREAM_OPTIONS)


class FrameReader:
    """A source's frames, one at a time. `geometry`: how the frame `read` returned last was
    letterboxed (a detector's input, its boxes mapped back to the frame's pixels); None when not."""

    geometry: Letterbox | None = None

    def read(self) -> np.ndarray | None:
        """The next frame as RGB `[size, size, 3]`, or None at the end."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the reader holds (nothing, unless it says otherwise)."""


class VideoReader(FrameReader):
    """cv2.VideoCapture on a camera (index or device path) or a video file / stream URL."""

    def __init__(
        self,
        uri: str,
        size: int,
        *,
        camera: bool,
        loop: bool,
        sleep: Callable[[float], None],
        letterboxed: bool = False,
    ) -> None:
        import cv2

        self.uri = uri
        self.size = size
        self.letterboxed = letterboxed  # a detector's input: the whole frame, its geometry kept
        self.geometry: Letterbox | None = None
        self.camera = camera
        self.loop = loop
        self.sleep = sleep
        if is_stream(uri):
            _stream_options()
            timeouts = [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, OPEN_TIMEOUT_MS]
            timeouts += [cv2.CAP_PROP_READ_TIMEOUT_MSEC, READ_TIMEOUT_MS]
            self._cap = cv2.VideoCapture(uri, cv2.CAP_FFMPEG, timeouts)
        else:
            self._cap = cv2.VideoCapture(int(uri) if camera and uri.isdigit() else uri)
        if not self._cap.isOpened():
            raise OSError(f"cannot open {'camera' if camera else 'video'} {uri!r}")
        fps = self._cap.get(cv2.CAP_PROP_FPS)
        live = camera or is_stream(uri)  # frames come at their own pace: never slowed down here
        self.period = 1.0 / fps if not live and fps and 0 < fps < 1000 else 0.0
        self._next = time.monotonic()

    def read(self) -> np.ndarray | None:
        import cv2

        if self.period:  # a file plays in real time, not as fast as it decodes
            delay = self._next - time.monotonic()
            if delay > 0:
                self.sleep(delay)
            self._next = max(self._next + self.period, time.monotonic() - self.period)
        ok, frame = self._cap.read()
        if not ok and self.loop and not self.camera:
            self._cap.set(cv2.CAP_PROP_POS_FRAMES, 0)
            ok, frame = self._cap.read()
        if not ok or frame is None:
            return None
        if self.letterboxed:
            image, self.geometry = letterbox(frame, self.size, bgr=True)
            return image
        return to_model_input(frame, self.size, bgr=True)

    def close(self) -> None:
        self._cap.release()


class FolderReader(FrameReader):
    """Every image in a folder, in name order, at `rate_hz`; unreadable files are skipped and logged."""

    def __init__(
        self,
        folder: str,
        size: int,
        *,
        rate_hz: float,
        loop: bool,
        sleep: Callable[[float], None],
        letterboxed: bool = False,
    ) -> None:
        if not os.path.isdir(folder):
            raise OSError(f"image folder {folder!r} does not exist")
        self.folder = folder
        self.size = size
        self.letterboxed = letterboxed
        self.geometry: Letterbox | None = None
        self.period = 1.0 / rate_hz
        self.loop = loop
        self.sleep = sleep
        self._files: list[str] = []
        self._i = 0
        self._next = time.monotonic()

    def _list(self) -> list[str]:
        return sorted(
            os.path.join(self.folder, f)
            for f in os.listdir(self.folder)
            if f.lower().endswith(IMAGE_EXTENSIONS)
        )

    def read(self) -> np.ndarray | None:
        while True:
            if self._i >= len(self._files):
                if self._files and not self.loop:
                    return None
                self._files, self._i = self._list(), 0
                if not self._files:
                    return None
            path = self._files[self._i]
            self._i += 1
            delay = self._next - time.monotonic()
            if delay > 0:
                self.sleep(delay)
            self._next = max(self._next + self.period, time.monotonic())
            try:
                with open(path, "rb") as fh:
                    data = fh.read()
                if self.letterboxed:
                    image, self.geometry = decode_letterboxed(data, self.size)
                    return image
                return decode_image(data, self.size)
            except (OSError, DecodeError) as exc:
                log.warning("skipping %s: %s", path, exc)
