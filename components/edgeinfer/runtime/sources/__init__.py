"""Frame sources beyond requests: cameras, video files and streams, folders (docs/sources.md)."""

from edgeinfer.runtime.sources.backoff import Backoff
from edgeinfer.runtime.sources.manager import ServerSink, SourceCounters, SourceManager
from edgeinfer.runtime.sources.mux import FrameMux
from edgeinfer.runtime.sources.readers import IMAGE_EXTENSIONS, FolderReader, FrameReader, VideoReader
from edgeinfer.runtime.sources.runner import FrameFormat, FrameSink, SourceRunner, SourceStats

__all__ = [
    "IMAGE_EXTENSIONS",
    "Backoff",
    "FolderReader",
    "FrameFormat",
    "FrameMux",
    "FrameReader",
    "FrameSink",
    "ServerSink",
    "SourceCounters",
    "SourceManager",
    "SourceRunner",
    "SourceStats",
    "VideoReader",
]
