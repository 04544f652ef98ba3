"""Limits of the nuclei that more than one side needs, in a module that imports nothing.

The runtime's configuration reads them where the installer's verify step imports it in a new
environment that has only ONNX Runtime and NumPy, so they cannot live in `edgeinfer.messages`.
"""

from __future__ import annotations

__all__ = ["IPC_MAX_BYTES"]

IPC_MAX_BYTES = 10_000
"""Nucleus lite's cap on one IPC message (`GGL_IPC_MAX_MSG_LEN`): a larger PublishToTopic or
PublishToIoTCore closes the component's whole IPC connection."""
