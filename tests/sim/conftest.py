"""Fixtures for the simulated-core tests (`device`: a tmp recipes/artifacts pair; `ipc_clients`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from awsiot.greengrasscoreipc import connect
from awsiot.greengrasscoreipc.clientv2 import GreengrassCoreIPCClientV2

from edgeinfer.sim import Simulator
from tests.helpers.sim import Device


@pytest.fixture
def device(tmp_path: Path) -> Device:
    return Device(tmp_path / "device")


@pytest.fixture
def ipc_clients() -> Iterator[Any]:
    """`ipc_client(sim, component)`: a real GreengrassCoreIPCClientV2 connected as that component."""
    clients: list[GreengrassCoreIPCClientV2] = []

    def make(sim: Simulator, component: str) -> GreengrassCoreIPCClientV2:
        env = sim.ipc_env(component)
        raw = connect(
            ipc_socket=env["AWS_GG_NUCLEUS_DOMAIN_SOCKET_FILEPATH_FOR_COMPONENT"], authtoken=env["SVCUID"]
        )
        client = GreengrassCoreIPCClientV2(client=raw)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()
