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


# The device-side suite: the unit tests that need no developer tool (tests/helpers/device_leg.py).
DEVICE_TESTS = (
    "tests/installer",
    "tests/runtime",
    "tests/telemetry",
    "tests/transport",
    "tests/test_messages.py",
    "tests/test_codec.py",
)
TEST_TOOLS = ("pytest", "pytest-timeout", "hypothesis", "jsonschema", "onnx")
PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def leg(minor: str, venvs: str, log: str) -> subprocess.Popen[bytes] | str:
    """Start one Python's leg (its venv made or refreshed first), output to `log`; or why not."""
    python = find_python(minor)
    if python is None:
        return f"Python {minor}: skipped, no python{minor} on this machine (on PATH or under pyenv)"
    venv = os.path.join(venvs, f"py{minor}")
    want = " ".join([*device_requirements(minor), *TEST_TOOLS])
    stamp = os.path.join(venv, ".installed")
    steps = []
    if not os.path.exists(stamp) or open(stamp, encoding="utf-8").read() != want:  # noqa: SIM115
        steps += [
            f"rm -rf {venv}",
            f"{python} -m venv {venv}",
            f"{venv}/bin/python -m pip install --quiet --progress-bar off {want}",
            f"printf %s '{want}' > {stamp}",
        ]
    tests = " ".join(DEVICE_TESTS)
    steps.append(
        f"PYTHONPATH=components:cloud:bench {venv}/bin/python -m pytest -q -p no:cacheprovider "
        f"-p tests.helpers.device_leg --ignore tests/telemetry/test_report.py {tests}"
    )
    out = open(log, "wb")  # noqa: SIM115 (the child writes it; closed when the leg is reaped)
    return subprocess.Popen(
        ["bash", "-c", " && ".join(steps)], cwd=PROJECT_ROOT, stdout=out, stderr=subprocess.STDOUT
    )


def legs(minors: list[str], venvs: str) -> int:
    """All legs at once (their time is mostly waiting), then each one's verdict."""
    os.makedirs(venvs, exist_ok=True)
    started = {m: leg(m, venvs, os.path.join(venvs, f"py{m}.log")) for m in minors}
    status = 0
    for minor, proc in started.items():
        if isinstance(proc, str):
            print(proc)
            continue
        code = proc.wait()
        with open(os.path.join(venvs, f"py{minor}.log"), encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
        if code == 0:
            print(f"Python {minor}: {lines[-1] if lines else 'passed'}")
        else:
            status = 1
            print(f"Python {minor}: FAILED (exit {code}); the end of its log:")
            print("\n".join(lines[-40:]))
    return status


if __name__ == "__main__":
    import sys

    if len(sys.argv) == 3 and sys.argv[1] == "find":
        print(find_python(sys.argv[2]) or "")
    elif len(sys.argv) == 3 and sys.argv[1] == "requirements":
        print(" ".join(device_requirements(sys.argv[2])))
    elif len(sys.argv) >= 4 and sys.argv[1] == "legs":
        sys.exit(legs(sys.argv[3:], sys.argv[2]))
    else:
        sys.exit("usage: python -m tests.helpers.pythons find|requirements 3.X | legs VENVS 3.X ...")
