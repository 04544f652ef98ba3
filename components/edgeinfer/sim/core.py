"""The nucleus of the simulated core: `Nucleus` wires its services on one asyncio loop.

Services, each in its module: `lifecycle` (processes, states, UpdateState, Pause/Resume),
`pubsub` (local publish/subscribe), `mqttproxy` over `iot_bridge` (IoT Core), `configuration`
(config store and validation), `authorization` (accessControl, ValidateAuthorizationToken,
PutComponentMetric), `component_updates` (the update policy's defer protocol); `artifacts` lays out
packages/ and work/, `users` decides who components run as. The IPC wire is in `ipc_server`; the
recipe model in `edgeinfer.greengrass.recipe`; what each nucleus does differently in its
`edgeinfer.greengrass.nuclei.NucleusProfile`. `edgeinfer.sim.Simulator` is the thread-safe front.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import re
import secrets
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeinfer.greengrass import nuclei
from edgeinfer.greengrass.nuclei import CLASSIC, NucleusProfile
from edgeinfer.greengrass.recipe import Recipe, VarContext, cget, interpolate, lifecycle_strings
from edgeinfer.sim import ipc_server as ipc
from edgeinfer.sim import tes, users
from edgeinfer.sim.artifacts import Layout
from edgeinfer.sim.authorization import Authorization
from edgeinfer.sim.component_updates import ComponentUpdates, Deferral
from edgeinfer.sim.configuration import ConfigStore
from edgeinfer.sim.iot_bridge import IotBridge
from edgeinfer.sim.lifecycle import BROKEN, FINISHED, RUNNING, Component, Lifecycle
from edgeinfer.sim.mqttproxy import MqttProxy
from edgeinfer.sim.pubsub import LocalPubSub
from edgeinfer.sim.tes import CredentialSource, TokenExchangeServer
from edgeinfer.transport.base import Message

__all__ = ["BROKEN", "FINISHED", "GGC_VERSION", "RUNNING", "Component", "Deferral", "Nucleus", "Options"]

log = logging.getLogger(__name__)

GGC_VERSION = "2.14.0"


@dataclass
class Options:
    thing: str
    region: str
    root: Path
    socket_path: str
    restart_delay: float = 0.5
    max_errors: int = 3
    stop_timeout: float = 5.0
    validation_timeout: float = 10.0
    env: dict[str, str] = field(default_factory=dict)
    nucleus: NucleusProfile = CLASSIC
    component_user: str | None = None  # "user[:group]"; None: the nucleus's default when run as root
    tes_credentials: CredentialSource | None = None  # the token exchange service's (None: test keys)


class Nucleus:
    """The simulated nucleus. Construct in any thread; every other method runs on the loop."""

    def __init__(
        self,
        recipes: list[Recipe],
        *,
        configs: Mapping[str, dict[str, Any]],
        options: Options,
        artifacts_dir: Path | None,
        bridge: IotBridge | None,
        on_state: Callable[[str, str], None],
        on_report: Callable[[str, str], None] | None = None,
    ) -> None:
        self.options = options
        self.profile = options.nucleus
        self.order = recipes
        self.bridge = bridge
        self.on_state = on_state
        self.on_report = on_report
        root = options.root
        self.components: dict[str, Component] = {}
        self._tokens: dict[str, str] = {}
        for recipe in recipes:
            token = secrets.token_hex(16)
            self.components[recipe.name] = Component(
                recipe=recipe,
                token=token,
                config=copy.deepcopy(configs.get(recipe.name, recipe.default_config)),
                log_path=root / "logs" / f"{recipe.name}.log",
            )
            self._tokens[token] = recipe.name
        self.layout = Layout(root, artifacts_dir, self.profile)
        self.paths = self.layout.paths
        self.auth = Authorization(self)
        self.pubsub = LocalPubSub(self)
        self.mqttproxy = MqttProxy(self)
        self.config = ConfigStore(self)
        self.lifecycle = Lifecycle(self)
        self.updates = ComponentUpdates(self)
        handlers: dict[str, Callable[..., Any]] = {}
        for service in (self.pubsub, self.mqttproxy, self.config, self.lifecycle, self.auth, self.updates):
            handlers.update(service.handlers())
        # What this nucleus answers with a ServiceError although the operation is in the model.
        self.ipc_handlers = {
            op: fn
            for op, fn in handlers.items()
            if op.partition("#")[2] not in self.profile.refused_operations
        }
        self.warnings: list[str] = []
        self.tes: TokenExchangeServer | None = None
        self._prepare()
        self.server: ipc.IpcServer | None = None
        if any(tes.DEPENDENCY in c.recipe.dependencies for c in self.components.values()):
            self.tes = TokenExchangeServer(self.component_for_token, options.tes_credentials)

    # ------------------------------------------------------------ set-up

    def _prepare(self) -> None:
        """Check everything first (artifacts, variables, the component user), then lay out."""
        plan = self.layout.plan(c.recipe for c in self.components.values())
        self.check_variables()
        try:
            run_as = users.component_user(self.profile.component_user, self.options.component_user)
        except users.UserError as exc:
            if self.options.component_user:
                raise
            # No default user and no way to make one here (a container without useradd): as a
            # nucleus installed without a component user, everything runs as the core's own user.
            self.warnings.append(f"components run as {_me()}: {exc}")
            log.warning("%s", self.warnings[-1])
            run_as = None
        (self.options.root / "logs").mkdir(parents=True, exist_ok=True)
        for comp in self.components.values():
            self.layout.lay_out(comp.recipe, plan[comp.name], run_as)
        if run_as is None:
            return
        for comp in self.components.values():
            why = self._unreachable(comp, run_as, plan[comp.name].values(), self._links_this_environment())
            if why is None:
                comp.run_as = run_as
                continue
            if self.options.component_user:
                raise users.UserError(f"{comp.name}: component user {run_as}: cannot read {why}")
            warning = (
                f"{comp.name} runs as {_me()}, not as the component user {run_as.user}, which cannot "
                f"read {why}; --component-user names a user that can"
            )
            self.warnings.append(warning)
            log.warning("%s", warning)
            work = Path(self.paths[comp.name]["work:path"])
            os.chown(work, os.getuid(), os.getgid())

    def _links_this_environment(self) -> bool:
        """Whether a component names this core's own Python environment (an installer stand-in that
        links it, `existingVenv`): then a step that runs an unnamed python may well run this one."""
        prefixes = {sys.prefix, os.path.realpath(sys.prefix)}
        ctx = self.var_context(lenient=True)
        for comp in self.components.values():
            texts = [
                interpolate(raw, comp.recipe, ctx, fld) for _s, fld, raw in lifecycle_strings(comp.recipe)
            ]
            texts += list(_strings(comp.config))
            if any(prefix in text for text in texts for prefix in prefixes):
                return True
        return False

    def _unreachable(
        self, comp: Component, who: users.RunAs, artifacts: Iterable[Path], this_env: bool
    ) -> str | None:
        """What `who` cannot reach of the component, or None: its work folder, its artifacts, the
        program each unprivileged step starts, the existing absolute paths its steps and configuration
        name (a venv: with its base interpreter), and, where a component links this core's own
        environment (`this_env`: the test kit's installer stand-in, `existingVenv`), this core's
        interpreter for a step that runs Python without naming it first."""
        why = users.blocked(self.paths[comp.name]["work:path"], who, write=True)
        for src in artifacts:
            why = why or users.blocked(src, who)
        if why is not None:
            return why
        path_env = self.component_env(comp, who).get("PATH", os.defpath)
        ctx = self.var_context(lenient=True)
        texts: list[str] = [str(v) for v in _strings(comp.config)]
        for step, fld, raw in lifecycle_strings(comp.recipe):
            spec = comp.recipe.lifecycle.get(step)
            if isinstance(spec, dict) and str(cget(spec, "RequiresPrivilege", False)).lower() == "true":
                continue
            text = interpolate(raw, comp.recipe, ctx, fld)
            texts.append(text)
            if ".Setenv." in fld:
                continue
            program, why = users.interpreter_of(text, path_env, who)
            if why is None and program is None and this_env and "python" in text.lower():
                program, why = sys.executable, users.blocked(sys.executable, who)
            if why is not None:
                return why
            if program is not None:
                why = _venv_blocked(program, who)
                if why is not None:
                    return why
        for text in texts:
            for path in _ABSOLUTE.findall(text):
                if os.path.lexists(path) and not path.startswith(str(self.options.root)):
                    why = users.blocked(path, who) or _venv_blocked(path, who)
                    if why is not None:
                        return why
        return None

    def var_context(self, lenient: bool = False) -> VarContext:
        """Recipe variables as this nucleus resolves them; `lenient` keeps what only fails a step."""
        options = nuclei.var_context_options(self.profile)
        if lenient:
            options.update(missing_configuration="keep", cross_component=True)
        return VarContext(
            paths=self.paths,
            configs={n: c.config for n, c in self.components.items()},
            kernel_root=str(self.options.root),
            thing_name=self.options.thing,
            **options,
        )

    def check_variables(self) -> None:
        """Resolve every lifecycle string once, so unknown variables fail before anything starts."""
        ctx = self.var_context(lenient=True)
        for comp in self.components.values():
            for _step, fld, text in lifecycle_strings(comp.recipe):
                interpolate(text, comp.recipe, ctx, fld)

    def component_env(self, comp: Component, who: users.RunAs | None) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.options.env)
        socket = self.options.socket_path
        env.update(
            {
                "SVCUID": comp.token,
                "AWS_GG_NUCLEUS_DOMAIN_SOCKET_FILEPATH_FOR_COMPONENT": socket,
                "AWS_CONTAINER_AUTHORIZATION_TOKEN": comp.token,
                "AWS_IOT_THING_NAME": self.options.thing,
                "AWS_REGION": self.options.region,
                "AWS_DEFAULT_REGION": self.options.region,
                "GGC_VERSION": GGC_VERSION,
                "GG_ROOT_CA_PATH": str(self.options.root / "rootCA.pem"),
            }
        )
        if self.tes is not None and tes.DEPENDENCY in comp.recipe.dependencies:
            env[tes.URI_VARIABLE] = self.tes.uri  # both nuclei: for the service's dependants
        if self.profile.env_socket_variable:
            env["AWS_GG_NUCLEUS_DOMAIN_SOCKET_FILEPATH"] = socket
        else:
            env.pop("AWS_GG_NUCLEUS_DOMAIN_SOCKET_FILEPATH", None)
        if not self.profile.env_ca_bundle:
            env.pop("AWS_CA_BUNDLE", None)
        if who is not None:  # as `sudo -E -H -u user` would
            env.update(HOME=who.home, USER=who.user, LOGNAME=who.user)
        return env

    # ------------------------------------------------------------ lookups

    def component_for_token(self, token: str | None) -> str | None:
        return self._tokens.get(token or "")

    def token_for(self, name: str) -> str:
        return self.components[name].token

    def component(self, name: str) -> Component:
        comp = self.components.get(name)
        if comp is None:
            raise ipc.not_found(f"Component {name} not found", "Component", name)
        return comp

    # ------------------------------------------------------------ run / stop

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.mqttproxy.start(loop)
        self.server = ipc.IpcServer(self, self.options.socket_path)
        await self.server.start()
        if self.tes is not None:
            self.tes.start()
        if any(c.run_as is not None for c in self.components.values()):
            os.chmod(self.options.socket_path, 0o666)  # the nucleus's socket is for every component user
            os.chmod(os.path.dirname(self.options.socket_path), 0o755)
        self.lifecycle.start()

    async def stop(self) -> None:
        await self.lifecycle.stop()
        if self.server is not None:
            await self.server.stop()
        if self.tes is not None:
            self.tes.stop()

    def shutting_down(self) -> bool:
        return self.lifecycle.stopping

    async def restart_component(self, comp: Component, why: str) -> None:
        await self.lifecycle.restart_component(comp, why)

    # ------------------------------------------------------------ deployments and local pub/sub

    def publish_local(self, topic: str, kind: str, value: Any, source: str | None) -> None:
        self.pubsub.publish(topic, kind, value, source)

    def add_local_callback(
        self, topic_filter: str, callback: Callable[[Message], None]
    ) -> Callable[[], None]:
        return self.pubsub.add_callback(topic_filter, callback)

    async def deploy_configuration(
        self, name: str, merge: Mapping[str, Any] | None, reset: Iterable[str] | None
    ) -> str | None:
        return await self.config.deploy(name, merge, reset)

    async def update_component(
        self,
        name: str,
        merge: Mapping[str, Any] | None,
        reset: Iterable[str] | None,
        *,
        restart: bool,
        policy_timeout: float,
    ) -> tuple[str, list[Deferral], str | None]:
        """A deployment that updates one component under the NOTIFY_COMPONENTS update policy:
        subscribers may defer it, then its configuration changes (validated), then it restarts."""
        deployment_id = secrets.token_hex(8)
        deferrals = await self.updates.before_update(deployment_id, policy_timeout)
        rejected = await self.config.deploy(name, merge, reset)
        if rejected is None and restart:
            await self.lifecycle.restart_component(self.components[name], f"deployment {deployment_id}")
        self.updates.after_update(deployment_id)
        return deployment_id, deferrals, rejected


_ABSOLUTE = re.compile(r"(?<![\w.:/])(/[^\s'\";|&<>()$`,=]+)")


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, dict):
        for key, child in value.items():
            if key != "accessControl":
                yield from _strings(child)
    elif isinstance(value, list):
        for child in value:
            yield from _strings(child)
    elif isinstance(value, str):
        yield value


def _venv_blocked(path: str, who: users.RunAs) -> str | None:
    """For a venv (its folder or its python), whether `who` can reach the interpreter it was made from."""
    candidates = [path, os.path.join(path, "bin", "python")]
    for candidate in candidates:
        base = users.venv_base(candidate)
        if base:
            return users.blocked(base, who)
    return None


def _me() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name
