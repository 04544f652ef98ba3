"""The other CPython interpreters on this machine (pyenv's, on this machine class), found, never
downloaded."""

from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess


@functools.cache
def find_python(minor: str) -> str | None:
    """A working `python3.X` for `minor` ("3.8"): on PATH, else under pyenv's versions; None if none.

    A pyenv shim of a version that is not selected is on PATH and fails, so each candidate must run
    and say it is that minor."""
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = [shutil.which(f"python{minor}") or ""]
    candidates += sorted(
        glob.glob(os.path.join(root, "versions", f"{minor}.*", "bin", f"python{minor}")), reverse=True
    )
    for candidate in filter(None, candidates):
        try:
            out = subprocess.run(
                [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if out.returncode == 0 and out.stdout.strip() == minor:
            return candidate
    return None


def device_requirements(minor: str) -> list[str]:
    """What the installer pins for a CPU device on Python `minor`: the device-side test legs run on
    exactly these versions."""
    from edgeinfer.installer.plan import InstallerConfig, choose
    from edgeinfer.installer.probe import PlatformInfo

    info = PlatformInfo(os="linux", architecture="x86_64", python=f"{minor}.0", glibc="2.36")
    plan = choose(info, InstallerConfig())
    pinned = {name.lower() for name in plan.constraints}
    loose = [r for r in plan.requirements if r.lower() not in pinned]
    return [*loose, *(f"{k}=={v}" for k, v in plan.constraints.items())]


if __name__ == "__main__":
    import sys

    if len(sys.argv) == 3 and sys.argv[1] == "find":
        print(find_python(sys.argv[2]) or "")
    elif len(sys.argv) == 3 and sys.argv[1] == "requirements":
        print(" ".join(device_requirements(sys.argv[2])))
    else:
        sys.exit("usage: python -m tests.helpers.pythons find|requirements 3.X")
