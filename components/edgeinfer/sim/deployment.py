"""What the simulated core reports of its deployment: IN_PROGRESS, SUCCEEDED or FAILED, and why.

Both nuclei report a deployment FAILED when a component goes BROKEN, and SUCCEEDED once every
component is RUNNING or FINISHED. Nucleus lite waits for every component's run unit
(`ggl.<name>.service`) to be RUNNING or FINISHED: a component with no run or startup step has none,
so the deployment reports FAILED once the wait (`NucleusProfile.run_unit_wait_s`, 300 s; shorter in
tests) is over, while the components keep running.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = ["DeploymentStatus", "deployment_status"]

_DONE = frozenset({"RUNNING", "FINISHED"})


@dataclass(frozen=True)
class DeploymentStatus:
    status: Literal["IN_PROGRESS", "SUCCEEDED", "FAILED"]
    reason: str = ""


def deployment_status(
    states: Mapping[str, str],
    has_run_unit: Mapping[str, bool],
    elapsed_s: float,
    run_unit_wait_s: float | None,
) -> DeploymentStatus:
    """The deployment's status from its components' states, `elapsed_s` after it began.
    `run_unit_wait_s` None: a component without a run unit is done once FINISHED (classic)."""
    broken = sorted(n for n, s in states.items() if s == "BROKEN")
    if broken:
        return DeploymentStatus("FAILED", f"{', '.join(broken)} BROKEN")
    unitless = sorted(n for n in states if not has_run_unit.get(n, True))
    if run_unit_wait_s is not None and unitless:
        if elapsed_s >= run_unit_wait_s:
            units = ", ".join(f"ggl.{n}.service" for n in unitless)
            return DeploymentStatus(
                "FAILED", f"no run unit after {run_unit_wait_s:g} s: {units} (no run or startup step)"
            )
        return DeploymentStatus("IN_PROGRESS", f"waiting for the run units of {', '.join(unitless)}")
    waiting = sorted(n for n, s in states.items() if s not in _DONE)
    if waiting:
        return DeploymentStatus("IN_PROGRESS", f"waiting for {', '.join(waiting)}")
    return DeploymentStatus("SUCCEEDED")
