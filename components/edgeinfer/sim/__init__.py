"""The simulated Greengrass core: run unmodified Greengrass components locally (`edgeinfer sim`).

It loads recipes and artifacts as `greengrass-cli deployment create --recipeDir --artifactDir` does,
runs each component's lifecycle as real processes with the nucleus environment, serves the real
Greengrass IPC protocol on a Unix socket (so the unmodified awsiotsdk `GreengrassCoreIPCClientV2`
connects with `SVCUID` and `AWS_GG_NUCLEUS_DOMAIN_SOCKET_FILEPATH_FOR_COMPONENT`), and bridges IoT
Core to a real mosquitto broker that it starts on a free loopback port.

Python API::

    from edgeinfer.sim import Simulator

    with Simulator(recipes_dir, artifacts_dir, thing="test-thing",
                   components=None,                       # all recipes, or ["Name", "Name=1.0.0"]
                   config_merge={"Comp": {"key": 1}},     # deployment-time MERGE per component
                   config_reset={"Comp": ["/key"]},       # deployment-time RESET (JSON pointers)
                   work_dir=tmp_path,                     # kernel root; a temp dir when None
                   broker=None,                           # (host, port) / "host:port" of a running broker
                   restart_delay=0.5, max_errors=3,
                   nucleus="classic",                     # or "lite": behave as nucleus lite
                   component_user=None) as sim:           # "user[:group]"; default: see below
        sim.wait_for_state("com.example.Hello", "RUNNING", timeout=30)  # -> state, or SimError
        sim.states()                     # {"com.example.Hello": "RUNNING", ...}
        sim.history("com.example.Hello") # ["NEW", "INSTALLED", "STARTING", "RUNNING", ...]
        sim.logs("com.example.Hello")    # the component's log file (stdout + stderr + lifecycle lines)
        sim.broker                       # ("127.0.0.1", port): IoT Core stand-in, MQTT 5 and 3.1.1
        cloud = sim.cloud_client()       # CloudClient on the broker, as IoT Core's other side
        inbox = cloud.subscribe("edgeinfer/test-thing/#")
        cloud.publish("edgeinfer/test-thing/infer", b"{...}", qos=1)
        inbox.wait_for(1, timeout=10)    # -> list[edgeinfer.transport.Message]; TimeoutError if fewer
        local = sim.local_client()       # local pub/sub from the test (no authorization)
        local.publish(topic, b"bytes" | {"json": 1}); local.subscribe("a/#") -> Inbox
        sim.update_configuration("Comp", merge={...}, reset=[...])  # validators first; SimError if rejected
        sim.update_component("Comp", merge={...})  # a deployment: subscribers may defer it, then restart
        sim.warnings                     # what it did unlike a nucleus (e.g. a component not as ggc_user)
        sim.configuration("Comp")        # current configuration
        sim.ipc_env("Comp")              # {"SVCUID", "AWS_GG_NUCLEUS_DOMAIN_SOCKET_FILEPATH_FOR_COMPONENT"}
        sim.restart("Comp")              # Shutdown, then Install and Run again
        sim.wait_for_all(("RUNNING", "FINISHED"), timeout=60)
        with sim.iot_outage(): ...       # the device loses IoT Core; the broker stays up for the cloud
        sim.root, sim.socket_path        # kernel root (logs/, work/, packages/, status.json), IPC socket

Lifecycle: Setenv, Install (re-run at every start, Timeout default 120 s), Startup or Run, Shutdown,
Recover; states NEW → INSTALLED → STARTING → RUNNING / FINISHED, ERRORED → restart with back-off →
BROKEN after `max_errors`; a HARD dependant waits for RUNNING/FINISHED and restarts when its
dependency errs. `RUNNING` is set when the Run process starts (Startup: when it exits 0), as on a
real nucleus; `UpdateState` moves it too.

`nucleus="lite"` behaves as nucleus lite (`edgeinfer.greengrass.nuclei` lists the differences); run
as root, components run as the nucleus's component user. The test kit for this project's own
components is `edgeinfer.sim.testing`.

Bad recipes raise `edgeinfer.greengrass.recipe.RecipeError` from `start()` before anything runs.
The pytest plugin (`edgeinfer.sim.pytest_plugin`, auto-loaded) gives the fixtures `sim_broker`
(session mosquitto, `MosquittoBroker` with `.host`, `.port`, `.address`) and `simulator` (a factory:
`simulator(recipes_dir, artifacts_dir=None, **kwargs) -> Simulator`, started on `sim_broker` and
stopped at teardown).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgeinfer.greengrass.recipe import RecipeError
    from edgeinfer.sim.broker import CloudClient, Inbox, MosquittoBroker
    from edgeinfer.sim.pubsub import LocalClient
    from edgeinfer.sim.simulator import SimError, Simulator

__all__ = ["CloudClient", "Inbox", "LocalClient", "MosquittoBroker", "RecipeError", "SimError", "Simulator"]

_WHERE = {
    "Inbox": "broker",
    "MosquittoBroker": "broker",
    "CloudClient": "broker",
    "RecipeError": "edgeinfer.greengrass.recipe",
    "LocalClient": "pubsub",
    "SimError": "simulator",
    "Simulator": "simulator",
}


def __getattr__(name: str) -> Any:
    # Lazy, so that the pytest plugin (loaded in every session) and `edgeinfer --help` stay light.
    if name in _WHERE:
        where = _WHERE[name]
        return getattr(importlib.import_module(where if "." in where else f"edgeinfer.sim.{where}"), name)
    raise AttributeError(f"module 'edgeinfer.sim' has no attribute {name!r}")
