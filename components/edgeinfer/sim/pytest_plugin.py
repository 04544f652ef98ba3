"""pytest fixtures for running Greengrass components on the simulated core (auto-loaded via pytest11).

    def test_hello(simulator, tmp_path):
        sim = simulator("recipes", "artifacts", thing="t1")        # started on the session broker
        sim.wait_for_state("com.example.Hello", "RUNNING")
        inbox = sim.cloud_client().subscribe("hello/t1/#")
        ...                                                       # stopped at teardown

Fixtures: `sim_broker` (session-scoped mosquitto: `.host`, `.port`, `.address`), `sim_nucleus`
(the nucleus the simulator behaves as: "classic" unless `pytest --sim-nucleus lite`; parametrize it
to run a test on both: `@pytest.mark.parametrize("sim_nucleus", ["classic", "lite"])`) and
`simulator` (factory `simulator(recipes_dir, artifacts_dir=None, **Simulator kwargs) -> Simulator`;
work_dir defaults to a fresh folder under the test's tmp_path, broker to `sim_broker`, nucleus to
`sim_nucleus`, restart_delay to 0.1 s). Give each test its own `thing` when several share the
session broker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from edgeinfer.sim.broker import MosquittoBroker

if TYPE_CHECKING:
    from edgeinfer.sim.simulator import Simulator

SimulatorFactory = Callable[..., "Simulator"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--sim-nucleus",
        choices=("classic", "lite"),
        default="classic",
        help="the Greengrass nucleus the simulated core behaves as (default: classic)",
    )


@pytest.fixture
def sim_nucleus(request: pytest.FixtureRequest) -> str:
    """The nucleus profile the `simulator` factory uses: "classic" or "lite"."""
    return str(request.config.getoption("--sim-nucleus"))


@pytest.fixture(scope="session")
def sim_broker() -> Iterator[MosquittoBroker]:
    """One mosquitto for the whole session, on a free loopback port (MQTT 5, $share/ subscriptions)."""
    broker = MosquittoBroker().start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def simulator(sim_broker: MosquittoBroker, sim_nucleus: str, tmp_path: Path) -> Iterator[SimulatorFactory]:
    """Factory: start a simulated core with the given recipes; every one started is stopped at teardown."""
    started: list[Simulator] = []

    def make(recipes_dir: str | Path, artifacts_dir: str | Path | None = None, **kwargs: Any) -> Simulator:
        from edgeinfer.sim.simulator import Simulator

        kwargs.setdefault("broker", sim_broker.address)
        kwargs.setdefault("work_dir", tmp_path / f"sim{len(started)}")
        kwargs.setdefault("restart_delay", 0.1)
        kwargs.setdefault("nucleus", sim_nucleus)
        sim = Simulator(recipes_dir, artifacts_dir, **kwargs)
        sim.start()
        started.append(sim)
        return sim

    try:
        yield make
    finally:
        for sim in reversed(started):
            sim.stop()
