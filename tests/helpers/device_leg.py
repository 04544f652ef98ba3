"""pytest plugin of the device-side test legs (`make test` on Python 3.10 and 3.12): the unit tests
that need no developer tool. A test that runs the simulated Greengrass core (its fixtures) or asks
the package index is left to the main run on the development venv.

    python -m pytest -p tests.helpers.device_leg tests/installer tests/runtime ...
"""

from __future__ import annotations

import pytest

# The simulated core's fixtures (edgeinfer.sim.pytest_plugin): a developer tool, with mosquitto.
SIM_FIXTURES = frozenset({"simulator", "sim_broker", "sim_nucleus"})
DEV_ONLY_MARKERS = ("slow", "e2e", "index", "devtool")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep, drop = [], []
    for item in items:
        needs_sim = SIM_FIXTURES & set(getattr(item, "fixturenames", ()))
        if needs_sim or any(item.get_closest_marker(m) for m in DEV_ONLY_MARKERS):
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
