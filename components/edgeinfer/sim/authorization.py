"""Authorization: the components' `accessControl` policies, ValidateAuthorizationToken and
PutComponentMetric (the classic nucleus's `AuthorizationHandler`, `AuthorizationIPCAgent` and
`ComponentMetricIPCEventStreamAgent`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from awsiot.greengrasscoreipc import model

from edgeinfer.greengrass.recipe import cget
from edgeinfer.sim import ipc_server as ipc
from edgeinfer.transport.base import topic_matches

if TYPE_CHECKING:
    from edgeinfer.sim.core import Nucleus

COMPONENT_METRIC = "aws.greengrass.ipc.componentmetric"
# ValidateAuthorizationToken: the nucleus answers it for this component only.
STREAM_MANAGER = "aws.greengrass.StreamManager"


def resource_matches(pattern: str, resource: str, thing: str) -> bool:
    pattern = pattern.replace("{iot:thingName}", thing)
    if pattern in ("*", resource):
        return True
    if "*" in pattern:
        regex = ".*".join(re.escape(p) for p in pattern.split("*"))
        if re.fullmatch(regex, resource, flags=re.DOTALL):
            return True
    if "+" in pattern or "#" in pattern:
        return topic_matches(pattern, resource)
    return False


class Authorization:
    def __init__(self, nucleus: Nucleus) -> None:
        self.nucleus = nucleus
        self._cache: dict[tuple[str, str, str, str], bool] = {}
        self.metrics: list[tuple[str, str, str, float]] = []  # (component, name, unit, value)

    def handlers(self) -> dict[str, Callable[..., Any]]:
        return {
            "aws.greengrass#ValidateAuthorizationToken": self._validate_token,
            "aws.greengrass#PutComponentMetric": self._put_metric,
        }

    def forget(self) -> None:
        """Policies may have changed with a configuration: decide again."""
        self._cache.clear()

    def allowed(self, component: str, service: str, operation: str, resource: str) -> bool:
        key = (component, service, operation, resource)
        ok = self._cache.get(key)
        if ok is None:
            ok = False
            comp = self.nucleus.components.get(component)
            policies = cget(cget(comp.config if comp else {}, "accessControl", {}), service, {}) or {}
            for policy in policies.values() if isinstance(policies, dict) else []:
                ops = cget(policy, "operations", []) or []
                resources = cget(policy, "resources", []) or []
                if ("*" in ops or operation in ops) and any(
                    resource_matches(str(r), resource, self.nucleus.options.thing) for r in resources
                ):
                    ok = True
                    break
            self._cache[key] = ok
        return ok

    def authorize(self, component: str, service: str, operation: str, resource: str) -> None:
        if not self.allowed(component, service, operation, resource):
            raise ipc.unauthorized(
                f"Principal {component} is not authorized to perform "
                f"{service}:{operation} on resource {resource}"
            )

    async def _validate_token(self, conn: ipc.Connection, req: Any, stream: ipc.Stream) -> Any:
        operation = "aws.greengrass#ValidateAuthorizationToken"
        if conn.component != STREAM_MANAGER:
            raise ipc.unauthorized(f"{conn.component} is not authorized to perform {operation}")
        if self.nucleus.component_for_token(req.token) is None:
            raise ipc.ModeledError(model.InvalidTokenError(message="Invalid token used by stream manager"))
        return model.ValidateAuthorizationTokenResponse(is_valid=True)

    async def _put_metric(self, conn: ipc.Connection, req: Any, stream: ipc.Stream) -> Any:
        operation = "aws.greengrass#PutComponentMetric"
        assert conn.component is not None
        # Only AWS-provided components may put metrics, and only with a policy that says so.
        if not (
            self.allowed(conn.component, COMPONENT_METRIC, operation, "*")
            and conn.component.startswith("aws.")
        ):
            raise ipc.unauthorized(
                f"Principal {conn.component} is not authorized to perform {COMPONENT_METRIC}:{operation} "
            )
        metrics = list(req.metrics or [])
        if not metrics:
            raise ipc.invalid("Null or Empty list of metrics found in PutComponentMetricRequest")
        for metric in metrics:
            name = metric.name or ""
            if not name or len(name.encode()) > 32 or not metric.unit or (metric.value or 0) < 0:
                raise ipc.invalid("Invalid argument found in PutComponentMetricRequest")
        for metric in metrics:
            self.metrics.append((conn.component, metric.name, str(metric.unit), float(metric.value or 0)))
        return model.PutComponentMetricResponse()
