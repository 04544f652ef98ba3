"""`edgeinfer demo`: the whole device on a simulated Greengrass core, driven as a user would.

Builds the bundle (`edgeinfer build`), deploys it on the simulated core with the project's own
virtual environment standing in for the installer's (so nothing is downloaded), waits for the
runtime to report RUNNING, then sends the bundled sample photos as requests over local pub/sub and
over "IoT Core" (the simulator's mosquitto), sends a concurrent burst to show dynamic batching, and
prints the results, the latencies and one telemetry window. When the detector store is built
(`edgeinfer model build --task detection`), the runtime's modelDir is then pointed at it, live, and
Darknet's test photos (or the samples) are sent for boxes.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeinfer.errors import EdgeinferError

if TYPE_CHECKING:
    from edgeinfer.sim.broker import Inbox

log = logging.getLogger(__name__)

RUNTIME = "com.edgeinfer.InferenceRuntime"
TELEMETRY = "com.edgeinfer.Telemetry"
INSTALLER = "com.edgeinfer.RuntimeInstaller"


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "demo",
        help="run the bundle on a simulated Greengrass core and classify the sample photos",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--project", type=Path, default=Path.cwd(), help="project root (default: .)")
    parser.add_argument("--thing", default="edgeinfer-demo", help="the simulated core's thing name")
    parser.add_argument("--burst", type=int, default=48, help="requests in the concurrent burst")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for RUNNING")
    parser.set_defaults(func=run)


def _project_root(path: Path) -> Path:
    root = path.resolve()
    if not (root / "recipes").is_dir():
        raise EdgeinferError(f"{root} has no recipes/ folder: run the demo from the project root")
    return root


def _request(rid: str, image: Path) -> bytes:
    from edgeinfer.messages import Request

    return Request(rid, image=image.read_bytes()).to_json()


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from edgeinfer.bundle.build import build_bundle
    from edgeinfer.messages import Result, infer_topic, result_topic, telemetry_topic
    from edgeinfer.model.samples import sample_images
    from edgeinfer.sim import Simulator

    console = Console(stderr=False)
    root = _project_root(args.project)
    with console.status("building the bundle (edgeinfer build)…"):
        bundle = build_bundle(root)
    console.print(f"[bold]bundle[/] {bundle.recipes_dir} + {bundle.artifacts_dir}")

    thing = args.thing
    config = {
        INSTALLER: {"existingVenv": sys.prefix},
        TELEMETRY: {"windowSeconds": 2},
    }
    t0 = time.monotonic()
    with Simulator(bundle.recipes_dir, bundle.artifacts_dir, thing=thing, config_merge=config) as sim:
        with console.status("starting the simulated core…"):
            # Warm-up done: the runtime reports RUNNING itself once every batch size ran.
            sim.wait_for_report(RUNTIME, "RUNNING", timeout=args.timeout)
        console.print(f"[bold]{RUNTIME}[/] RUNNING {time.monotonic() - t0:.1f} s after `sim up`")
        cloud = sim.cloud_client()
        local = sim.local_client()
        iot_results = cloud.subscribe(result_topic(thing))
        local_results = local.subscribe(result_topic(thing))
        telemetry = cloud.subscribe(telemetry_topic(thing))

        images = sample_images()
        table = Table(title=f"sample photos on {thing}")
        for col in ("image", "via", "top-1", "score", "next", "total ms", "infer ms"):
            table.add_column(col, overflow="ellipsis", no_wrap=col != "next")
        ran_on = ""
        for i, image in enumerate(images):
            via = "iot" if i % 2 else "local"
            rid = f"{via}-{image.stem}"
            if via == "iot":
                cloud.publish(infer_topic(thing), _request(rid, image), qos=1)
                message = iot_results.wait_for(len(iot_results) + 1, timeout=30)[-1]
            else:
                local.publish(infer_topic(thing), _request(rid, image))
                message = local_results.wait_for(len(local_results) + 1, timeout=30)[-1]
            result = Result.parse(message.payload)
            if result.status != "ok" or not result.predictions:
                code = result.error.code.value if result.error else "?"
                table.add_row(image.name, via, f"[red]{code}[/]", "", "", "", "")
                continue
            if result.model is not None:
                ran_on = f"{result.model.name} {result.model.variant} on {result.provider}"
            top = result.predictions[0]
            table.add_row(
                image.stem,
                via,
                top.label.split(",")[0],
                f"{top.score:.2f}",
                ", ".join(p.label.split(",")[0] for p in result.predictions[1:3]),
                f"{result.latency_ms.total:.1f}",
                f"{result.latency_ms.inference:.1f}",
            )
        table.caption = ran_on
        console.print(table)

        # A burst of concurrent requests: the dynamic batcher groups them.
        before = len(local_results)
        for n in range(args.burst):
            local.publish(infer_topic(thing), _request(f"burst-{n}", images[n % len(images)]))
        burst = [Result.parse(m.payload) for m in local_results.wait_for(before + args.burst, 60)[before:]]
        ok = [r for r in burst if r.status == "ok"]
        if ok:
            sizes = [r.batch_size for r in ok]
            console.print(
                f"[bold]burst[/] {len(burst)} requests: {len(ok)} ok, mean batch "
                f"{statistics.fmean(sizes):.1f}, max batch {max(sizes)}, "
                f"total p50 {statistics.median(r.latency_ms.total for r in ok):.1f} ms"
            )

        window = _first_busy_window(telemetry, timeout=15)
        if window is None:
            console.print("[yellow]no telemetry window with requests arrived within 15 s[/]")
        else:
            total = window.get("latency_ms", {}).get("total", {})
            console.print(
                f"[bold]telemetry[/] seq {window.get('seq')}: {window.get('count')} requests in "
                f"{window.get('window_s')} s, total p50 {total.get('p50')} ms, p99 {total.get('p99')} ms, "
                f"mean batch {window.get('batch', {}).get('mean_size')}"
            )
        _detection(console, sim, thing, local, local_results, samples=images)
        console.print("states: " + ", ".join(f"{k}={v}" for k, v in sorted(sim.states().items())))
    return 0


def _detection(
    console: Any, sim: Any, thing: str, local: Any, results: Inbox, *, samples: list[Path]
) -> None:
    """The same runtime, its modelDir set live to the detector store: the engine swaps, photos go in,
    boxes come out."""
    from rich.table import Table

    from edgeinfer.messages import Result, infer_topic
    from edgeinfer.model.build import BuildOptions
    from edgeinfer.model.images import DARKNET_DATA
    from edgeinfer.model.manifest import Manifest, ManifestError

    store = BuildOptions(task="detection").output_dir().resolve()
    try:
        Manifest.load(store)
    except ManifestError:
        console.print(f"[yellow]no detector store at {store}: `edgeinfer model build --task detection`[/]")
        return
    photos = sorted(DARKNET_DATA.glob("*.jpg")) or samples
    with console.status("pointing the runtime's modelDir at the detector (a live engine swap)…"):
        sim.update_configuration(RUNTIME, merge={"modelDir": str(store)})
        deadline = time.monotonic() + 120
        while True:  # the old engine answers until the new one is warm
            before = len(results)
            local.publish(infer_topic(thing), _request("swap-probe", photos[0]))
            result = Result.parse(results.wait_for(before + 1, timeout=30)[-1].payload)
            if result.detections is not None or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    table = Table(title=f"detections on {thing} (boxes in each photo's pixels)")
    for col in ("image", "objects", "total ms", "infer ms"):
        table.add_column(col, overflow="fold")
    ran_on = ""
    for image in photos:
        before = len(results)
        local.publish(infer_topic(thing), _request(f"detect-{image.stem}", image))
        result = Result.parse(results.wait_for(before + 1, timeout=30)[-1].payload)
        if result.status != "ok" or result.detections is None:
            code = result.error.code.value if result.error else "not a detector"
            table.add_row(image.name, f"[red]{code}[/]", "", "")
            continue
        if result.model is not None:
            ran_on = f"{result.model.name} {result.model.variant} on {result.provider}"
        objects = ", ".join(
            f"{d.label} {d.score:.2f} [{b.x_min:.0f},{b.y_min:.0f},{b.x_max:.0f},{b.y_max:.0f}]"
            for d in result.detections[:6]
            for b in (d.box,)
        )
        table.add_row(
            image.stem,
            objects or "-",
            f"{result.latency_ms.total:.1f}",
            f"{result.latency_ms.inference:.1f}",
        )
    table.caption = ran_on
    console.print(table)


def _first_busy_window(inbox: Inbox, timeout: float) -> dict[str, Any] | None:
    """The first telemetry window that counted requests: the telemetry component's windows run from
    its own start, so the first one may have closed before the runtime answered anything."""
    deadline = time.monotonic() + timeout
    seen = 0
    while time.monotonic() < deadline:
        try:
            messages = inbox.wait_for(seen + 1, timeout=max(0.1, deadline - time.monotonic()))
        except TimeoutError:
            return None
        for message in messages[seen:]:
            doc = json.loads(message.payload)
            if isinstance(doc, dict) and doc.get("count"):
                return doc
        seen = len(messages)
    return None
