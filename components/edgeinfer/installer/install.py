"""Create (or link) the component venv, verify ONNX Runtime in it, write `platform.json`.

Layout under the component's work folder (`{work:path}`, i.e.
`{kernel:rootPath}/work/com.edgeinfer.RuntimeInstaller/`):

    venv            -> symlink to the active environment (what dependants run: venv/bin/python)
    venvs/<id>/     the environments this installer built (current and previous kept)
    platform.json   found / plan / installed / providers that really load, and the fingerprint
    wheelhouses/    the shipped wheelhouse.zip where the nucleus did not unpack it (unarchive.py)

A new environment is built next to the active one and only becomes active (an atomic symlink swap)
once it verified; any failure removes the half-built one and leaves `venv` and `platform.json` as
they were. A fingerprint of platform + plan + shipped wheels makes the Install step (which Greengrass
re-runs at every start) a no-op when nothing changed. Standard library only. Over 500 lines because
building, verifying and swapping an environment is one all-or-nothing step on the device.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import edgeinfer
from edgeinfer import __version__
from edgeinfer.errors import EdgeinferError
from edgeinfer.files import atomic_write, sha256_file
from edgeinfer.installer.plan import CPU, ORT_PACKAGES, TENSORRT, InstallerConfig, Plan, choose
from edgeinfer.installer.preflight import venv_refusal
from edgeinfer.installer.probe import PlatformInfo, ProbeSource, probe
from edgeinfer.installer.tiny_model import write_tiny_model
from edgeinfer.installer.unarchive import WHEELHOUSE_ZIP, ArchiveError, unpack_once

__all__ = [
    "PLATFORM_FILE",
    "InstallError",
    "Outcome",
    "Paths",
    "fingerprint",
    "run_installer",
    "verify_environment",
]

log = logging.getLogger(__name__)

COMPONENT = "com.edgeinfer.RuntimeInstaller"
PLATFORM_FILE = "platform.json"
WHEELHOUSES = "wheelhouses"  # the shipped wheelhouse.zip, where the installer unpacked it
SCHEMA_VERSION = 1


class InstallError(EdgeinferError):
    """The environment could not be built or verified; the device is left as it was."""


@dataclass
class Paths:
    work: Path  # {work:path}
    artifacts: Path | None = None  # {artifacts:path}: the project wheel, wheelhouse.zip when shipped
    unpacked: Path | None = None  # {artifacts:decompressedPath}: wheelhouse/ where the nucleus unpacked it

    @property
    def venv_link(self) -> Path:
        return self.work / "venv"

    @property
    def platform_file(self) -> Path:
        return self.work / PLATFORM_FILE


@dataclass
class Outcome:
    skipped: bool
    fingerprint: str
    seconds: float
    report: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------- helpers


def _link_atomic(link: Path, target: Path, aside: Path) -> None:
    """Point `link` at `target` in one rename. A real directory in the way is moved to `aside`."""
    if link.exists() and not link.is_symlink():
        aside.parent.mkdir(parents=True, exist_ok=True)
        os.replace(link, aside)
    tmp = link.with_name(f".{link.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, link)


def project_wheels(paths: Paths) -> list[Path]:
    if paths.artifacts is None or not paths.artifacts.is_dir():
        return []
    return sorted(paths.artifacts.glob("edgeinfer-*.whl"))


def find_wheelhouse(paths: Paths, config: InstallerConfig) -> Path | None:
    """The configured wheelhouse; else the shipped one as the nucleus unpacked it; else, where the
    nucleus left it packed (nucleus lite on a local deployment), as the installer unpacks it."""
    if config.wheelhouse:
        folder = Path(config.wheelhouse)
        if not folder.is_dir():
            raise InstallError(f"wheelhouse {folder} does not exist")
        return folder
    unpacked = paths.unpacked / "wheelhouse" if paths.unpacked is not None else None
    archive = paths.artifacts / WHEELHOUSE_ZIP if paths.artifacts is not None else None
    shipped = archive is not None and archive.is_file()
    if unpacked is not None and unpacked.is_dir() and (not shipped or any(unpacked.iterdir())):
        return unpacked
    if archive is None or not shipped:
        return None
    log.info("%s is not unpacked (nucleus lite unpacks only what it downloads): unpacking it", archive)
    try:
        return unpack_once(archive, paths.work / WHEELHOUSES)
    except ArchiveError as exc:
        raise InstallError(f"corrupt wheelhouse: {exc}") from None


def check_wheelhouse(folder: Path) -> list[dict[str, Any]]:
    """Every wheel must be a readable zip with a RECORD; returns the listing (name, size, sha256)."""
    listing = []
    for wheel in sorted(folder.glob("*.whl")):
        try:
            with zipfile.ZipFile(wheel) as zf:
                if not any(n.endswith(".dist-info/RECORD") for n in zf.namelist()):
                    raise zipfile.BadZipFile("no .dist-info/RECORD")
        except (zipfile.BadZipFile, OSError) as exc:
            raise InstallError(f"corrupt wheelhouse: {wheel.name} is not a valid wheel ({exc})") from None
        listing.append({"name": wheel.name, "bytes": wheel.stat().st_size})
    if not listing:
        raise InstallError(f"wheelhouse {folder} holds no wheels")
    return listing


def fingerprint(
    info: PlatformInfo,
    plan: Plan,
    *,
    python: str,
    wheels: Sequence[Path],
    wheelhouse: Sequence[Any],
    existing: str,
) -> str:
    """Everything that decides the environment's content; unchanged → the Install step is a no-op."""
    found = info.to_dict()
    found.pop("pythons", None)  # a python3.X installed beside the venv's changes nothing in it
    material = {
        "installer": __version__,
        "schema": SCHEMA_VERSION,
        "platform": found,
        "plan": plan.to_dict(),
        "python": python,
        "wheels": {w.name: sha256_file(w) for w in wheels},
        "wheelhouse": list(wheelhouse),
        "existing": existing,
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


_UNREACHABLE = (
    "Failed to establish a new connection",
    "NewConnectionError",
    "Connection refused",
    "Name or service not known",
    "Temporary failure in name resolution",
    "ConnectTimeoutError",
    "Read timed out",
    "Could not fetch URL",
    "No route to host",
)


def _last_error(output: str) -> str:
    """The line of pip's output that says what went wrong (pip prints one `ERROR:` line per cause)."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR:")]
    message = errors[-1] if errors else (lines[-1] if lines else "no output")
    if len(errors) > 1 and "versions: none" in errors[-2]:
        message = errors[-2]  # "Could not find a version ... (from versions: none)" is the useful one
    if message.startswith("ERROR: "):
        message = message[len("ERROR: ") :]
    for line in lines:
        if any(marker in line for marker in _UNREACHABLE):
            return f"the package index is unreachable ({message})"
    return message


def _run(argv: Sequence[str], timeout_s: float, what: str, env: dict[str, str] | None = None) -> str:
    shown = [a if len(a) < 200 else "<script>" for a in argv]
    log.debug("%s: %s", what, " ".join(shown))
    try:
        proc = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout_s, check=False, env=env
        )
    except subprocess.TimeoutExpired:
        raise InstallError(f"{what} timed out after {timeout_s:.0f} s") from None
    except OSError as exc:
        raise InstallError(f"{what} could not start: {exc}") from None
    if proc.returncode != 0:
        raise InstallError(f"{what} failed: {_last_error(proc.stdout + proc.stderr)}")
    return proc.stdout


def _stream(argv: Sequence[str], timeout_s: float, what: str, env: dict[str, str]) -> None:
    """Run a long step (pip) with its output logged line by line as it comes (Greengrass keeps the
    component's log), and its last lines kept for the one-line error."""
    log.info("%s ...", what)
    try:
        proc = subprocess.Popen(
            list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, bufsize=1
        )
    except OSError as exc:
        raise InstallError(f"{what} could not start: {exc}") from None
    fired = threading.Event()

    def kill() -> None:
        fired.set()
        proc.kill()

    timer = threading.Timer(timeout_s, kill)
    timer.start()
    tail: collections.deque[str] = collections.deque(maxlen=400)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line)
            if line.strip():
                log.info("  %s", line.rstrip())
        code = proc.wait()
    finally:
        timer.cancel()
    if fired.is_set():
        raise InstallError(f"{what} timed out after {timeout_s:.0f} s")
    if code != 0:
        raise InstallError(f"{what} failed: {_last_error(''.join(tail))}")


def _python_version(python: str) -> str:
    """The version of interpreter `python` ("3.12.3"), asked of it."""
    out = _run(
        [python, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"], 60, f"running {python}"
    )
    return out.strip()


def _pip_env(use_pip_config: bool = False) -> dict[str, str]:
    """pip's environment. Unless `usePipConfig` is set, the machine's pip configuration (files and
    PIP_* variables: extra indexes, find-links, constraints) is ignored, so the venv holds exactly the
    plan; proxies (HTTPS_PROXY) and certificates (SSL_CERT_FILE) still apply."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the installer itself may run from the wheel on PYTHONPATH
    if not use_pip_config:
        for key in [k for k in env if k.startswith("PIP_")]:
            del env[key]
        env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INPUT"] = "1"
    env.pop("PIP_USER", None)
    return env


# ------------------------------------------------------------------------------------------- verify

# Run by the environment's own Python: argv = model, expected providers (JSON), TensorRT cache folder,
# the folder (or wheel) holding the installer's own `edgeinfer`. The runtime's provider rules come from
# there (stdlib only, like the installer), so the environment is judged as the runtime will judge it,
# by one copy of them, whether or not the project is installed in it.
_VERIFY = r"""
import importlib.metadata as md, json, os, sys
out = {"python": sys.version.split()[0], "packages": {}, "error": None, "version": None,
       "available": [], "loaded": [], "failed": {}}
for d in md.distributions():
    name = d.metadata["Name"]
    if name:
        out["packages"][name] = d.version
sys.path.insert(0, sys.argv[4])  # after the listing: the installer's copy is not installed here
try:
    from edgeinfer.runtime.providers import (
        engine_files, first_line, ort_session, preload_gpu_libraries, tensorrt_backed)
except Exception as exc:
    out["error"] = "the installer's edgeinfer does not import here: %s: %s" % (type(exc).__name__, exc)
    print(json.dumps(out)); sys.exit(0)
try:
    import numpy
    import onnxruntime as ort
except Exception as exc:
    out["error"] = "import failed: %s: %s" % (type(exc).__name__, exc)
    print(json.dumps(out)); sys.exit(0)
out["version"] = ort.__version__
out["available"] = list(ort.get_available_providers())
# CUDA/cuDNN (and TensorRT) from the nvidia-* wheels load only when preloaded, as the runtime does.
gpu = [p for p in json.loads(sys.argv[2]) if p != "CPUExecutionProvider"]
if gpu:
    try:
        out["gpu_libraries"] = preload_gpu_libraries(gpu)
    except Exception as exc:
        out["gpu_libraries"] = "preload failed: %s: %s" % (type(exc).__name__, first_line(exc))
x = numpy.array([[-1.0, 0.0, 1.0, 2.0]], dtype=numpy.float32)
def session(p, options):
    # ORT's own fallback off, as in the runtime: a provider that fails says why, not what replaced it
    so = ort.SessionOptions(); so.log_severity_level = 3
    chain = [p] if p == "CPUExecutionProvider" else [p, "CPUExecutionProvider"]
    return ort_session(sys.argv[1], so, chain, [options, {}][:len(chain)])
def runs(s):
    y = s.run(None, {"x": x})[0]
    return None if y.tolist() == [[0.0, 0.0, 1.0, 2.0]] else "wrong result %s" % (y.tolist(),)
def failure(exc):
    return "%s: %s" % (type(exc).__name__, first_line(exc, 300))
out["tensorrt"] = {}
for p in json.loads(sys.argv[2]):
    try:
        if p == "TensorrtExecutionProvider":
            # Listed first is not enough: ORT lists TensorRT even when no node went to it. An engine
            # in the cache proves one was built, and which precisions build here.
            for precision in ("fp32", "fp16"):
                cache = os.path.join(sys.argv[3], precision)
                os.makedirs(cache, exist_ok=True)
                options = {"trt_engine_cache_enable": True, "trt_engine_cache_path": cache,
                           "trt_fp16_enable": precision == "fp16"}
                before = engine_files(cache)
                try:
                    s = session(p, options)
                    wrong = runs(s) if s.get_providers()[:1] == [p] else None
                    ok, why = tensorrt_backed(s.get_providers(), before, engine_files(cache))
                except Exception as exc:  # one precision that does not build leaves the other standing
                    wrong, ok, why = None, False, failure(exc)
                out["tensorrt"][precision] = why if ok else "no: " + why
                if precision == "fp32" and (wrong or not ok):
                    out["failed"][p] = wrong or why
                    break
            else:
                out["loaded"].append(p)
            continue
        s = session(p, {})
        got = s.get_providers()
        if not got or got[0] != p:
            out["failed"][p] = "did not load (session fell back to %s)" % (got,); continue
        wrong = runs(s)
        if wrong:
            out["failed"][p] = wrong; continue
        out["loaded"].append(p)
    except Exception as exc:
        out["failed"][p] = failure(exc)
print(json.dumps(out))
"""

# The folder (or the wheel, when the installer runs from it) that `import edgeinfer` found.
INSTALLER_ROOT = Path(edgeinfer.__file__).resolve().parent.parent


def verify_environment(python: Path, expected: Sequence[str], timeout_s: float = 300) -> dict[str, Any]:
    """Import ONNX Runtime in `python`'s environment and run a tiny model on every expected provider."""
    if not python.exists():
        raise InstallError(f"no Python at {python}")
    with tempfile.TemporaryDirectory(prefix="edgeinfer-verify-") as tmp:
        model = write_tiny_model(Path(tmp))
        out = _run(
            [
                str(python),
                "-c",
                _VERIFY,
                str(model),
                json.dumps(list(expected)),
                str(Path(tmp) / "trt"),
                str(INSTALLER_ROOT),
            ],
            timeout_s,
            "verify",
            env=_pip_env(),
        )
    try:
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise InstallError(f"verify printed no result: {out[-200:]!r}") from None
    if result.get("error"):
        if not str(result["error"]).startswith("import failed"):
            raise InstallError(f"cannot verify {python}: {result['error']}")
        raise InstallError(f"ONNX Runtime does not import in {python}: {result['error']}")
    ort_dists = sorted(n for n in result["packages"] if n.lower().replace("_", "-") in ORT_PACKAGES)
    if len(ort_dists) != 1:
        raise InstallError(
            f"expected exactly one ONNX Runtime package in {python.parent.parent}, found "
            f"{', '.join(ort_dists) or 'none'}"
        )
    result["onnxruntime_package"] = ort_dists[0]
    if CPU in expected and CPU not in result["loaded"]:
        raise InstallError(f"ONNX Runtime cannot run a model on the CPU: {result['failed'].get(CPU)}")
    return result


# ---------------------------------------------------------------------------------------- build venv

PYPI = "https://pypi.org/simple/"


def check_index(url: str, timeout_s: float) -> None:
    """Fail fast, before anything is created, when a package index cannot be reached at all (pip
    itself only says "no matching distribution"). Any HTTP answer, even 404, counts as reachable."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        if not Path(urllib.request.url2pathname(parsed.path)).exists():
            raise InstallError(f"the package index {url} does not exist")
        return
    try:
        with urllib.request.urlopen(url, timeout=timeout_s):
            return
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise InstallError(f"the package index {url} is unreachable ({reason})") from None


def _index_args(plan: Plan, config: InstallerConfig, wheelhouse: Path | None) -> list[str]:
    args: list[str] = []
    if wheelhouse is not None:
        args += ["--find-links", str(wheelhouse)]
    if config.offline or (wheelhouse is not None and not plan.index_url):
        if wheelhouse is None:
            raise InstallError("offline is set but no wheelhouse was shipped or configured")
        return [*args, "--no-index"]
    if plan.index_url:
        args += ["--index-url", plan.index_url]
    for url in plan.extra_index_urls:
        args += ["--extra-index-url", url]
    return args


def _build_venv(
    target: Path,
    plan: Plan,
    config: InstallerConfig,
    *,
    python: str,
    wheels: Sequence[Path],
    wheelhouse: Path | None,
) -> list[str]:
    """Make the venv and install the plan into it; the optional requirements that did not install."""
    cmd = [python, "-m", "venv"]
    if plan.system_site_packages:
        cmd.append("--system-site-packages")
    _run([*cmd, str(target)], 300, "creating the venv", env=_pip_env(config.use_pip_config))
    vpy = str(target / "bin" / "python")
    constraints = target / "edgeinfer-constraints.txt"
    constraints.write_text("".join(f"{k}=={v}\n" for k, v in plan.constraints.items()), encoding="utf-8")
    pip = [vpy, "-m", "pip", "install", "--no-input", "--progress-bar", "off"]
    pip += ["--timeout", str(config.pip_timeout_seconds), "--retries", str(config.pip_retries)]
    if plan.only_binary:
        # What the pins promise is a wheel for this machine: never hours of a source build instead.
        pip += ["--only-binary", ":all:"]
    index = _index_args(plan, config, wheelhouse)
    env = _pip_env(config.use_pip_config)
    _stream(
        [*pip, *index, "-c", str(constraints), *plan.requirements],
        config.install_timeout_seconds,
        "pip install",
        env,
    )
    if config.install_project and wheels:
        _stream(
            [*pip, "--no-index", "--no-deps", str(wheels[-1])], 300, "installing the edgeinfer wheel", env
        )
    missing: list[str] = []
    if plan.optional:
        extra = (
            []
            if "--no-index" in index
            else [a for u in plan.optional_index_urls for a in ("--extra-index-url", u)]
        )
        try:
            if not config.use_pip_config and "--no-index" not in index:
                for url in plan.optional_index_urls:
                    check_index(url, min(config.pip_timeout_seconds, 30))
            _stream(
                [*pip, *index, *extra, "-c", str(constraints), *plan.optional],
                config.install_timeout_seconds,
                f"pip install {' '.join(plan.optional)}",
                env,
            )
        except InstallError as exc:
            log.warning("%s: the plan stands without them", exc)
            missing = list(plan.optional)
    return missing


def _gc(paths: Paths, current: Path, previous: Path | None, limit: int) -> None:
    """Remove the environments this installer built that are neither active nor the previous one."""
    root = paths.work / "venvs"
    if not root.is_dir():
        return
    keep = {current}
    if previous is not None and limit >= 2:
        keep.add(previous)
    for old in root.iterdir():
        if old.resolve() not in keep:
            shutil.rmtree(old, ignore_errors=True)


def _read_platform(paths: Paths) -> dict[str, Any] | None:
    try:
        data = json.loads(paths.platform_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# ------------------------------------------------------------------------------------------------ run


@dataclass
class _Inputs:
    """What an install reads before it decides: the plan, what ships beside it, and their fingerprint."""

    info: PlatformInfo
    plan: Plan
    existing: str
    wheels: list[Path]
    wheelhouse: Path | None
    listing: list[dict[str, Any]]
    fingerprint: str


@dataclass
class _Environment:
    """The environment to activate: its root, how it came ("install" or "existing"), its verification,
    and the venv this run built (removed again if it is not activated)."""

    target: Path
    mode: str
    verified: dict[str, Any]
    built: Path | None


def _refuse_root(config: InstallerConfig, existing: str, is_root: Callable[[], bool]) -> None:
    if is_root() and not config.allow_root and not existing:
        raise InstallError(
            "refusing to install as root: run the component as the default Greengrass user "
            "(or set allowRoot: true)"
        )


def _inputs(config: InstallerConfig, paths: Paths, source: ProbeSource | None, python: str) -> _Inputs:
    """Probe, allow-list and plan; find the wheels and the wheelhouse; fingerprint all of it."""
    existing = config.existing_venv.strip()
    info = probe(source)
    if source is None and python != sys.executable:
        info.python = _python_version(python)
    plan = choose(info, config)
    for note in plan.notes:
        log.warning("%s", note)
    for detail in plan.details:
        log.info("%s", detail)
    wheels = project_wheels(paths) if config.install_project and not existing else []
    wheelhouse = None if existing else find_wheelhouse(paths, config)
    listing = check_wheelhouse(wheelhouse) if wheelhouse is not None else []
    if config.install_project and not existing and not wheels and paths.artifacts is not None:
        log.warning("no edgeinfer wheel in %s: installing the third-party stack only", paths.artifacts)
    fp = fingerprint(info, plan, python=python, wheels=wheels, wheelhouse=listing, existing=existing)
    return _Inputs(info, plan, existing, wheels, wheelhouse, listing, fp)


def _unchanged(paths: Paths, fp: str) -> dict[str, Any] | None:
    """The active environment's report when it was built for this fingerprint and is still there."""
    previous = _read_platform(paths)
    if (
        previous is not None
        and previous.get("fingerprint") == fp
        and (paths.venv_link / "bin" / "python").exists()
    ):
        return previous
    return None


def _check_can_build(inputs: _Inputs, config: InstallerConfig, python: str) -> None:
    """Before anything is created: a Python that can make a venv, and a package index that answers."""
    refusal = venv_refusal(python, inputs.info.python, os_id=inputs.info.os_id)
    if refusal:
        raise InstallError(refusal)
    plan = inputs.plan
    if not ("--no-index" in _index_args(plan, config, inputs.wheelhouse) or config.use_pip_config):
        for url in [plan.index_url or PYPI, *plan.extra_index_urls]:
            check_index(url, min(config.pip_timeout_seconds, 30))


def _existing_environment(existing: str, plan: Plan) -> _Environment:
    env_root = Path(existing).expanduser().absolute()
    if not (env_root / "bin" / "python").exists():
        raise InstallError(f"existingVenv {env_root} has no bin/python")
    verified = verify_environment(env_root / "bin" / "python", plan.expected_providers)
    return _Environment(env_root, "existing", verified, None)


def _new_environment(inputs: _Inputs, config: InstallerConfig, paths: Paths, python: str) -> _Environment:
    """Build and verify a venv of its own under the work folder; nothing is left of it on failure."""
    plan = inputs.plan
    venvs = paths.work / "venvs"
    venvs.mkdir(parents=True, exist_ok=True)
    built = venvs / f"{inputs.fingerprint[:12]}-{int(time.time() * 1000)}"
    try:
        missing = _build_venv(
            built, plan, config, python=python, wheels=inputs.wheels, wheelhouse=inputs.wheelhouse
        )
        if missing and TENSORRT in plan.expected_providers:
            plan.expected_providers.remove(TENSORRT)
            plan.notes.append(f"TensorRT's libraries did not install ({', '.join(missing)}): CUDA runs")
        verified = verify_environment(built / "bin" / "python", plan.expected_providers)
    except BaseException:
        shutil.rmtree(built, ignore_errors=True)
        with contextlib.suppress(OSError):
            venvs.rmdir()  # only if empty: the first install left nothing behind
        raise
    return _Environment(built, "install", verified, built)


def _check_providers(env: _Environment, config: InstallerConfig) -> None:
    """An expected provider that does not load: refused with requireProviders, else the CPU runs."""
    failed = {p: r for p, r in env.verified["failed"].items() if p != CPU}
    if not failed:
        return
    message = "; ".join(f"{p}: {r}" for p, r in failed.items())
    if config.require_providers:
        if env.built is not None:
            shutil.rmtree(env.built, ignore_errors=True)
        raise InstallError(f"expected execution providers do not load: {message}")
    log.warning("expected execution providers do not load (the runtime will use the CPU): %s", message)


def _report(inputs: _Inputs, env: _Environment, link: Path, seconds: float) -> dict[str, Any]:
    """platform.json: what was found, planned, installed and loaded."""
    plan, verified, wheels = inputs.plan, env.verified, inputs.wheels
    return {
        "schema_version": SCHEMA_VERSION,
        "component": COMPONENT,
        "installer_version": __version__,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "fingerprint": inputs.fingerprint,
        "mode": env.mode,
        "found": inputs.info.to_dict(),
        "allowed_by": plan.rule,
        "plan": plan.to_dict(),
        "installed": {
            "venv": str(link),
            "venv_target": str(env.target),
            "python": verified["python"],
            "onnxruntime": {"package": verified["onnxruntime_package"], "version": verified["version"]},
            "wheelhouse": [w["name"] for w in inputs.listing],
            "project_wheel": wheels[-1].name if wheels else None,
            "packages": dict(sorted(verified["packages"].items())),
        },
        "providers": {
            "expected": plan.expected_providers,
            "available": verified["available"],
            "loaded": verified["loaded"],
            "failed": verified["failed"],
            "tensorrt": verified.get("tensorrt") or {},
        },
        "install_seconds": round(seconds, 3),
    }


def _activate(paths: Paths, env: _Environment, report: dict[str, Any]) -> Path | None:
    """Point the venv link at the environment and write platform.json; on failure the link points back
    at the environment it replaced. The replaced environment's root, if any."""
    link = paths.venv_link
    old_target = link.resolve() if link.is_symlink() else None
    try:
        _link_atomic(link, env.target, paths.work / "venvs" / f"replaced-{int(time.time())}")
        atomic_write(paths.platform_file, (json.dumps(report, indent=2) + "\n").encode("utf-8"))
    except OSError as exc:
        if env.built is not None and old_target is not None:
            _link_atomic(link, old_target, paths.work / "venvs" / "unused")
            shutil.rmtree(env.built, ignore_errors=True)
        raise InstallError(f"cannot activate the environment: {exc}") from None
    return old_target


def run_installer(
    config: InstallerConfig,
    paths: Paths,
    *,
    source: ProbeSource | None = None,
    python: str = sys.executable,
    is_root: Callable[[], bool] = lambda: hasattr(os, "geteuid") and os.geteuid() == 0,
    clock: Callable[[], float] = time.monotonic,
) -> Outcome:
    """The Install step: probe, allow-list, plan, fingerprint → skip, or build + verify + activate."""
    start = clock()
    _refuse_root(config, config.existing_venv.strip(), is_root)
    inputs = _inputs(config, paths, source, python)
    fp = inputs.fingerprint
    previous = _unchanged(paths, fp)
    if previous is not None:
        seconds = clock() - start
        log.info("platform and plan unchanged (fingerprint %s): nothing to do", fp[:12])
        return Outcome(skipped=True, fingerprint=fp, seconds=seconds, report=previous)

    if not inputs.existing:
        _check_can_build(inputs, config, python)
    paths.work.mkdir(parents=True, exist_ok=True)
    if inputs.existing:
        env = _existing_environment(inputs.existing, inputs.plan)
    else:
        env = _new_environment(inputs, config, paths, python)
    _check_providers(env, config)
    report = _report(inputs, env, paths.venv_link, clock() - start)
    old_target = _activate(paths, env, report)
    _gc(paths, env.target.resolve(), old_target, config.keep_venvs)
    verified = env.verified
    log.info(
        "%s ready: %s %s, providers %s (%.1f s)",
        paths.venv_link,
        verified["onnxruntime_package"],
        verified["version"],
        ", ".join(verified["loaded"]),
        report["install_seconds"],
    )
    return Outcome(skipped=False, fingerprint=fp, seconds=clock() - start, report=report)
