"""The standard-library GetConfiguration client against the simulated core (both nuclei's profiles)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from edgeinfer.sim import Simulator
from edgeinfer.transport import TransportError, UnauthorizedError, ipc_config
from edgeinfer.transport.ipc_config import SOCKET_ENV, TOKEN_ENV

APP = "com.example.Installer"
CONFIG: dict[str, Any] = {
    "allowList": [{"name": "x86", "architectures": ["x86_64"]}],
    "keepVenvs": 2,
    "offline": False,
    "pins": {"3.12": {"numpy": "2.4.6"}},
}


@pytest.fixture(params=["classic", "lite"])
def sim(request: pytest.FixtureRequest, simulator: Callable[..., Simulator], tmp_path: Path) -> Simulator:
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    recipe = {
        "RecipeFormatVersion": "2020-01-25",
        "ComponentName": APP,
        "ComponentVersion": "1.0.0",
        "ComponentConfiguration": {"DefaultConfiguration": CONFIG},
        "Manifests": [{"Platform": {"os": "*", "runtime": "*"}, "Lifecycle": {"run": "sleep 600"}}],
    }
    (recipes / "app.yaml").write_text(yaml.safe_dump(recipe))
    return simulator(recipes, thing="ipc-config", nucleus=request.param)


def test_the_whole_configuration_and_one_key(sim: Simulator) -> None:
    env = sim.ipc_env(APP)
    whole = ipc_config.get_configuration(socket_path=env[SOCKET_ENV], token=env[TOKEN_ENV])
    assert str(whole["keepVenvs"]) == "2"  # lite stores YAML scalars as strings: edgeinfer.config reads both
    assert whole["allowList"][0]["architectures"] == ["x86_64"]
    assert set(whole) >= set(CONFIG)
    pins = ipc_config.get_configuration(["pins"], socket_path=env[SOCKET_ENV], token=env[TOKEN_ENV])
    assert pins == {"3.12": {"numpy": "2.4.6"}}
    with pytest.raises(TransportError, match="configuration key nothing not found"):
        ipc_config.get_configuration(["nothing"], socket_path=env[SOCKET_ENV], token=env[TOKEN_ENV])


def test_refusals_are_transport_errors(sim: Simulator, monkeypatch: pytest.MonkeyPatch) -> None:
    env = sim.ipc_env(APP)
    with pytest.raises(UnauthorizedError, match="refused the connection"):
        ipc_config.get_configuration(socket_path=env[SOCKET_ENV], token="not-a-token")
    with pytest.raises(TransportError, match="cannot reach the nucleus"):
        ipc_config.get_configuration(socket_path=env[SOCKET_ENV] + ".gone", token=env[TOKEN_ENV])
    monkeypatch.delenv(SOCKET_ENV, raising=False)
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert not ipc_config.available()
    with pytest.raises(TransportError, match="not running under Greengrass"):
        ipc_config.get_configuration()
