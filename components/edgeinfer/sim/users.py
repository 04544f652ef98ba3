"""Who a component runs as, and whether that user can reach what it needs.

The classic nucleus runs components as its default component user (`ggc_user:ggc_group`, created by
its setup when missing) and as root only a step that asks `RequiresPrivilege`; nucleus lite runs them
as `gg_component`. The simulated core does the same when it runs as root. Run as anyone else, it can
switch to no other user, so components run as the invoking user (as a nucleus started without root
does).

A component user that cannot read its artifacts, its work folder or the interpreter its scripts start
(a pyenv interpreter under root's 0700 home, a venv in a folder CI chose) would fail far from the
cause, so `blocked` finds the first path it cannot reach and the core says so in one line.
"""

from __future__ import annotations

import grp
import os
import pwd
import shlex
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from edgeinfer.errors import EdgeinferError

__all__ = ["RunAs", "UserError", "blocked", "component_user", "ensure_user", "interpreter_of"]


class UserError(EdgeinferError):
    """The component user cannot be found, created or used: one line."""


@dataclass(frozen=True)
class RunAs:
    """A user to run component processes as (`None` where a process runs as the core itself)."""

    user: str
    group: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str

    def __str__(self) -> str:
        return f"{self.user}:{self.group}"


def _lookup(user: str, group: str) -> RunAs:
    pw = pwd.getpwnam(user)
    gid = grp.getgrnam(group).gr_gid
    groups = tuple(sorted({gid, pw.pw_gid, *os.getgrouplist(user, gid)}))
    return RunAs(user, group, pw.pw_uid, gid, groups, pw.pw_dir)


def ensure_user(user: str, group: str, *, create: bool) -> RunAs:
    """The user and group, created (system accounts, as the nucleus's setup does) when `create`."""
    try:
        return _lookup(user, group)
    except KeyError:
        if not create:
            raise UserError(f"component user {user}:{group} does not exist") from None
    try:
        try:
            grp.getgrnam(group)
        except KeyError:
            subprocess.run(["groupadd", "-r", group], check=True, capture_output=True)
        try:
            pwd.getpwnam(user)
        except KeyError:
            subprocess.run(["useradd", "-r", "-m", "-g", group, user], check=True, capture_output=True)
        subprocess.run(["usermod", "-a", "-G", group, user], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        text = detail.decode(errors="replace").strip().splitlines()
        raise UserError(
            f"cannot create the component user {user}:{group}: {text[-1] if text else exc}"
        ) from None
    return _lookup(user, group)


def component_user(default: str, explicit: str | None) -> RunAs | None:
    """Who components run as: None (the core's own user) unless the core runs as root.

    As root: `explicit` ("user[:group]", which must exist) or the nucleus's `default`, created when
    missing. Not as root, `explicit` is refused: only root can switch users.
    """
    if os.geteuid() != 0:
        if explicit:
            raise UserError(f"--component-user {explicit}: only a core started as root can switch users")
        return None
    spec = explicit or default
    user, _, group = spec.partition(":")
    return ensure_user(user, group or user, create=explicit is None)


def _can(st: os.stat_result, who: RunAs, bits: int) -> bool:
    """Permission bits (owner, group, other) as the kernel checks them for a non-root user."""
    if st.st_uid == who.uid:
        return (st.st_mode >> 6) & bits == bits
    if st.st_gid in who.groups:
        return (st.st_mode >> 3) & bits == bits
    return st.st_mode & bits == bits


def blocked(path: str | Path, who: RunAs, *, write: bool = False) -> str | None:
    """Why `who` cannot reach `path` (following symlinks), or None when it can.

    Every folder on the way needs search permission; the path itself read permission (and search
    for a folder, write with `write`). The answer names the first path that stops it and its mode.
    """
    seen: set[str] = set()
    todo = [os.path.abspath(path)]
    while todo:
        target = todo.pop()
        if target in seen:
            continue
        seen.add(target)
        parts = Path(target).parts
        current = Path(parts[0])
        for i, part in enumerate(parts[1:], start=1):
            try:
                st_dir = current.stat()
            except OSError:
                return None  # missing: not a permission problem (the component will say)
            if not _can(st_dir, who, 1):
                return f"{current} (mode {stat.filemode(st_dir.st_mode)[1:]} {_owner(st_dir)})"
            current = current / part
            if current.is_symlink():
                link = os.path.join(str(current.parent), os.readlink(current))
                rest = parts[i + 1 :]
                todo.append(os.path.normpath(os.path.join(link, *rest)))
                break
        else:
            try:
                st = current.stat()
            except OSError:
                return None
            bits = 4 | (1 if stat.S_ISDIR(st.st_mode) else 0) | (2 if write else 0)
            if not _can(st, who, bits):
                return f"{current} (mode {stat.filemode(st.st_mode)[1:]} {_owner(st)})"
    return None


def _owner(st: os.stat_result) -> str:
    try:
        user = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        user = str(st.st_uid)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    return f"{user}:{group}"


def interpreter_of(script: str, path_env: str, who: RunAs) -> tuple[str | None, str | None]:
    """The program a lifecycle script starts first, as `who` finds it on PATH: (path, why blocked).

    Leading `NAME=value` assignments are skipped. A name found in a PATH folder `who` cannot search
    is skipped as the shell skips it; when only such folders hold it, the first one is the reason.
    (None, None) when the script's first word is not a program the check can see (a shell keyword,
    a variable, something missing).
    """
    try:
        words = shlex.split(script, comments=True)
    except ValueError:
        return None, None
    words = [w for w in words if not (w.partition("=")[1] and w.partition("=")[0].isidentifier())]
    if not words or words[0].startswith("$"):
        return None, None
    first = words[0]
    if "/" in first:
        return first, blocked(first, who)
    first_blocked: str | None = None
    for folder in path_env.split(os.pathsep):
        candidate = os.path.join(folder or ".", first)
        if not os.path.exists(candidate):
            continue
        why = blocked(candidate, who)
        if why is None:
            return candidate, None
        first_blocked = first_blocked or why
    return (first, first_blocked) if first_blocked else (None, None)


def venv_base(interpreter: str) -> str | None:
    """The base interpreter folder of a venv's python (`home` in its pyvenv.cfg), if it is one."""
    cfg = Path(interpreter).parent.parent / "pyvenv.cfg"
    try:
        for line in cfg.read_text(encoding="utf-8").splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home":
                return value.strip()
    except OSError:
        return None
    return None
