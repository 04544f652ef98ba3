"""The simulated core's test kit: this project's components laid out as a device, ready to deploy.

    from edgeinfer.sim.testing import RUNTIME, prepare_device, wait_ready

    recipes, artifacts = prepare_device(tmp_path / "device", store_dir)
    sim = simulator(recipes, artifacts, thing="t1")   # the pytest plugin's factory
    wait_ready(sim)                                   # the runtime warmed up and said so

`prepare_device` writes the runtime's real recipe beside three stand-ins: a ModelStore recipe
listing a built store's files, an installer that links this Python environment where the real
installer puts its venv (no pip run), and a client component (`CLIENT`) that a test or a load
generator connects as over IPC. The end-to-end tests and the benchmarks share it.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = [
    "CLIENT",
    "INSTALLER",
    "RUNTIME",
    "STORE",
    "client_recipe",
    "prepare_device",
    "recipes_dir",
    "wait_ready",
]

RUNTIME = "com.edgeinfer.InferenceRuntime"
STORE = "com.edgeinfer.ModelStore"
INSTALLER = "com.edgeinfer.RuntimeInstaller"
CLIENT = "com.edgeinfer.BenchClient"


def _version() -> str:
    from edgeinfer import __version__

    return __version__


VERSION = _version()  # what the runtime recipe's dependency ranges ask for


def recipes_dir() -> Path:
    """The project's recipes/ (run from a checkout: the working folder's, else this file's)."""
    from edgeinfer.bundle.build import BuildError, find_project

    try:
        return find_project() / "recipes"
    except BuildError:
        return find_project(Path(__file__).parent) / "recipes"


def _recipe(name: str, lifecycle: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "RecipeFormatVersion": "2020-01-25",
        "ComponentName": name,
        "ComponentVersion": VERSION,
        **extra,
        "Manifests": [{"Platform": {"os": "linux", "runtime": "*"}, "Lifecycle": lifecycle}],
    }


def client_recipe(name: str = CLIENT, topics: str = "edgeinfer/{iot:thingName}/#") -> dict[str, Any]:
    """A component with no process of its own, allowed to publish and subscribe on `topics` locally:
    what a test connects as (`Simulator.ipc_env(name)`). It reaches FINISHED on both nuclei."""
    access = {
        "aws.greengrass.ipc.pubsub": {
            f"{name}:pubsub:1": {
                "operations": ["aws.greengrass#PublishToTopic", "aws.greengrass#SubscribeToTopic"],
                "resources": [topics],
            }
        }
    }
    # A no-op install step: nucleus lite never finishes a component without any step.
    lifecycle = {"install": "true"}
    return _recipe(
        name, lifecycle, ComponentConfiguration={"DefaultConfiguration": {"accessControl": access}}
    )


def prepare_device(
    root: Path,
    store_dir: Path,
    recipes_src: Path | None = None,
    *,
    extra: Iterable[dict[str, Any]] = (),
) -> tuple[Path, Path]:
    """`root/recipes` + `root/artifacts` for the simulated core: the runtime's recipe from
    `recipes_src` (default: the project's), the stand-ins, and any `extra` recipes (mappings).

    Recipes of an earlier call that `extra` no longer names stay unless overwritten; returns
    (recipes, artifacts)."""
    import yaml

    recipes = root / "recipes"
    artifacts = root / "artifacts"
    recipes.mkdir(parents=True, exist_ok=True)
    shutil.copy((recipes_src or recipes_dir()) / f"{RUNTIME}.yaml", recipes)
    files = sorted(p.name for p in Path(store_dir).iterdir() if p.is_file())
    # As the real ones: the runtime's run step waits for the store's artifacts-path and the
    # installer's platform.json.
    store = _recipe(STORE, {"install": "printf '%s\\n' '{artifacts:path}' > '{work:path}/artifacts-path'"})
    store["Manifests"][0]["Artifacts"] = [{"URI": f"s3://bucket/{STORE}/{VERSION}/{f}"} for f in files]
    installer = _recipe(
        INSTALLER,
        {
            "install": f"mkdir -p {{work:path}} && ln -sfn {sys.prefix} {{work:path}}/venv"
            " && : > '{work:path}/platform.json'"
        },
    )
    for doc in [store, installer, client_recipe(), *extra]:
        (recipes / f"{doc['ComponentName']}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    dest = artifacts / STORE / VERSION
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.is_symlink():
        dest.unlink()
    elif dest.exists():
        shutil.rmtree(dest)
    dest.symlink_to(Path(store_dir).resolve(), target_is_directory=True)
    return recipes, artifacts


def wait_ready(sim: Any, timeout: float = 120.0) -> None:
    """Until the runtime reported RUNNING itself (UpdateState after its warm-up). The nucleus calls a
    Run component RUNNING as soon as its process starts, so that state says too little."""
    sim.wait_for_report(RUNTIME, "RUNNING", timeout=timeout)
