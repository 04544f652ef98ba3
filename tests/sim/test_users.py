"""Who components run as: the component user when the core runs as root, RequiresPrivilege, the
up-front check of what that user can read."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edgeinfer.errors import EdgeinferError
from edgeinfer.sim import Simulator
from edgeinfer.sim.users import RunAs, blocked, interpreter_of
from tests.helpers.sim import BOTH_NUCLEI, PYTHON, Device
from tests.helpers.wait import eventually

AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="only a core started as root switches users")


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder every user can search (pytest's own tmp folders are 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="ggsim-users-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_blocked_names_the_folder_that_stops_a_user(open_dir: Path) -> None:
    nobody = RunAs("nobody", "nogroup", 65534, 65534, (65534,), "/nonexistent")
    private = open_dir / "private"
    (private / "deep").mkdir(parents=True)
    (private / "deep" / "python").write_text("")
    private.chmod(0o700)
    link = open_dir / "python"
    link.symlink_to(private / "deep" / "python")
    assert blocked(open_dir, nobody) is None
    assert blocked(link, nobody) == f"{private} (mode rwx------ {_owner(private)})"
    program, why = interpreter_of(f'FOO=1 "{link}" -m x', "/usr/bin", nobody)
    assert program == str(link)
    assert why is not None
    assert why.startswith(str(private))
    assert interpreter_of("sh -c true", "/nowhere:/usr/bin:/bin", nobody)[1] is None


def _owner(path: Path) -> str:
    import grp
    import pwd

    st = path.stat()
    return f"{pwd.getpwuid(st.st_uid).pw_name}:{grp.getgrgid(st.st_gid).gr_name}"


@AS_ROOT
@pytest.mark.classic_only("nucleus lite runs components as gg_component, not ggc_user")
def test_components_run_as_the_component_user_and_privileged_steps_as_root(
    open_dir: Path, simulator: Callable[..., Simulator]
) -> None:
    device = Device(open_dir / "device", platform=BOTH_NUCLEI)
    for folder in (device.recipes.parent, device.recipes, device.artifacts):
        folder.chmod(0o755)
    device.add(
        "com.example.Who",
        lifecycle={
            "Install": {"RequiresPrivilege": True, "Script": "echo install=$(id -un)"},
            "Run": "echo run=$(id -un):$(id -gn) home=$HOME; touch {work:path}/mine; sleep 30",
        },
    )
    device.add("com.example.Py", lifecycle={"Run": f"{PYTHON} -c 'import os; print(\"py\", os.getuid())'"})
    # as the runtime's recipe: waits, then execs a venv's python that does not exist yet
    device.add(
        "com.example.Later", lifecycle={"Run": "w=0; until true; do :; done; exec python3 -c 'print(1)'"}
    )
    sim = simulator(device.recipes, device.artifacts, work_dir=open_dir / "root")
    assert sim.wait_for_state("com.example.Who", "RUNNING") == "RUNNING"
    assert sim.wait_for_state("com.example.Py", ("FINISHED", "BROKEN")) == "FINISHED"
    log = sim.logs("com.example.Who")
    assert "install=root" in log
    eventually(lambda: "run=ggc_user:ggc_group" in sim.logs("com.example.Who"))
    assert "home=/home/ggc_user" in sim.logs("com.example.Who")
    work = open_dir / "root" / "work" / "com.example.Who"
    assert work.owner() == "ggc_user"
    eventually((work / "mine").exists)
    # This interpreter lives where ggc_user cannot read (pyenv under root's 0700 home, or pytest's
    # tmp folders): the component runs as root instead, and the core says why in one line.
    readable = blocked(PYTHON, _ggc_user()) is None
    if not readable:
        [warning] = [w for w in sim.warnings if w.startswith("com.example.Py")]
        assert "runs as root, not as the component user ggc_user, which cannot read" in warning
        assert "\n" not in warning
        assert "py 0" in sim.logs("com.example.Py")
        assert any(w.startswith("com.example.Later runs as root") for w in sim.warnings)


@AS_ROOT
def test_an_explicit_component_user_that_cannot_read_is_refused(
    simulator: Callable[..., Simulator], device: Device
) -> None:
    device.add("com.example.Who", lifecycle={"Run": "sleep 30"})
    with pytest.raises(
        EdgeinferError, match=r"com\.example\.Who: component user nobody:nogroup: cannot read /"
    ):
        simulator(device.recipes, device.artifacts, component_user="nobody:nogroup")


@pytest.mark.skipif(os.geteuid() == 0, reason="as root the core switches users")
def test_not_as_root_components_run_as_the_invoking_user(
    simulator: Callable[..., Simulator], device: Device
) -> None:
    device.add("com.example.Who", lifecycle={"Run": "sleep 30"})
    with pytest.raises(EdgeinferError, match="only a core started as root can switch users"):
        simulator(device.recipes, device.artifacts, component_user="nobody")


def _ggc_user() -> RunAs:
    from edgeinfer.sim.users import ensure_user

    return ensure_user("ggc_user", "ggc_group", create=False)
