"""Fixtures for the simulated-core tests (`device`: a tmp recipes/artifacts pair whose manifests both
nuclei read; `ipc_clients`) and the `classic_only(why)` marker: a test of a behaviour only the classic
nucleus has is skipped under `--sim-nucleus lite`, saying why (lite's own behaviour there is tested in
test_nucleus_lite.py / test_lite_limits.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from awsiot.greengrasscoreipc import connect
from awsiot.greengrasscoreipc.clientv2 import GreengrassCoreIPCClientV2

from edgeinfer.sim import Simulator
from tests.helpers.sim import BOTH_NUCLEI, Device


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "classic_only(why): tests a classic-nucleus behaviour that lite does not have; skipped on lite",
    )


@pytest.fixture(autouse=True)
def _classic_only(request: pytest.FixtureRequest, sim_nucleus: str) -> None:
    marker = request.node.get_closest_marker("classic_only")
    if marker is not None and sim_nucleus != "classic":
        pytest.skip(f"classic nucleus only: {marker.args[0]}")


@pytest.fixture
def device(tmp_path: Path) -> Device:
    return Device(tmp_path / "device", platform=BOTH_NUCLEI)


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
