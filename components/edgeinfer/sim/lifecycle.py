"""Lifecycle: components as real processes, states, restarts, dependencies, users; UpdateState,
PauseComponent and ResumeComponent (the classic nucleus's `LifecycleIPCEventStreamAgent`).

States NEW → INSTALLED → STARTING → RUNNING / FINISHED, ERRORED → restart with back-off → BROKEN
after `max_errors`. A HARD dependant waits for RUNNING/FINISHED and restarts when its dependency
errs or restarts. Nucleus lite (`NucleusProfile`) differs where it was seen to: a component without
a lifecycle step never reaches FINISHED, a HARD dependency on a component without a run or startup
step never lets the dependant start (systemd `BindsTo=` a unit that does not exist), and the
shutdown and recover steps are not run.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import shutil
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from awsiot.greengrasscoreipc import model

from edgeinfer import procfs
from edgeinfer.greengrass.recipe import Recipe, RecipeError, cget, config_text, interpolate
from edgeinfer.sim import ipc_server as ipc
from edgeinfer.sim.users import RunAs

if TYPE_CHECKING:
    from edgeinfer.sim.core import Nucleus

log = logging.getLogger(__name__)

NEW, INSTALLED, STARTING, RUNNING, STOPPING, ERRORED, BROKEN, FINISHED = (
    "NEW",
    "INSTALLED",
    "STARTING",
    "RUNNING",
    "STOPPING",
    "ERRORED",
    "BROKEN",
    "FINISHED",
)
LIFECYCLE = "aws.greengrass.ipc.lifecycle"
DEFAULT_TIMEOUTS = {"install": 120.0, "startup": 120.0, "shutdown": 15.0, "recover": 60.0}


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


@dataclass(eq=False)
class Component:
    recipe: Recipe
    token: str
    config: dict[str, Any]
    log_path: Path
    run_as: RunAs | None = None  # None: the core's own user
    state: str = NEW
    history: list[str] = field(default_factory=lambda: [NEW])
    errors: int = 0
    procs: set[asyncio.subprocess.Process] = field(default_factory=set)
    task: asyncio.Task[None] | None = None
    reported_error: asyncio.Event | None = None
    stopping: bool = False
    paused: bool = False

    @property
    def name(self) -> str:
        return self.recipe.name

    def log(self, text: str) -> None:
        try:
            with self.log_path.open("a", encoding="utf-8") as f:
                f.write(f"{_now()} [sim] {self.name}: {text}\n")
        except OSError:  # the root went away under us (a test's tmp folder): still stop cleanly
            log.debug("%s: %s", self.name, text)


StepSpec = tuple[str, dict[str, str], "float | None", "str | None", bool]  # script, env, timeout, skip, root


class Lifecycle:
    """Runs every component's lifecycle on the nucleus's loop."""

    def __init__(self, nucleus: Nucleus) -> None:
        self.nucleus = nucleus
        self.options = nucleus.options
        self.profile = nucleus.profile
        self.components = nucleus.components
        self._state_changed = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self.stopping = False

    def handlers(self) -> dict[str, Callable[..., Any]]:
        return {
            "aws.greengrass#UpdateState": self._update_state,
            "aws.greengrass#PauseComponent": self._pause,
            "aws.greengrass#ResumeComponent": self._resume,
        }

    # ------------------------------------------------------------ states

    def set_state(self, comp: Component, state: str, why: str = "") -> None:
        if comp.state == state:
            return
        comp.log(f"state {comp.state} -> {state}{' (' + why + ')' if why else ''}")
        comp.state = state
        comp.history.append(state)
        self.nucleus.on_state(comp.name, state)
        self._state_changed.set()
        self._state_changed = asyncio.Event()

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            await self._state_changed.wait()

    # ------------------------------------------------------------ start / stop

    def start(self) -> None:
        self._state_changed = asyncio.Event()
        for comp in self.components.values():
            comp.reported_error = asyncio.Event()
            comp.task = asyncio.create_task(self._lifecycle(comp), name=f"lifecycle:{comp.name}")

    async def stop(self) -> None:
        self.stopping = True
        for recipe in reversed(self.nucleus.order):
            try:
                await self.stop_component(self.components[recipe.name])
            except Exception:  # the others' processes must go all the same
                log.exception("stopping %s", recipe.name)
                await self._kill_all(self.components[recipe.name])

    async def stop_component(self, comp: Component, final: str = FINISHED) -> None:
        comp.stopping = True
        running = comp.state in (RUNNING, STARTING) and bool(comp.procs)
        if comp.task is not None and not comp.task.done():
            comp.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await comp.task
        if comp.paused:
            self._signal_procs(comp, signal.SIGCONT)
            comp.paused = False
        if running:
            self.set_state(comp, STOPPING)
            if self._has_step(comp, "shutdown"):
                await self._run_step(comp, "shutdown")
        await self._kill_all(comp)
        if comp.state in (RUNNING, STOPPING, STARTING):
            self.set_state(comp, final, "stopped")

    async def restart_component(self, comp: Component, why: str) -> None:
        """Stop the component (Shutdown, then its processes) and run its lifecycle again from Install."""
        if self.stopping:
            return
        comp.log(f"restarting: {why}")
        self._restart_hard_dependants(comp, "restarted")
        await self.stop_component(comp, final=INSTALLED)
        if self.nucleus.shutting_down():  # the core may have begun to stop meanwhile
            return
        comp.stopping = False
        comp.errors = 0
        self.set_state(comp, INSTALLED, why)
        comp.task = asyncio.create_task(self._lifecycle(comp), name=f"lifecycle:{comp.name}")

    def _restart_hard_dependants(self, comp: Component, what: str) -> None:
        for other in self.components.values():
            dep = other.recipe.dependencies.get(comp.name)
            if dep is not None and dep.hard and other.state not in (NEW, BROKEN) and not other.stopping:
                task = asyncio.get_running_loop().create_task(
                    self.restart_component(other, f"HARD dependency {comp.name} {what}")
                )
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    def _has_step(self, comp: Component, step: str) -> bool:
        return step in comp.recipe.lifecycle and step in self.profile.steps

    def _has_unit(self, comp: Component) -> bool:
        return self._has_step(comp, "run") or self._has_step(comp, "startup")

    def _deps_ready(self, comp: Component) -> bool:
        for dep in comp.recipe.dependencies.values():
            other = self.components.get(dep.name)
            if other is None:
                continue
            if dep.hard and self.profile.hard_dependency_needs_running_unit and not self._has_unit(other):
                return False  # BindsTo= a unit that never exists
            if dep.hard and other.state not in (RUNNING, FINISHED):
                return False
            if not dep.hard and other.state in (NEW, INSTALLED, STARTING):
                return False
        return True

    async def _lifecycle(self, comp: Component) -> None:
        try:
            if not self._deps_ready(comp):
                comp.log("waiting for dependencies: " + ", ".join(comp.recipe.dependencies))
                for dep in comp.recipe.dependencies.values():
                    other = self.components.get(dep.name)
                    hard_on_unitless = dep.hard and self.profile.hard_dependency_needs_running_unit
                    if other is not None and hard_on_unitless and not self._has_unit(other):
                        comp.log(
                            f"HARD dependency {dep.name} has no run or startup step: nucleus "
                            f"{self.profile.name} never starts {comp.name} (systemd BindsTo=)"
                        )
                await self.wait_until(lambda: self._deps_ready(comp))
            while not comp.stopping:
                error = await self._run_once(comp)
                if error is None or comp.stopping:
                    return
                comp.errors += 1
                self.set_state(comp, ERRORED, error)
                self._restart_hard_dependants(comp, "errored")
                await self._kill_all(comp)
                if self._has_step(comp, "recover"):
                    await self._run_step(comp, "recover")
                if comp.errors >= self.options.max_errors:
                    self.set_state(comp, BROKEN, f"{comp.errors} errors")
                    return
                delay = self.options.restart_delay * (2 ** (comp.errors - 1))
                comp.log(f"restarting in {delay:.2f}s (error {comp.errors} of {self.options.max_errors})")
                await asyncio.sleep(delay)
        except asyncio.CancelledError:
            raise
        except RecipeError as exc:
            comp.log(str(exc))
            self.set_state(comp, BROKEN, str(exc))
        except Exception as exc:
            log.exception("lifecycle of %s failed", comp.name)
            comp.log(f"lifecycle failed: {exc}")
            self.set_state(comp, BROKEN, str(exc))

    async def _run_once(self, comp: Component) -> str | None:
        """One start of a component; returns why it errored, or None when it finished or was stopped."""
        assert comp.reported_error is not None
        comp.reported_error.clear()
        if not self.profile.artifacts_only_supported and not any(
            self._has_step(comp, s) for s in ("install", "run", "startup", "bootstrap")
        ):
            comp.log(
                f"nucleus {self.profile.name}: a lifecycle with no phase is not supported: "
                "the component never reaches FINISHED"
            )
            self.set_state(comp, INSTALLED)
            await asyncio.Event().wait()  # until stopped
        if self._has_step(comp, "install"):
            code = await self._run_step(comp, "install")
            if code != 0:
                return f"Install exited with {code}" if code is not None else "Install timed out"
        self.set_state(comp, INSTALLED)
        self.set_state(comp, STARTING)
        if self._has_step(comp, "startup"):
            code = await self._run_step(comp, "startup", keep_group=True)
            if code != 0:
                return f"Startup exited with {code}" if code is not None else "Startup timed out"
            self.set_state(comp, RUNNING)
            await comp.reported_error.wait()
            return "component reported ERRORED"
        if self._has_step(comp, "run"):
            try:
                proc = await self._spawn(comp, "run")
            except RecipeError as exc:  # nucleus lite: the unit runs, fails and is restarted
                comp.log(str(exc))
                return f"Run failed: {exc}"
            if proc is None:
                return None
            self.set_state(comp, RUNNING)
            exited = asyncio.create_task(proc.wait())
            reported = asyncio.create_task(comp.reported_error.wait())
            try:
                done, _ = await asyncio.wait({exited, reported}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in (exited, reported):
                    if not waiter.done():
                        waiter.cancel()
            if exited in done:
                code = proc.returncode
                comp.procs.discard(proc)
                if comp.stopping:
                    return None
                comp.log(f"Run exited with {code}")
                if code == 0:
                    self.set_state(comp, FINISHED)
                    return None
                return f"Run exited with {code}"
            return "component reported ERRORED"
        self.set_state(comp, FINISHED)
        return None

    # ------------------------------------------------------------ steps and processes

    def step_spec(self, comp: Component, step: str) -> StepSpec:
        """The interpolated script of a step, its Setenv, Timeout, SkipIf and RequiresPrivilege."""
        recipe = comp.recipe
        value = recipe.lifecycle[step]
        ctx = self.nucleus.var_context()
        base = f"{recipe.manifest_field}.Lifecycle.{step.capitalize()}"
        env: dict[str, str] = {}
        for k, v in (cget(recipe.lifecycle, "setenv") or {}).items():
            env[str(k)] = interpolate(
                config_text(v), recipe, ctx, f"{recipe.manifest_field}.Lifecycle.Setenv.{k}"
            )
        timeout: float | None = DEFAULT_TIMEOUTS.get(step)
        skip_if: str | None = None
        privileged = False
        if isinstance(value, str):
            script = interpolate(value, recipe, ctx, base)
        else:
            script = interpolate(str(cget(value, "Script")), recipe, ctx, f"{base}.Script")
            for k, v in (cget(value, "Setenv") or {}).items():
                env[str(k)] = interpolate(config_text(v), recipe, ctx, f"{base}.Setenv.{k}")
            if cget(value, "Timeout") is not None:
                timeout = float(cget(value, "Timeout"))
            if self.profile.name == "classic":  # nucleus lite does not read SkipIf
                skip_if = cget(value, "SkipIf")
            privileged = str(cget(value, "RequiresPrivilege", False)).lower() == "true"
        return script, env, timeout, skip_if, privileged

    def run_as(self, comp: Component, privileged: bool) -> RunAs | None:
        return None if privileged else comp.run_as

    async def _spawn(self, comp: Component, step: str) -> asyncio.subprocess.Process | None:
        script, step_env, _timeout, skip_if, privileged = self.step_spec(comp, step)
        if skip_if and _skip(skip_if):
            comp.log(f"lifecycle.{step.capitalize()}: skipped ({skip_if})")
            return None
        who = self.run_as(comp, privileged)
        env = self.nucleus.component_env(comp, who)
        if self.profile.component_path is not None:  # a systemd unit's PATH, not the core's
            env["PATH"] = self.profile.component_path
        env.update(step_env)
        # the recipe's text, not the interpolated script: configuration values may be secrets
        raw = comp.recipe.lifecycle[step]
        raw_script = raw if isinstance(raw, str) else str(cget(raw, "Script"))
        comp.log(f"lifecycle.{step.capitalize()}{f' (as {who.user})' if who else ''}: {raw_script.strip()}")
        user_args: dict[str, Any] = {}
        if who is not None:
            user_args = {"user": who.uid, "group": who.gid, "extra_groups": list(who.groups)}
        with comp.log_path.open("ab") as out:
            proc = await asyncio.create_subprocess_exec(
                "sh",
                "-c",
                script,
                cwd=self.nucleus.paths[comp.name]["work:path"],
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
                **user_args,
            )
        comp.procs.add(proc)
        return proc

    async def _run_step(self, comp: Component, step: str, keep_group: bool = False) -> int | None:
        """Run a step to completion (with its Timeout). Returns the exit code, None on timeout."""
        try:
            timeout = self.step_spec(comp, step)[2]
            proc = await self._spawn(comp, step)
        except RecipeError as exc:
            comp.log(str(exc))
            return 1
        if proc is None:
            return 0
        try:
            code = await asyncio.wait_for(proc.wait(), timeout)
        except asyncio.TimeoutError:
            comp.log(f"lifecycle.{step.capitalize()} timed out after {timeout}s")
            _signal_group(proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                await proc.wait()
            comp.procs.discard(proc)
            return None
        except asyncio.CancelledError:
            _signal_group(proc.pid, signal.SIGKILL)
            comp.procs.discard(proc)
            raise
        if not keep_group:
            comp.procs.discard(proc)
        comp.log(f"lifecycle.{step.capitalize()} exited with {code}")
        return code

    async def _kill_all(self, comp: Component) -> None:
        """SIGTERM each process group (the whole tree), SIGKILL what is left after stop_timeout."""
        procs = list(comp.procs)
        if not procs:
            return
        groups = {proc.pid for proc in procs}
        for pgid in groups:
            _signal_group(pgid, signal.SIGTERM)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.stop_timeout
        for proc in procs:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), max(0.0, deadline - loop.time()))
        while _live_groups(groups) and loop.time() < deadline:
            await asyncio.sleep(0.02)
        if _live_groups(groups) or any(proc.returncode is None for proc in procs):
            comp.log(f"processes ignored SIGTERM for {self.options.stop_timeout}s: killing them")
            for pgid in groups:
                _signal_group(pgid, signal.SIGKILL)
            for proc in procs:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(proc.wait(), 5)
            end = loop.time() + 5
            while _live_groups(groups) and loop.time() < end:
                await asyncio.sleep(0.02)
        for proc in procs:
            comp.procs.discard(proc)

    def _signal_procs(self, comp: Component, sig: int) -> None:
        for proc in list(comp.procs):
            _signal_group(proc.pid, sig)

    # ------------------------------------------------------------ IPC

    async def _update_state(self, conn: ipc.Connection, req: Any, stream: ipc.Stream) -> Any:
        assert conn.component is not None
        comp = self.nucleus.component(conn.component)
        state = str(req.state or "")
        if state not in (RUNNING, ERRORED):
            raise ipc.invalid(f"state must be RUNNING or ERRORED, not {state!r}")
        comp.log(f"UpdateState {state}")
        if self.nucleus.on_report is not None:
            self.nucleus.on_report(comp.name, state)
        if state == RUNNING and comp.state in (STARTING, INSTALLED, FINISHED):
            self.set_state(comp, RUNNING, "reported by the component")
        elif state == ERRORED and comp.reported_error is not None:
            comp.reported_error.set()
        return model.UpdateStateResponse()

    def _pause_target(self, conn: ipc.Connection, req: Any, operation: str) -> Component:
        name = req.component_name or ""
        if not name:
            raise ipc.invalid("Component name is required.")
        assert conn.component is not None
        self.nucleus.auth.authorize(conn.component, LIFECYCLE, operation, name)
        comp = self.components.get(name)
        if comp is None:
            raise ipc.not_found("")
        return comp

    async def _pause(self, conn: ipc.Connection, req: Any, stream: ipc.Stream) -> Any:
        comp = self._pause_target(conn, req, "aws.greengrass#PauseComponent")
        if comp.state != RUNNING:
            raise ipc.invalid(f"Component {comp.name} is not running")
        self._signal_procs(comp, signal.SIGSTOP)
        comp.paused = True
        comp.log(f"paused by {conn.component}")
        return model.PauseComponentResponse()

    async def _resume(self, conn: ipc.Connection, req: Any, stream: ipc.Stream) -> Any:
        comp = self._pause_target(conn, req, "aws.greengrass#ResumeComponent")
        if not comp.paused:
            raise ipc.invalid(f"Component {comp.name} is not paused")
        self._signal_procs(comp, signal.SIGCONT)
        comp.paused = False
        comp.log(f"resumed by {conn.component}")
        return model.ResumeComponentResponse()


def _skip(skip_if: str) -> bool:
    kind, _, arg = str(skip_if).strip().partition(" ")
    arg = arg.strip()
    if kind == "onpath":
        return shutil.which(arg) is not None
    if kind == "exists":
        return Path(arg).exists()
    return False


def _live_groups(pgids: set[int]) -> set[int]:
    """The process groups among `pgids` that still have a process that is not a zombie."""
    live: set[int] = set()
    for pid in procfs.pids():  # none where there is no /proc: the leaders' exit is all we can see
        stat = procfs.stat(pid)
        if stat is not None and stat.pgid in pgids and stat.state not in ("Z", "X"):
            live.add(stat.pgid)
    return live


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
        os.killpg(pid, sig)
