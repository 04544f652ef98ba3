"""Capture end to end on the simulated core (the nucleus `--sim-nucleus` names), with moto's S3 server.

The runtime reads its credentials from the simulator's token exchange service (its recipe's SOFT
dependency: the nucleus sets the container-credentials variables) and uploads to moto through the
`endpoint` setting, as a factory's MinIO would be reached. Telemetry runs beside it, so capture's
counters are checked where a user reads them: in the windows on IoT Core. The bucket is versioned:
a retried upload shows as a second version of the same key, a duplicate as a second key.

Every wait polls the effect (S3 listings, the spool's folder, the windows) with a bound.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import shutil
import signal
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from edgeinfer import procfs
from edgeinfer.messages import Result, TelemetryWindow
from edgeinfer.sim import Simulator
from edgeinfer.sim.pytest_plugin import SimulatorFactory
from edgeinfer.sim.testing import RUNTIME, prepare_device, recipes_dir, wait_ready
from tests.helpers.images import solid_jpeg, solid_png
from tests.helpers.s3 import MotoS3, running_s3
from tests.helpers.wait import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.devtool]  # moto's S3 server

TELEMETRY = "com.edgeinfer.Telemetry"
BUCKET = "edgeinfer-capture-e2e"
PREFIX = "field"
WINDOW_S = 2.0
SURE = solid_jpeg((250, 0, 0))  # the tiny model's "red", top-1 score 1.0
UNSURE = solid_png((128, 128, 0))  # red and green alike: top-1 score 0.5, and a PNG (re-encoded)
BAND = {"kind": "confidence", "low": 0.3, "high": 0.7}


@pytest.fixture
def s3() -> Iterator[MotoS3]:
    with running_s3(BUCKET, versioned=True) as server:
        yield server


Device = tuple[Simulator, str, Path]  # the core, its thing, the spool's folder


@pytest.fixture
def start_device(
    simulator: SimulatorFactory,
    sim_nucleus: str,
    s3: MotoS3,
    tmp_path: Path,
    write_tiny_store: Callable[[Path], Path],
) -> Callable[..., Device]:
    """A core running the runtime (tiny model) with `capture` merged in, and telemetry."""

    def start(name: str, samplers: list[dict[str, Any]], **capture: Any) -> Device:
        thing = f"cap-{name}-{sim_nucleus}"
        spool = tmp_path / "spool"
        recipes, artifacts = prepare_device(tmp_path / "device", write_tiny_store(tmp_path / "store"))
        shutil.copy(recipes_dir() / f"{TELEMETRY}.yaml", recipes)
        node = {
            "enabled": True,
            "bucket": BUCKET,
            "prefix": PREFIX,
            "endpoint": s3.endpoint,
            "spoolDir": str(spool),
            "models": {"*": {"samplers": samplers}},
            **capture,
        }
        sim = simulator(
            recipes,
            artifacts,
            thing=thing,
            config_merge={
                RUNTIME: {"maxBatchSize": 4, "maxQueueDelayUs": 2000, "capture": node},
                TELEMETRY: {"windowSeconds": WINDOW_S},
            },
        )
        wait_ready(sim, timeout=180)
        sim.wait_for_state(TELEMETRY, "RUNNING", timeout=60)
        return sim, thing, spool

    return start


class Requests:
    """A client on local pub/sub: requests out, their results back by id."""

    def __init__(self, sim: Simulator, thing: str) -> None:
        self.thing = thing
        self.local = sim.local_client()
        self.inbox = self.local.subscribe(f"edgeinfer/{thing}/result")

    def send(self, images: list[tuple[str, bytes]]) -> dict[str, Result]:
        """Each image as a request; their results by id, once each came."""
        for rid, image in images:
            doc = {"id": rid, "image": base64.b64encode(image).decode()}
            self.local.publish(f"edgeinfer/{self.thing}/infer", doc)
        wanted = {rid for rid, _ in images}
        eventually(lambda: wanted <= set(self.results()), 120, f"the results of {len(wanted)} requests")
        return {rid: r for rid, r in self.results().items() if rid in wanted}

    def results(self) -> dict[str, Result]:
        return {r.id or "": r for r in (Result.parse(m.payload) for m in self.inbox.messages)}


def records(s3: MotoS3) -> dict[str, dict[str, Any]]:
    """The whole records in the bucket (a `.json` is uploaded last), by request id."""
    out: dict[str, dict[str, Any]] = {}
    for key, body in s3.objects(BUCKET).items():
        if key.endswith(".json"):
            doc = json.loads(body)
            assert doc["request"]["id"] not in out, f"request {doc['request']['id']} captured twice"
            out[doc["request"]["id"]] = doc
    return out


def in_spool(folder: Path, request_id: str) -> bool:
    return any(folder.glob(f"*-{request_id}-*.json"))


def spooled(folder: Path) -> int:
    return len(list(folder.glob("*.json"))) - (folder / "state.json").exists()


class Windows:
    """Telemetry's windows from IoT Core, capture's counters summed over them."""

    def __init__(self, sim: Simulator, thing: str) -> None:
        self.inbox = sim.cloud_client().subscribe(f"edgeinfer/{thing}/telemetry")

    def capture(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for m in self.inbox.messages:
            for event, n in TelemetryWindow.from_dict(json.loads(m.payload)).capture.items():
                total[event] = total.get(event, 0) + n
        return total


def runtime_pids() -> list[int]:
    """This test's runtime processes: descendants of this process running `edgeinfer.runtime`
    (other test runs on the machine have their own)."""
    found, todo = [], [os.getpid()]
    while todo:
        for child in procfs.children(todo.pop()):
            todo.append(child)
            if any(b"edgeinfer.runtime" in part for part in procfs.cmdline(child) or []):
                found.append(child)
    return found


def test_chosen_records_arrive_once_with_their_keys_image_and_result(
    start_device: Callable[..., Device], s3: MotoS3
) -> None:
    sim, thing, _ = start_device("stream", [BAND, {"kind": "random", "share": 0.1}])
    windows = Windows(sim, thing)
    images = [(f"r{i}", UNSURE if i % 3 == 0 else SURE) for i in range(60)]
    results = Requests(sim, thing).send(images)
    band = {rid for rid, r in results.items() if 0.3 <= r.predictions[0].score <= 0.7}  # type: ignore[index]
    assert band == {rid for rid, image in images if image is UNSURE}  # the stream holds both kinds
    eventually(lambda: band <= set(records(s3)), 120, "every answer in the band in S3")
    eventually(
        lambda: windows.capture().get("uploaded", 0) == len(records(s3)) == windows.capture().get("chosen"),
        60,
        "the windows counting every record chosen and uploaded",
        lambda: f"{windows.capture()} for {len(records(s3))} records",
    )
    got = records(s3)
    keys = s3.keys(BUCKET)
    assert len(keys) == 2 * len(got)  # an image and a document each, nothing else
    assert all(n == 1 for n in s3.versions(BUCKET).values())  # each written once
    assert windows.capture()["spooled"] == len(got)
    sent = dict(images)
    for rid, doc in got.items():
        result = results[rid]
        assert result.model is not None
        day = dt.datetime.fromisoformat(doc["captured_at"].replace("Z", "+00:00"))
        key = f"{PREFIX}/{thing}/{result.model.name}/{result.model.version}/{day:%Y/%m/%d}/{doc['id']}"
        assert doc["key"] == key
        assert {f"{key}.jpg", f"{key}.json"} <= set(keys)
        assert doc["reason"] == ("confidence" if rid in band else "random")
        assert doc["thing"] == thing
        assert doc["model"]["version"] == result.model.version
        assert doc["result"]["predictions"] == [p.to_dict() for p in result.predictions or []]
        image = s3.objects(BUCKET, f"{key}.jpg")[f"{key}.jpg"]
        if sent[rid] is SURE:
            assert image == SURE  # a JPEG goes as sent
        else:
            assert image.startswith(b"\xff\xd8\xff")  # a PNG is re-encoded as a JPEG


def test_s3_unreachable_the_spool_holds_everything_then_all_arrive_once(
    start_device: Callable[..., Device], s3: MotoS3
) -> None:
    sim, thing, spool = start_device("outage", [{"kind": "random", "share": 1.0}], spoolMaxMb=1)
    windows = Windows(sim, thing)
    n = 12
    with s3.outage():
        Requests(sim, thing).send([(f"o{i}", SURE) for i in range(n)])
        eventually(lambda: spooled(spool) == n, 60, "every chosen record in the spool")
        eventually(lambda: windows.capture().get("upload_failures", 0) >= 1, 60, "a failed upload counted")
        assert sum(p.stat().st_size for p in spool.iterdir()) <= 1024 * 1024  # within its cap
        assert windows.capture().get("dropped_size", 0) == 0
    eventually(lambda: len(records(s3)) == n, 180, "every record uploaded after the outage")
    eventually(lambda: spooled(spool) == 0, 60, "the spool emptied")
    assert set(records(s3)) == {f"o{i}" for i in range(n)}
    assert len(s3.keys(BUCKET)) == 2 * n
    assert all(count == 1 for count in s3.versions(BUCKET).values())  # a failed try stored nothing


def test_runtime_killed_mid_upload_and_restarted_nothing_lost_nothing_twice(
    start_device: Callable[..., Device], s3: MotoS3
) -> None:
    # A slow uplink: each record's document waits seconds for its pacing, after its image is stored.
    sim, thing, spool = start_device("kill", [{"kind": "random", "share": 1.0}], uploadBytesPerS=150)
    n = 3
    Requests(sim, thing).send([(f"k{i}", SURE) for i in range(n)])
    eventually(lambda: spooled(spool) + len(records(s3)) >= n, 60, "every chosen record spooled")

    def half_sent() -> list[str]:
        keys = s3.keys(BUCKET)
        return [k for k in keys if k.endswith(".jpg") and k.removesuffix(".jpg") + ".json" not in keys]

    eventually(lambda: bool(half_sent()), 120, "a record whose image is stored and document is not")
    pids = runtime_pids()
    assert pids
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    # What the kill cut short: the record seen half sent, unless its document landed in the moment
    # between the look and the kill (then nothing was cut, and the checks below hold all the same).
    cut = half_sent()
    eventually(lambda: len(records(s3)) == n, 240, "every record uploaded after the restart")
    assert set(records(s3)) == {f"k{i}" for i in range(n)}
    assert len(s3.keys(BUCKET)) == 2 * n  # nothing duplicated: the retry wrote the same keys
    versions = s3.versions(BUCKET)
    assert all(versions[key] == 2 for key in cut)  # a half-sent image written again, over itself
    # at most the one record in flight at the kill sent again (both its files), always to its own keys
    assert 2 * n <= sum(versions.values()) <= 2 * n + 2
    assert not set(pids) & set(runtime_pids())  # a new runtime did it
    eventually(lambda: spooled(spool) == 0, 60, "the spool emptied")


def test_disk_cap_reached_the_oldest_are_dropped_and_counted(
    start_device: Callable[..., Device], s3: MotoS3
) -> None:
    cap_mb = 0.01  # a few records' worth
    sim, thing, spool = start_device("cap", [{"kind": "random", "share": 1.0}], spoolMaxMb=cap_mb)
    windows = Windows(sim, thing)
    n = 30
    requests = Requests(sim, thing)
    with s3.outage():
        for i in range(n):  # each once the one before is spooled: the spool's order is the requests'
            requests.send([(f"c{i:02d}", SURE)])
            eventually(partial(in_spool, spool, f"c{i:02d}"), 60, f"c{i:02d} spooled")
        eventually(lambda: windows.capture().get("spooled", 0) == n, 60, "every chosen record spooled")
        eventually(lambda: windows.capture().get("dropped_size", 0) >= 1, 60, "the drops counted")
        kept = spooled(spool)
        assert 0 < kept < n
        size = sum(p.stat().st_size for p in spool.iterdir() if p.name != "state.json")
        assert size <= cap_mb * 1024 * 1024
        eventually(
            lambda: windows.capture().get("dropped_size", 0) == n - spooled(spool),
            60,
            "every dropped record counted in telemetry",
        )
    eventually(lambda: len(records(s3)) == kept, 180, "the kept records uploaded")
    assert set(records(s3)) == {f"c{i:02d}" for i in range(n - kept, n)}  # the newest kept, the oldest gone
