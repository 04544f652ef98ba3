"""`Simulator`: the thread-safe front of the simulated core (see the package docstring for the API)."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from edgeinfer.errors import EdgeinferError
from edgeinfer.files import atomic_write
from edgeinfer.greengrass import nuclei
from edgeinfer.greengrass.nuclei import NucleusProfile
from edgeinfer.greengrass.recipe import RecipeError, apply_reset, deep_merge, load_recipes, resolve
from edgeinfer.messages import is_thing_name
from edgeinfer.sim.broker import BrokerError, CloudClient, MosquittoBroker, parse_hostport
from edgeinfer.sim.core import BROKEN, Deferral, Nucleus, Options
from edgeinfer.sim.deployment import DeploymentStatus, deployment_status
from edgeinfer.sim.iot_bridge import IotBridge
from edgeinfer.sim.pubsub import LocalClient
from edgeinfer.sim.status import status_document
from edgeinfer.sim.tes import CredentialSource
from edgeinfer.transport.base import TransportError

log = logging.getLogger(__name__)

__all__ = ["LocalClient", "SimError", "Simulator"]

_SOCKET_MAX = 100  # sun_path is 108 bytes including the terminating NUL


class SimError(EdgeinferError):
    """The simulated core could not do what was asked (timeout, rejected update, not started)."""


class Simulator:
    """A simulated Greengrass core: mosquitto as IoT Core, the IPC server, the components' lifecycles."""

    def __init__(
        self,
        recipes_dir: str | Path,
        artifacts_dir: str | Path | None = None,
        *,
        thing: str = "edgeinfer-sim",
        components: Sequence[str] | None = None,
        config_merge: Mapping[str, Any] | None = None,
        config_reset: Mapping[str, Sequence[str]] | None = None,
        work_dir: str | Path | None = None,
        broker: tuple[str, int] | str | None = None,
        region: str = "us-east-1",
        restart_delay: float = 0.5,
        max_errors: int = 3,
        stop_timeout: float = 5.0,
        validation_timeout: float = 10.0,
        env: Mapping[str, str] | None = None,
        nucleus: str | NucleusProfile = "classic",
        component_user: str | None = None,
        tes_credentials: CredentialSource | None = None,
        run_unit_wait: float | None = None,
    ) -> None:
        self.tes_credentials = tes_credentials  # the token exchange service's source (None: test keys)
        try:
            self.nucleus: NucleusProfile = nuclei.profile(nucleus)
        except RecipeError as exc:
            raise SimError(str(exc)) from None
        self.component_user = component_user
        # How long the deployment waits for run units (nucleus lite's 300 s unless given).
        self.run_unit_wait = run_unit_wait if run_unit_wait is not None else self.nucleus.run_unit_wait_s
        self._has_run_unit: dict[str, bool] = {}
        self._deployed_at = 0.0
        self._wait_timer: threading.Timer | None = None
        self.recipes_dir = Path(recipes_dir)
        self.artifacts_dir = Path(artifacts_dir) if artifacts_dir is not None else None
        if not is_thing_name(thing):
            raise SimError(f"thing name {thing!r}: expected 1-128 letters, digits, ':', '_' or '-'")
        self.thing = thing
        self.components = list(components) if components is not None else None
        self.config_merge: dict[str, dict[str, Any]] = {}
        for name, merge in (config_merge or {}).items():
            if not isinstance(merge, Mapping):
                raise SimError(f"config_merge[{name!r}] must be a mapping, not {type(merge).__name__}")
            self.config_merge[name] = dict(merge)
        self.config_reset = {k: list(v) for k, v in (config_reset or {}).items()}
        self._work_dir_arg = Path(work_dir) if work_dir is not None else None
        self._broker_arg = parse_hostport(broker) if isinstance(broker, str) else broker
        self.region = region
        self._opts = {
            "restart_delay": restart_delay,
            "max_errors": max_errors,
            "stop_timeout": stop_timeout,
            "validation_timeout": validation_timeout,
        }
        self._env = dict(env or {})
        self._cond = threading.Condition()
        self._status_lock = threading.Lock()
        self._states: dict[str, str] = {}
        self._history: dict[str, list[str]] = {}
        self._reports: dict[str, list[str]] = {}
        self._reported: dict[str, str] = {}  # the last report since the component's last start
        self._nucleus: Nucleus | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._owned_broker: MosquittoBroker | None = None
        self._bridge: IotBridge | None = None
        self._dropped_at_stop = 0
        self._clients: list[CloudClient] = []
        self._tmp_dirs: list[str] = []
        self.root: Path = Path()
        self.socket_path = ""
        self.broker: tuple[str, int] = ("", 0)
        self.started = False

    # ------------------------------------------------------------ start / stop

    def start(self) -> Simulator:
        index = load_recipes(self.recipes_dir, reader=nuclei.reader(self.nucleus))
        order = resolve(index, self.components)
        for recipe in order:  # nucleus lite copies each recipe within fixed limits first
            for finding in nuclei.check_deployable(recipe.file, self.nucleus):
                raise RecipeError(f"deployment FAILED: Failed to do dependency resolution: {finding}")
        for recipe in order:  # nucleus lite keeps YAML scalars as strings
            recipe.default_config = nuclei.typed_defaults(recipe.default_config, self.nucleus)
        names = {r.name for r in order}
        self._has_run_unit = {
            r.name: bool({"run", "startup"} & set(r.lifecycle) & self.nucleus.steps) for r in order
        }
        for name in list(self.config_merge) + list(self.config_reset):
            if name not in names:
                raise RecipeError(f"configuration given for {name}, which is not deployed")
        configs: dict[str, dict[str, Any]] = {}
        for recipe in order:
            cfg = apply_reset(
                recipe.default_config, recipe.default_config, self.config_reset.get(recipe.name, [])
            )
            if recipe.name in self.config_merge:
                cfg = deep_merge(cfg, self.config_merge[recipe.name])
            configs[recipe.name] = cfg

        if self._work_dir_arg is None:
            self.root = Path(tempfile.mkdtemp(prefix="ggsim-"))
            self._tmp_dirs.append(str(self.root))
        else:
            self.root = self._work_dir_arg.resolve()
            self.root.mkdir(parents=True, exist_ok=True)
        sock = self.root / "ipc.socket"
        if len(str(sock)) >= _SOCKET_MAX:
            short = tempfile.mkdtemp(prefix="gg", dir="/tmp")
            self._tmp_dirs.append(short)
            sock = Path(short) / "ipc.socket"
        with contextlib.suppress(FileNotFoundError):
            sock.unlink()
        self.socket_path = str(sock)
        options = Options(
            thing=self.thing,
            region=self.region,
            root=self.root,
            socket_path=self.socket_path,
            env=self._env,
            nucleus=self.nucleus,
            component_user=self.component_user,
            tes_credentials=self.tes_credentials,
            **self._opts,  # type: ignore[arg-type]
        )
        # Everything that can fail on bad input fails here, before any process starts.
        nucleus = Nucleus(
            order,
            configs=configs,
            options=options,
            artifacts_dir=self.artifacts_dir,
            bridge=None,
            on_state=self._on_state,
            on_report=self._on_report,
        )
        try:
            if self._broker_arg is None:
                self._owned_broker = MosquittoBroker(work_dir=self.root / "broker").start()
                self.broker = self._owned_broker.address
            else:
                self.broker = (self._broker_arg[0], int(self._broker_arg[1]))
            client_id = f"{self.thing}-{os.getpid()}-{id(self) % 10000}"
            try:
                self._bridge = IotBridge(
                    *self.broker, client_id=client_id, profile=self.nucleus, on_drop=self._write_status
                )
            except TransportError as exc:
                host, port = self.broker
                raise BrokerError(f"cannot connect to the broker at {host}:{port}: {exc}") from None
            nucleus.bridge = self._bridge
            for name, comp in nucleus.components.items():
                self._states[name] = comp.state
                self._history[name] = list(comp.history)
            self._nucleus = nucleus
            ready = threading.Event()
            self._thread = threading.Thread(target=self._run_loop, args=(ready,), name="ggsim", daemon=True)
            self._thread.start()
            ready.wait()
            assert self._loop is not None
            self._deployed_at = time.monotonic()
            asyncio.run_coroutine_threadsafe(nucleus.start(), self._loop).result(30)
        except BaseException:
            self.stop()
            raise
        self.started = True
        if self.nucleus.run_unit_wait_s is not None and self.run_unit_wait is not None:
            self._wait_timer = threading.Timer(self.run_unit_wait, self._run_unit_wait_over)
            self._wait_timer.daemon = True
            self._wait_timer.start()
        atexit.register(self._kill_at_exit)
        self._write_status()
        return self

    def _run_loop(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        ready.set()
        try:
            loop.run_forever()
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def _kill_at_exit(self) -> None:
        """The interpreter is exiting without `stop()` (a script that raised, an interrupted test
        run): take the components' process groups and the broker with it, rather than leave them
        running — an orphaned runtime keeps its cores busy."""
        if self._loop is not None and self._thread is not None:  # quiet: no stream callbacks after this
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(2)
        nucleus = self._nucleus
        for comp in list(nucleus.components.values()) if nucleus is not None else []:
            for proc in list(comp.procs):
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)
        if self._owned_broker is not None:
            self._owned_broker.stop()

    def _run_unit_wait_over(self) -> None:
        self._write_status()  # first: a waiter woken below may read status.json at once
        with self._cond:
            self._cond.notify_all()

    def stop(self) -> None:
        atexit.unregister(self._kill_at_exit)
        if self._wait_timer is not None:
            self._wait_timer.cancel()
            self._wait_timer = None
        if self._loop is not None and self._nucleus is not None and self._thread is not None:
            try:
                asyncio.run_coroutine_threadsafe(self._nucleus.stop(), self._loop).result(60)
            except Exception:
                log.exception("stopping the simulated core")
        for client in self._clients:
            client.close()
        self._clients.clear()
        if self._bridge is not None:
            self._dropped_at_stop = self._bridge.dropped()
            self._bridge.close()
            self._bridge = None
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._loop = None
        self._thread = None
        if self._owned_broker is not None:
            self._owned_broker.stop()
            self._owned_broker = None
        if self.socket_path:
            with contextlib.suppress(OSError):
                os.unlink(self.socket_path)
        for d in self._tmp_dirs:
            if d != str(self.root):
                shutil.rmtree(d, ignore_errors=True)
        self.started = False
        if self.root != Path():
            self._write_status()

    def cleanup(self) -> None:
        """Remove a temporary work dir (only one the simulator created itself)."""
        for d in self._tmp_dirs:
            shutil.rmtree(d, ignore_errors=True)

    def __enter__(self) -> Simulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.cleanup()

    # ------------------------------------------------------------ helpers

    def _need(self) -> Nucleus:
        if self._nucleus is None or self._loop is None:
            raise SimError("the simulated core is not running: call start() first")
        return self._nucleus

    def _call(self, fn: Any, timeout: float = 30.0) -> Any:
        """Run `fn()` on the simulator's loop and return its result."""
        self._need()
        assert self._loop is not None

        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def _on_state(self, name: str, state: str) -> None:
        with self._cond:
            self._states[name] = state
            self._history.setdefault(name, []).append(state)
            if state in ("STARTING", "INSTALLED"):  # a (re)start: what it reported before is stale
                self._reported.pop(name, None)
            self._cond.notify_all()
        self._write_status()

    def _on_report(self, name: str, state: str) -> None:
        with self._cond:
            self._reports.setdefault(name, []).append(state)
            self._reported[name] = state
            self._cond.notify_all()
        self._write_status()

    def _write_status(self) -> None:
        if self.root == Path():
            return
        # One writer at a time, each with the state as it is then: the last write is the newest.
        with self._status_lock:
            self._write_status_locked()

    def _write_status_locked(self) -> None:
        with self._cond:
            states = dict(self._states)
            reported = dict(self._reported)
        versions = {n: c.recipe.version for n, c in self._nucleus.components.items()} if self._nucleus else {}
        data = status_document(self, states, reported, versions)
        with contextlib.suppress(OSError):
            atomic_write(self.root / "status.json", json.dumps(data, indent=2).encode())

    # ------------------------------------------------------------ states and logs

    def states(self) -> dict[str, str]:
        with self._cond:
            return dict(self._states)

    def state(self, component: str) -> str:
        with self._cond:
            if component not in self._states:
                raise SimError(f"component {component} is not deployed (have {', '.join(self._states)})")
            return self._states[component]

    def history(self, component: str) -> list[str]:
        """Every state the component went through, in order (NEW first)."""
        with self._cond:
            return list(self._history.get(component, []))

    def reports(self, component: str) -> list[str]:
        """The states the component reported itself with UpdateState, in order."""
        with self._cond:
            return list(self._reports.get(component, []))

    def wait_for_report(self, component: str, state: str = "RUNNING", timeout: float = 30.0) -> None:
        """Block until the component reports `state` with UpdateState.

        A Run component is RUNNING as soon as its process starts, as on a real nucleus; a component
        that warms up first says when it is really ready by reporting RUNNING itself. Raises SimError
        (with the log's tail) on timeout, or when the component went BROKEN first.
        """
        self.state(component)
        with self._cond:
            self._cond.wait_for(
                lambda: state in self._reports.get(component, []) or self._states[component] == BROKEN,
                timeout,
            )
            reported = state in self._reports.get(component, [])
            current = self._states[component]
        if not reported:
            raise SimError(
                f"{component} ({current}) did not report {state} within {timeout}s; "
                f"log tail:\n{self._log_tail(component)}"
            )

    def wait_for_state(
        self, component: str, state: str | Iterable[str] = "RUNNING", timeout: float = 30.0
    ) -> str:
        """Block until the component is in `state` (or one of several); returns the state reached.

        Raises SimError (with the log's tail) on timeout, or when the component went BROKEN instead.
        """
        wanted = {state} if isinstance(state, str) else set(state)
        self.state(component)
        with self._cond:
            self._cond.wait_for(lambda: self._states[component] in wanted | {BROKEN}, timeout)
            current = self._states[component]
        if current in wanted:
            return current
        raise SimError(
            f"{component} is {current}, not {'/'.join(sorted(wanted))}, after {timeout}s; "
            f"log tail:\n{self._log_tail(component)}"
        )

    def wait_for_all(
        self, state: str | Iterable[str] = ("RUNNING", "FINISHED"), timeout: float = 60.0
    ) -> None:
        deadline = time.monotonic() + timeout
        for name in self.states():
            self.wait_for_state(name, state, max(0.0, deadline - time.monotonic()))

    def _log_tail(self, component: str, lines: int = 15) -> str:
        return "\n".join(self.logs(component).splitlines()[-lines:])

    def log_path(self, component: str) -> Path:
        return self.root / "logs" / f"{component}.log"

    def logs(self, component: str) -> str:
        try:
            return self.log_path(component).read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    # ------------------------------------------------------------ the deployment

    def deployment(self) -> DeploymentStatus:
        """The start's deployment as the nucleus reports it: IN_PROGRESS, SUCCEEDED or FAILED (a
        component BROKEN; on nucleus lite also a component without a run unit once `run_unit_wait`
        is over)."""
        with self._cond:
            return self._deployment_locked()

    def _deployment_locked(self) -> DeploymentStatus:
        elapsed = time.monotonic() - self._deployed_at if self._deployed_at else 0.0
        wait = self.run_unit_wait if self.nucleus.run_unit_wait_s is not None else None
        return deployment_status(self._states, self._has_run_unit, elapsed, wait)

    def wait_for_deployment(self, timeout: float = 60.0) -> DeploymentStatus:
        """Block until the deployment SUCCEEDED or FAILED; SimError if it is still in progress."""
        with self._cond:
            self._cond.wait_for(lambda: self._deployment_locked().status != "IN_PROGRESS", timeout)
            status = self._deployment_locked()
        if status.status == "IN_PROGRESS":
            raise SimError(f"the deployment is still IN_PROGRESS after {timeout}s: {status.reason}")
        return status

    def _failed_while_broken(self) -> None:
        """Nucleus lite reports every deployment FAILED while a component of the group is BROKEN."""
        if self.nucleus.run_unit_wait_s is None:
            return
        broken = sorted(n for n, s in self.states().items() if s == BROKEN)
        if broken:
            raise SimError(f"deployment FAILED: {', '.join(broken)} BROKEN")

    # ------------------------------------------------------------ clients

    def cloud_client(self, client_id: str | None = None) -> CloudClient:
        """An MQTT client on the broker, as a cloud application on IoT Core would be. Closed at stop()."""
        client = CloudClient(*self.broker, client_id=client_id)
        self._clients.append(client)
        return client

    def local_client(self) -> LocalClient:
        """Publish/subscribe on local pub/sub from the test, next to the components."""
        return LocalClient(self)

    @contextlib.contextmanager
    def iot_outage(self) -> Iterator[None]:
        """The device loses IoT Core (the broker stays up for the cloud side) inside the `with` block.

        On classic, QoS 1 publishes wait in the spooler meanwhile (up to 2.5 MiB) and go out on the way
        back; QoS 0 ones are refused with a ServiceError, as every publish is on lite. IoT Core
        subscriptions are made again on the way back.
        """
        if self._bridge is None:
            raise SimError("the simulated core is not running: call start() first")
        self._bridge.go_offline()
        try:
            yield
        finally:
            if self._bridge is not None:
                self._bridge.go_online()

    def ipc_env(self, component: str) -> dict[str, str]:
        """The two variables an IPC client needs to connect as `component` (e.g. from the test process)."""
        nucleus = self._need()
        if component not in nucleus.components:
            raise SimError(f"component {component} is not deployed")
        return {
            "SVCUID": nucleus.token_for(component),
            "AWS_GG_NUCLEUS_DOMAIN_SOCKET_FILEPATH_FOR_COMPONENT": self.socket_path,
        }

    def restart(self, component: str, timeout: float = 60.0) -> None:
        """Restart a component as `greengrass-cli component restart` does (Shutdown, Install, Run)."""
        nucleus = self._need()
        if component not in nucleus.components:
            raise SimError(f"component {component} is not deployed")
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(
            nucleus.restart_component(nucleus.components[component], "restart requested"), self._loop
        ).result(timeout)

    # ------------------------------------------------------------ configuration

    def configuration(self, component: str) -> dict[str, Any]:
        nucleus = self._need()
        return dict(self._call(lambda: json.loads(json.dumps(nucleus.components[component].config))))

    def update_configuration(
        self,
        component: str,
        merge: Mapping[str, Any] | None = None,
        reset: Sequence[str] | None = None,
        timeout: float = 30.0,
    ) -> None:
        """Change configuration as a deployment would: validators run first (SimError if rejected)."""
        nucleus = self._need()
        if component not in nucleus.components:
            raise SimError(f"component {component} is not deployed")
        assert self._loop is not None
        reason = asyncio.run_coroutine_threadsafe(
            nucleus.deploy_configuration(component, merge, reset), self._loop
        ).result(timeout)
        if reason is not None:
            raise SimError(f"configuration update of {component} rejected: {reason}")
        self._failed_while_broken()

    # ------------------------------------------------------------ deployments

    @property
    def warnings(self) -> list[str]:
        """What the core said it did differently from a nucleus (e.g. a component not run as the
        component user because that user cannot read its interpreter)."""
        return list(self._nucleus.warnings) if self._nucleus is not None else []

    def update_component(
        self,
        component: str,
        merge: Mapping[str, Any] | None = None,
        reset: Sequence[str] | None = None,
        *,
        restart: bool = True,
        policy_timeout: float = 60.0,
        timeout: float = 300.0,
    ) -> list[Deferral]:
        """Deploy an update of `component` as the nucleus does under the NOTIFY_COMPONENTS update
        policy: every component subscribed to component updates gets a PreComponentUpdateEvent and
        may defer it (DeferComponentUpdate with recheckAfterMs: asked again after that long); each
        round waits up to `policy_timeout` for answers. Then the configuration changes (validators
        first), the component restarts (`restart`), and a PostComponentUpdateEvent follows.

        Returns the deferrals made, in order. SimError when a validator rejects the configuration.
        """
        nucleus = self._need()
        if component not in nucleus.components:
            raise SimError(f"component {component} is not deployed")
        assert self._loop is not None
        _id, deferrals, rejected = asyncio.run_coroutine_threadsafe(
            nucleus.update_component(component, merge, reset, restart=restart, policy_timeout=policy_timeout),
            self._loop,
        ).result(timeout)
        if rejected is not None:
            raise SimError(f"update of {component} rejected: {rejected}")
        self._failed_while_broken()
        return deferrals

    def dropped_iot_messages(self) -> int:
        """Messages from IoT Core never delivered for being over the nucleus's Maximum Packet Size
        (nucleus lite: 5,000 bytes; the broker drops them silently, here the bridge counts them)."""
        return self._bridge.dropped() if self._bridge is not None else self._dropped_at_stop

    def pending_iot_publishes(self) -> tuple[int, int]:
        """(messages, bytes) the IoT bridge's spooler holds that IoT Core has not acknowledged."""
        return self._bridge.pending() if self._bridge is not None else (0, 0)
