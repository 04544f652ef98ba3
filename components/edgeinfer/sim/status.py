"""`status.json` in the core's root: what `edgeinfer sim status | logs | down` and `up --wait` read."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgeinfer.sim.simulator import Simulator


def status_document(
    sim: Simulator, states: dict[str, str], reported: dict[str, str], versions: dict[str, str]
) -> dict[str, Any]:
    """What `status.json` says: `edgeinfer sim status | logs | down` and `--wait` read it."""
    deployment = sim.deployment()
    return {
        "pid": os.getpid(),
        "running": sim.started,
        "thing": sim.thing,
        "nucleus": sim.nucleus.name,
        "broker": f"{sim.broker[0]}:{sim.broker[1]}",
        "socket": sim.socket_path,
        "root": str(sim.root),
        # IoT Core messages over the nucleus's Maximum Packet Size, never delivered (nucleus lite)
        "iot_dropped_oversize": sim.dropped_iot_messages(),
        "deployment": {"status": deployment.status, "reason": deployment.reason},
        "components": {
            n: {
                "state": s,
                # The component's own UpdateState (None until it reports): a Run component is
                # RUNNING once its process starts, ready only when it says so.
                "reported": reported.get(n),
                "version": versions.get(n, ""),
                "log": str(sim.root / "logs" / f"{n}.log"),
            }
            for n, s in states.items()
        },
    }
