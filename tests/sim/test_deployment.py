"""The deployment's status as each nucleus reports it, from its components' states."""

from __future__ import annotations

from edgeinfer.sim.deployment import DeploymentStatus, deployment_status

UNITS = {"a": True, "store": False}


def test_classic_succeeds_once_all_are_running_or_finished() -> None:
    assert deployment_status({"a": "RUNNING", "store": "INSTALLED"}, UNITS, 0, None).status == "IN_PROGRESS"
    assert deployment_status({"a": "RUNNING", "store": "FINISHED"}, UNITS, 999, None) == DeploymentStatus(
        "SUCCEEDED"
    )


def test_lite_fails_after_the_wait_for_a_component_without_a_run_unit() -> None:
    done = {"a": "RUNNING", "store": "FINISHED"}
    waiting = deployment_status(done, UNITS, 299.9, 300.0)
    assert waiting.status == "IN_PROGRESS"
    failed = deployment_status(done, UNITS, 300.0, 300.0)
    assert failed.status == "FAILED"
    assert "ggl.store.service" in failed.reason
    assert deployment_status(done, {"a": True, "store": True}, 0, 300.0).status == "SUCCEEDED"


def test_a_broken_component_fails_it_on_both() -> None:
    for wait in (None, 300.0):
        status = deployment_status({"a": "BROKEN", "store": "FINISHED"}, UNITS, 0, wait)
        assert status == DeploymentStatus("FAILED", "a BROKEN")
