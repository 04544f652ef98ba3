"""The simulated token exchange service, read by botocore's own container-credentials provider."""

from __future__ import annotations

import datetime as dt
import json
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from botocore.credentials import ContainerProvider

from edgeinfer.sim import Simulator
from edgeinfer.sim.tes import PATH, CredentialSource, StaticCredentials, TokenExchangeServer
from tests.helpers.sim import Device
from tests.helpers.wait import wait_for

TOKENS = {"good-token": "com.example.Reader"}


@pytest.fixture
def tes() -> Iterator[TokenExchangeServer]:
    server = TokenExchangeServer(TOKENS.get, StaticCredentials("AKIDEXAMPLE", "secret", "session", 3600))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _get(url: str, token: str | None = None, method: str = "GET") -> int:
    req = urllib.request.Request(url, method=method, headers={"Authorization": token} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_botocore_container_provider_reads_the_credentials(tes: TokenExchangeServer) -> None:
    assert tes.uri == f"http://localhost:{tes.port}/2016-11-01/credentialprovider/"
    env = {"AWS_CONTAINER_CREDENTIALS_FULL_URI": tes.uri, "AWS_CONTAINER_AUTHORIZATION_TOKEN": "good-token"}
    creds = ContainerProvider(environ=env).load()
    assert creds is not None
    frozen = creds.get_frozen_credentials()
    assert (frozen.access_key, frozen.secret_key, frozen.token) == ("AKIDEXAMPLE", "secret", "session")
    assert tes.served["com.example.Reader"] >= 1


def test_the_document_has_the_sdk_shape(tes: TokenExchangeServer) -> None:
    req = urllib.request.Request(tes.uri, headers={"Authorization": "good-token"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        doc = json.loads(resp.read())
    assert set(doc) == {"AccessKeyId", "SecretAccessKey", "Token", "Expiration"}
    expires = dt.datetime.strptime(doc["Expiration"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
    left = (expires - dt.datetime.now(dt.timezone.utc)).total_seconds()
    assert 3500 < left <= 3600


def test_refusals_follow_the_classic_handler(tes: TokenExchangeServer) -> None:
    assert _get(tes.uri) == 403  # no Authorization header
    assert _get(tes.uri, "someone-else") == 403  # not a component's token
    assert _get(tes.uri, "good-token", method="PUT") == 405
    assert _get(f"http://localhost:{tes.port}/other", "good-token") == 400
    assert tes.served == {}


def test_no_credentials_is_a_500_the_sdk_reports() -> None:
    server = TokenExchangeServer(TOKENS.get, CredentialSource()).start()
    try:
        assert _get(server.uri, "good-token") == 500
        assert server.answer("GET", PATH, "good-token")[0] == 500
    finally:
        server.stop()


_READER = """
import sys
from botocore.credentials import ContainerProvider
creds = ContainerProvider().load()
with open(sys.argv[1], "w") as out:
    out.write(creds.get_frozen_credentials().access_key if creds else "none")
"""


def test_dependants_of_the_service_get_its_uri_on_the_simulated_core(
    simulator: Callable[..., Simulator], device: Device, tmp_path: Path, sim_nucleus: str
) -> None:
    script = tmp_path / "reader.py"
    script.write_text(_READER)
    if sim_nucleus == "classic":  # its recipe stands in a deployment; lite's is its own tesd, never deployed
        device.add("aws.greengrass.TokenExchangeService")
    soft = {
        "aws.greengrass.TokenExchangeService": {"VersionRequirement": ">=1.0.0", "DependencyType": "SOFT"}
    }
    for name, deps in (("com.example.Reader", soft), ("com.example.Other", None)):
        out = tmp_path / f"{name}.out"
        device.add(name, deps=deps, lifecycle={"run": f"{sys.executable} {script} {out}"})
    sim = simulator(
        device.recipes, device.artifacts, tes_credentials=StaticCredentials("AKIDFROMSIM", "s", "t")
    )
    reader, other = tmp_path / "com.example.Reader.out", tmp_path / "com.example.Other.out"
    wait_for(lambda: all(p.exists() and p.read_text() != "" for p in (reader, other)), timeout=30)
    assert reader.read_text() == "AKIDFROMSIM"
    assert other.read_text() == "none"  # not a dependant: no URI, as on nucleus lite
    sim.stop()


def test_the_service_is_the_nucleus_s_own_and_the_runtime_depends_on_it(
    simulator: Callable[..., Simulator], device: Device, tmp_path: Path
) -> None:
    import yaml

    recipe = Path(__file__).parents[2] / "recipes" / "com.edgeinfer.InferenceRuntime.yaml"
    ours = yaml.safe_load(recipe.read_text("utf-8"))["ComponentDependencies"]
    spec = {"aws.greengrass.TokenExchangeService": ours["aws.greengrass.TokenExchangeService"]}
    assert spec["aws.greengrass.TokenExchangeService"]["DependencyType"] == "SOFT"
    script = tmp_path / "reader.py"
    script.write_text(_READER)
    out = tmp_path / "reader.out"
    run = {"run": f"{sys.executable} {script} {out}"}  # lite reads lower-case steps only
    device.add("com.example.Reader", deps=spec, lifecycle=run, platform={"os": "linux", "runtime": "*"})
    # No recipe for the service in the folder: both nuclei provide it.
    sim = simulator(
        device.recipes, device.artifacts, tes_credentials=StaticCredentials("AKIDFROMSIM", "s", "t")
    )
    wait_for(lambda: out.exists() and out.read_text() != "", timeout=30)  # written, not just opened
    assert out.read_text() == "AKIDFROMSIM"
    assert list(sim.states()) == ["com.example.Reader"]
    sim.stop()
