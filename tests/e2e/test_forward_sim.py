"""Store and forward on the simulated core: a source's results published to IoT Core during an outage
arrive after it, in order, none lost — on the nucleus `--sim-nucleus` names.

The runtime (the tiny model, a folder source at a few frames a second with `publishToIot`) and the
telemetry component run on the simulated core; the results are read from the broker as a cloud
application would. Nucleus lite refuses a publish while IoT Core is away, so the runtime's outbox
keeps them all. The classic nucleus takes QoS 1 publishes into its in-memory spooler until that is
full; here its spooler is a few results small (`mqtt.spooler.maxSizeInBytes`), so it refuses the rest
and the outbox keeps those, behind the ones the nucleus holds. The runtime restarts during the outage:
what its outbox keeps survives it.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from edgeinfer.greengrass import nuclei
from edgeinfer.messages import Result, TelemetryWindow
from edgeinfer.sim.testing import RUNTIME, prepare_device, recipes_dir, wait_ready
from tests.helpers.images import solid_jpeg
from tests.helpers.wait import eventually

pytestmark = pytest.mark.e2e

TELEMETRY = "com.edgeinfer.Telemetry"
THING = "fwd-e2e"
RESULT = f"edgeinfer/{THING}/result"
SMALL_SPOOLER = 16_000  # bytes: some results (and a telemetry window fits), then the nucleus refuses


def frame_seq(result: Result) -> int:
    """A source's frame id is `<source>-<n>`, n counting from 1 at each start of the runtime."""
    name, _, n = (result.id or "").rpartition("-")
    assert name == "folder", result.id
    return int(n)


def runs(seqs: list[int]) -> list[list[int]]:
    """The arrivals split where the count starts again (a restart of the runtime)."""
    out: list[list[int]] = []
    for n in seqs:
        if not out or (n <= out[-1][-1] and n == 1):
            out.append([n])
        else:
            out[-1].append(n)
    return out


def kept(outbox: Path) -> int:
    return len(list(outbox.glob("*.msg"))) if outbox.is_dir() else 0


def test_results_published_during_an_outage_arrive_after_it_in_order(
    simulator: Any, sim_nucleus: str, tmp_path: Path, write_tiny_store: Callable[[Path], Path]
) -> None:
    images = tmp_path / "images"
    images.mkdir()
    for i, rgb in enumerate([(200, 30, 30), (30, 200, 30), (30, 30, 200)]):
        (images / f"{i}.jpg").write_bytes(solid_jpeg(rgb))
    recipes, artifacts = prepare_device(tmp_path / "device", write_tiny_store(tmp_path / "store"))
    shutil.copy(recipes_dir() / f"{TELEMETRY}.yaml", recipes)
    profile = nuclei.profile(sim_nucleus)
    if profile.spooler_bytes is not None:
        profile = dataclasses.replace(profile, spooler_bytes=SMALL_SPOOLER)
    source = {"kind": "folder", "uri": str(images), "rateHz": 5.0, "loop": True, "publishToIot": True}
    sim = simulator(
        recipes,
        artifacts,
        thing=THING,
        nucleus=profile,
        config_merge={RUNTIME: {"source": source}, TELEMETRY: {"windowSeconds": 1}},
    )
    cloud = sim.cloud_client()
    inbox = cloud.subscribe(RESULT)
    windows = cloud.subscribe(f"edgeinfer/{THING}/telemetry")
    wait_ready(sim, timeout=180)
    outbox = sim.root / "work" / RUNTIME / "outbox"
    inbox.wait_for(3, timeout=60)  # results flow before the outage

    with sim.iot_outage():
        eventually(lambda: kept(outbox) >= 5, 90, "results kept in the runtime's outbox")
        sim.restart(RUNTIME)
        wait_ready(sim, timeout=180)
        before = kept(outbox)
        eventually(lambda: kept(outbox) >= before + 5, 90, "the restarted runtime keeping results too")
        during = len(inbox)
        at_end = kept(outbox)

    def drained() -> bool:
        got = [frame_seq(Result.parse(m.payload)) for m in inbox.messages]
        return kept(outbox) == 0 and len(runs(got)) == 2 and len(got) >= during + at_end

    eventually(drained, 120, "every kept result sent after the outage")
    arrived = [frame_seq(Result.parse(m.payload)) for m in inbox.messages]
    seen: list[int] = []
    duplicates = 0
    for n in arrived:  # QoS 1: a repeat of the one just before is what it allows
        if seen and n == seen[-1]:
            duplicates += 1
        else:
            seen.append(n)
    first, second = runs(seen)
    assert first == list(range(first[0], first[0] + len(first)))  # in order, none lost
    assert second == list(range(1, len(second) + 1))  # after the restart, from the start, none lost
    assert len(first) + len(second) >= during + at_end

    def counted() -> dict[str, int]:
        docs = [TelemetryWindow.from_dict(json.loads(m.payload)) for m in windows.messages]
        latest = [w.system["forward"] for w in docs if isinstance(w.system.get("forward"), dict)]
        return dict(latest[-1]) if latest else {}

    def settled() -> bool:
        now = counted()
        return now.get("pending") == 0 and now.get("spooled", 0) >= at_end and now["sent"] == now["spooled"]

    # The restarted runtime's outbox counts what it kept and sent (its counts survive the restart).
    eventually(settled, 120, "the outbox's counters in telemetry", lambda: str(counted()))
    forward = counted()
    assert forward["dropped"] == 0
    print(
        f"{profile.name}: {len(first)} + {len(second)} results in order, {duplicates} repeated; "
        f"outbox {forward}; before the restart {before} kept"
    )
