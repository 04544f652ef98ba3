"""The Install step for real on this machine: a venv from an offline wheelhouse, the fingerprint skip,
linking an existing environment, and every failure leaving the device as it was."""

from __future__ import annotations

import importlib.metadata as md
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from edgeinfer.errors import EdgeinferError
from edgeinfer.installer import install
from edgeinfer.installer.install import InstallError, Paths, run_installer, verify_environment
from edgeinfer.installer.plan import InstallerConfig, UnsupportedPlatformError
from edgeinfer.installer.probe import RecordedProbe
from edgeinfer.installer.tiny_model import tiny_model_bytes
from tests.helpers.installer_wheels import make_wheel

PLATFORMS = Path(__file__).parent / "platforms"
CPU_HOST = RecordedProbe.load(PLATFORMS / "x86_64_cpu.json")


def offline_config(wheelhouse: Path, versions: dict[str, str], **extra: object) -> InstallerConfig:
    return InstallerConfig.from_mapping(
        {
            "packages": [],  # ONNX Runtime and its own dependencies only: what the wheelhouse holds
            # this environment's own versions: what the wheelhouse was repacked from
            "packageVersions": {"numpy": versions["numpy"], "onnxruntime": versions["onnxruntime"]},
            "wheelhouse": str(wheelhouse),
            "allowRoot": True,
            **extra,
        }
    )


def snapshot(work: Path) -> dict[str, object]:
    """Everything a failed run must leave untouched."""
    link = work / "venv"
    return {
        "files": sorted(str(p.relative_to(work)) for p in work.rglob("*") if "venvs/" not in str(p)),
        "venvs": sorted(p.name for p in (work / "venvs").iterdir()) if (work / "venvs").is_dir() else [],
        "link": str(link.readlink()) if link.is_symlink() else None,
        "platform": (work / "platform.json").read_bytes() if (work / "platform.json").exists() else None,
    }


@pytest.fixture
def linked(tmp_path: Path) -> Paths:
    """A device whose installer already ran: `venv` links this test environment."""
    paths = Paths(work=tmp_path / "work")
    run_installer(InstallerConfig(existing_venv=sys.prefix), paths, source=CPU_HOST)
    return paths


def test_real_install_from_wheelhouse_then_skip(
    tmp_path: Path,
    ort_wheelhouse: Path,
    versions: dict[str, str],
    record_property: Callable[[str, object], None],
) -> None:
    artifacts = tmp_path / "artifacts"
    make_wheel(artifacts, "edgeinfer", "0.1.0", {"edgeinfer_marker.py": "SHIPPED = True\n"})
    paths = Paths(work=tmp_path / "work", artifacts=artifacts)
    config = offline_config(ort_wheelhouse, versions)

    t0 = time.perf_counter()
    first = run_installer(config, paths, source=CPU_HOST)
    install_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    second = run_installer(config, paths, source=CPU_HOST)
    skip_s = time.perf_counter() - t0
    record_property("install_seconds", round(install_s, 3))
    record_property("skip_seconds", round(skip_s, 3))
    print(f"\ninstall {install_s:.2f} s, unchanged re-run {skip_s:.3f} s")

    assert not first.skipped
    assert second.skipped
    assert second.fingerprint == first.fingerprint
    report = json.loads((paths.work / "platform.json").read_text())
    assert report["fingerprint"] == first.fingerprint
    assert report["providers"]["loaded"] == ["CPUExecutionProvider"]
    assert report["installed"]["onnxruntime"] == {
        "package": "onnxruntime",
        "version": versions["onnxruntime"],
    }
    assert report["installed"]["project_wheel"] == "edgeinfer-0.1.0-py3-none-any.whl"
    assert report["installed"]["packages"]["numpy"] == versions["numpy"]
    assert report["plan"]["requirements"] == [f"onnxruntime=={versions['onnxruntime']}"]
    venv_python = paths.work / "venv" / "bin" / "python"
    out = subprocess.run(
        [str(venv_python), "-c", "import edgeinfer_marker, onnxruntime; print(onnxruntime.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == versions["onnxruntime"]
    # the venv is a real directory under the work folder, reached through the `venv` link
    assert (paths.work / "venv").is_symlink()
    assert (paths.work / "venv").resolve().parent == paths.work / "venvs"


def test_existing_venv_is_verified_and_linked_then_skipped(tmp_path: Path) -> None:
    paths = Paths(work=tmp_path / "work")
    config = InstallerConfig(existing_venv=sys.prefix)
    first = run_installer(config, paths, source=CPU_HOST, is_root=lambda: True)  # linking needs no root rule
    assert not first.skipped
    assert (paths.work / "venv").resolve() == Path(sys.prefix).resolve()
    report = json.loads((paths.work / "platform.json").read_text())
    assert report["mode"] == "existing"
    assert "CPUExecutionProvider" in report["providers"]["loaded"]
    assert run_installer(config, paths, source=CPU_HOST).skipped
    # a changed platform is a changed fingerprint
    gpu = RecordedProbe.load(PLATFORMS / "x86_64_cuda11.json")
    again = run_installer(config, paths, source=gpu)
    assert not again.skipped
    assert again.report["plan"]["notes"]


def test_unsupported_platform_leaves_the_device_as_it_was(linked: Paths) -> None:
    before = snapshot(linked.work)
    with pytest.raises(UnsupportedPlatformError, match="unsupported platform: linux armv7l"):
        run_installer(
            InstallerConfig(allow_root=True),
            linked,
            source=RecordedProbe.load(PLATFORMS / "raspberry_pi_armv7.json"),
        )
    assert snapshot(linked.work) == before


def test_root_is_refused_unless_configured(linked: Paths) -> None:
    before = snapshot(linked.work)
    with pytest.raises(InstallError, match="refusing to install as root"):
        run_installer(InstallerConfig(), linked, source=CPU_HOST, is_root=lambda: True)
    assert snapshot(linked.work) == before


def test_corrupt_wheelhouse_is_refused_before_anything_changes(linked: Paths, tmp_path: Path) -> None:
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    (wheelhouse / "onnxruntime-1.32.0-py3-none-any.whl").write_bytes(b"PK\x03\x04 truncated")
    before = snapshot(linked.work)
    with pytest.raises(InstallError, match=r"corrupt wheelhouse: onnxruntime-1\.32\.0-py3-none-any\.whl"):
        run_installer(InstallerConfig(wheelhouse=str(wheelhouse), allow_root=True), linked, source=CPU_HOST)
    assert snapshot(linked.work) == before


def test_unreachable_index_is_one_clear_line(linked: Paths) -> None:
    before = snapshot(linked.work)
    config = InstallerConfig(index_url="http://127.0.0.1:9/simple", allow_root=True, pip_timeout_seconds=2)
    with pytest.raises(InstallError, match=r"package index http://127\.0\.0\.1:9/simple is unreachable"):
        run_installer(config, linked, source=CPU_HOST)
    assert snapshot(linked.work) == before


def test_wheel_that_fails_to_install_removes_the_half_built_venv(
    linked: Paths, tmp_path: Path, versions: dict[str, str]
) -> None:
    # A well-formed wheel filed under the wrong name: pip finds it, then refuses to install it.
    wheelhouse = tmp_path / "wheelhouse"
    wheel = make_wheel(wheelhouse, "other-package", versions["onnxruntime"], {"onnxruntime/__init__.py": ""})
    wheel.rename(wheelhouse / f"onnxruntime-{versions['onnxruntime']}-py3-none-any.whl")
    before = snapshot(linked.work)
    with pytest.raises(InstallError, match="pip install failed") as err:
        run_installer(offline_config(wheelhouse, versions), linked, source=CPU_HOST)
    assert "\n" not in str(err.value)
    assert snapshot(linked.work) == before


def test_missing_existing_venv_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InstallError, match="has no bin/python"):
        run_installer(
            InstallerConfig(existing_venv=str(tmp_path / "nope")), Paths(work=tmp_path / "w"), source=CPU_HOST
        )


def test_cli_prints_one_line_and_exits_non_zero(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgeinfer.installer",
            "--work",
            str(tmp_path / "work"),
            "--probe-recording",
            str(PLATFORMS / "macos_arm64.json"),
            "-o",
            "allowRoot=true",
            "-o",
            "existingVenv={configuration:/existingVenv}",
            "-q",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert proc.stderr.startswith("edgeinfer.installer: error: unsupported platform: darwin aarch64")
    assert not (tmp_path / "work").exists()


def test_cli_links_existing_venv_with_recipe_style_options(tmp_path: Path) -> None:
    work = tmp_path / "work"
    argv = [
        sys.executable,
        "-m",
        "edgeinfer.installer",
        "--work",
        str(work),
        "--probe-recording",
        str(PLATFORMS / "x86_64_cpu.json"),
        "-o",
        f"existingVenv={sys.prefix}",
        "-o",
        'allowList=[{"name": "ci", "architectures": ["x86_64"], "accelerators": ["cpu"]}]',
        "-o",
        "enableTensorRT=false",
    ]
    assert subprocess.run(argv, capture_output=True, check=False).returncode == 0
    assert json.loads((work / "platform.json").read_text())["allowed_by"] == "ci"
    second = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert second.returncode == 0
    assert "unchanged, skipped" in second.stdout


def test_the_probe_model_is_the_relu_graph() -> None:
    onnx = pytest.importorskip("onnx")
    model = onnx.load_from_string(tiny_model_bytes())
    onnx.checker.check_model(model)
    assert [n.op_type for n in model.graph.node] == ["Relu"]
    assert [i.name for i in model.graph.input] == ["x"]


def test_errors_are_edgeinfer_errors() -> None:
    assert issubclass(InstallError, EdgeinferError)
    assert issubclass(UnsupportedPlatformError, EdgeinferError)


def fake_venv(root: Path, report: dict[str, object]) -> Path:
    """An environment whose `python` answers the verification with a canned report."""
    (root / "bin").mkdir(parents=True)
    python = root / "bin" / "python"
    python.write_text(f"#!/bin/sh\ncat <<'EOF'\n{json.dumps(report)}\nEOF\n")
    python.chmod(0o755)
    return root


def verification(**extra: object) -> dict[str, object]:
    report: dict[str, object] = {
        "python": "3.11.7",
        "packages": {"onnxruntime-gpu": "1.32.0", "numpy": "2.4.6"},
        "error": None,
        "version": "1.32.0",
        "available": ["CUDAExecutionProvider", "CPUExecutionProvider"],
        "loaded": ["CPUExecutionProvider"],
        "failed": {"CUDAExecutionProvider": "did not load (session fell back to ['CPUExecutionProvider'])"},
    }
    report.update(extra)
    return report


def test_two_onnxruntime_packages_are_refused(tmp_path: Path) -> None:
    venv = fake_venv(
        tmp_path / "env", verification(packages={"onnxruntime": "1.32.0", "onnxruntime-gpu": "1.32.0"})
    )
    with pytest.raises(
        InstallError, match=r"exactly one ONNX Runtime package .* onnxruntime, onnxruntime-gpu"
    ):
        run_installer(InstallerConfig(existing_venv=str(venv)), Paths(work=tmp_path / "w"), source=CPU_HOST)


def test_gpu_provider_that_does_not_load_is_reported_or_refused(tmp_path: Path) -> None:
    gpu = RecordedProbe.load(PLATFORMS / "x86_64_cuda.json")
    venv = fake_venv(tmp_path / "env", verification())
    paths = Paths(work=tmp_path / "w")
    with pytest.raises(InstallError, match="expected execution providers do not load: CUDAExecutionProvider"):
        run_installer(InstallerConfig(existing_venv=str(venv), require_providers=True), paths, source=gpu)
    assert not paths.work.joinpath("platform.json").exists()
    run_installer(InstallerConfig(existing_venv=str(venv)), paths, source=gpu)
    report = json.loads(paths.work.joinpath("platform.json").read_text())
    assert report["providers"]["expected"] == [
        "TensorrtExecutionProvider",
        "CUDAExecutionProvider",
        "CPUExecutionProvider",
    ]
    assert report["providers"]["loaded"] == ["CPUExecutionProvider"]
    assert "CUDAExecutionProvider" in report["providers"]["failed"]
    assert report["installed"]["onnxruntime"]["package"] == "onnxruntime-gpu"


def test_onnxruntime_that_does_not_import_is_refused(tmp_path: Path) -> None:
    venv = fake_venv(tmp_path / "env", verification(error="import failed: ImportError: numpy ABI mismatch"))
    with pytest.raises(InstallError, match=r"ONNX Runtime does not import .*numpy ABI mismatch"):
        run_installer(InstallerConfig(existing_venv=str(venv)), Paths(work=tmp_path / "w"), source=CPU_HOST)


def test_the_shipped_wheelhouse_is_found_and_offline_needs_one(tmp_path: Path) -> None:
    from edgeinfer.installer.install import find_wheelhouse

    unpacked = tmp_path / "unpacked"
    paths = Paths(work=tmp_path / "w", unpacked=unpacked)
    assert find_wheelhouse(paths, InstallerConfig()) is None
    (unpacked / "wheelhouse").mkdir(parents=True)
    assert find_wheelhouse(paths, InstallerConfig()) == unpacked / "wheelhouse"
    with pytest.raises(InstallError, match=r"wheelhouse .*nope does not exist"):
        find_wheelhouse(paths, InstallerConfig(wheelhouse=str(tmp_path / "nope")))
    with pytest.raises(InstallError, match="offline is set but no wheelhouse"):
        run_installer(
            InstallerConfig(offline=True, allow_root=True), Paths(work=tmp_path / "w2"), source=CPU_HOST
        )
    assert not (tmp_path / "w2").exists()


def test_a_wheelhouse_the_nucleus_left_packed_is_unpacked_into_the_work_folder(tmp_path: Path) -> None:
    import zipfile

    from edgeinfer.installer.install import find_wheelhouse

    artifacts, unpacked, work = tmp_path / "art", tmp_path / "unz", tmp_path / "w"
    artifacts.mkdir()
    with zipfile.ZipFile(artifacts / "wheelhouse.zip", "w") as zf:
        zf.writestr("tiny-1.0-py3-none-any.whl", b"wheel")
    paths = Paths(work=work, artifacts=artifacts, unpacked=unpacked)
    # Nucleus lite on a local deployment: no unpacked folder at all, or an empty one.
    ours = find_wheelhouse(paths, InstallerConfig())
    assert ours is not None
    assert ours.parent == work / "wheelhouses"
    assert [p.name for p in ours.iterdir()] == ["tiny-1.0-py3-none-any.whl"]
    (unpacked / "wheelhouse").mkdir(parents=True)
    assert find_wheelhouse(paths, InstallerConfig()) == ours
    # The classic nucleus unpacked it: its folder, and nothing unpacked again.
    (unpacked / "wheelhouse" / "tiny-1.0-py3-none-any.whl").write_bytes(b"wheel")
    assert find_wheelhouse(paths, InstallerConfig()) == unpacked / "wheelhouse"
    # A configured wheelhouse still wins; a corrupt archive is one line.
    assert find_wheelhouse(paths, InstallerConfig(wheelhouse=str(artifacts))) == artifacts
    (artifacts / "wheelhouse.zip").write_bytes(b"PK\x03\x04 truncated")
    (unpacked / "wheelhouse" / "tiny-1.0-py3-none-any.whl").unlink()
    with pytest.raises(InstallError, match=r"^corrupt wheelhouse: cannot read .*wheelhouse\.zip"):
        find_wheelhouse(paths, InstallerConfig())


def test_real_offline_install_from_a_wheelhouse_zip_the_nucleus_did_not_unpack(
    tmp_path: Path, ort_wheelhouse: Path, versions: dict[str, str]
) -> None:
    import zipfile

    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    with zipfile.ZipFile(artifacts / "wheelhouse.zip", "w") as zf:
        for wheel in sorted(ort_wheelhouse.glob("*.whl")):
            zf.write(wheel, wheel.name)
    unpacked = tmp_path / "artifacts-unarchived"
    unpacked.mkdir()  # lite on a local deployment: made, left empty
    paths = Paths(work=tmp_path / "work", artifacts=artifacts, unpacked=unpacked)
    config = InstallerConfig.from_mapping(
        {
            "packages": [],
            "packageVersions": {"numpy": versions["numpy"], "onnxruntime": versions["onnxruntime"]},
            "offline": True,  # never an index: the shipped wheels or nothing
            "installProject": False,
            "allowRoot": True,
        }
    )
    first = run_installer(config, paths, source=CPU_HOST)
    assert not first.skipped
    assert first.report["installed"]["onnxruntime"]["version"] == versions["onnxruntime"]
    assert first.report["installed"]["wheelhouse"] == sorted(p.name for p in ort_wheelhouse.glob("*.whl"))
    assert run_installer(config, paths, source=CPU_HOST).skipped
    # Unpacked by the nucleus instead (the classic one): the same fingerprint, nothing to do.
    shutil.copytree(ort_wheelhouse, unpacked / "wheelhouse")
    assert run_installer(config, paths, source=CPU_HOST).fingerprint == first.fingerprint


def test_an_interpreter_without_venv_is_refused_before_anything_changes(
    linked: Paths, tmp_path: Path
) -> None:
    # Debian's and Ubuntu's python3.X without python3.X-venv: `import ensurepip` fails.
    python = tmp_path / "python3.12"
    python.write_text("#!/bin/sh\nexit 1\n")
    python.chmod(0o755)
    ubuntu = RecordedProbe.load(PLATFORMS / "ubuntu2404_x86_64.json")
    before = snapshot(linked.work)
    with pytest.raises(InstallError) as err:
        run_installer(InstallerConfig(allow_root=True), linked, source=ubuntu, python=str(python))
    assert str(err.value) == (
        f"{python} (Python 3.12) cannot make a venv: it has no venv/ensurepip module; "
        "sudo apt install python3.12-venv"
    )
    assert snapshot(linked.work) == before


def test_optional_requirements_that_do_not_install_leave_the_plan_standing(
    tmp_path: Path, ort_wheelhouse: Path, versions: dict[str, str]
) -> None:
    # TensorRT's wheels are optional: without them the CUDA provider still runs.
    from edgeinfer.installer.install import _build_venv
    from edgeinfer.installer.plan import choose
    from edgeinfer.installer.probe import probe

    config = offline_config(ort_wheelhouse, versions)
    plan = choose(probe(CPU_HOST), config)
    plan.requirements = [f"packaging=={md.version('packaging')}"]  # small: the step under test is the next
    plan.optional = ["tensorrt-cu12-libs==10.16.1.11"]  # not in the wheelhouse
    plan.optional_index_urls = ["https://pypi.nvidia.com"]
    target = tmp_path / "venv"
    missing = _build_venv(target, plan, config, python=sys.executable, wheels=[], wheelhouse=ort_wheelhouse)
    assert missing == ["tensorrt-cu12-libs==10.16.1.11"]
    assert (target / "bin" / "python").exists()


# ORT's native session made to fail a TensorRT session's initialisation, as a TensorRT that cannot
# build the engine does; ORT's Python layer above it (its own fallback included) is the real one.
_FAILING_TENSORRT = """
from onnxruntime.capi import _pybind_state as C


class _Session(C.InferenceSession):
    def initialize_session(self, providers, *args):
        if "TensorrtExecutionProvider" in providers:
            raise RuntimeError("TensorRT EP could not build the engine (simulated)\\nand a second line")
        return super().initialize_session(providers, *args)


C.InferenceSession = _Session
"""


def _python_with(tmp_path: Path, sitecustomize: str) -> Path:
    """This environment's Python with `sitecustomize` run at its start."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(sitecustomize)
    python = tmp_path / "env" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nPYTHONPATH={shim} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return python


def test_a_tensorrt_session_that_fails_reports_its_own_reason(tmp_path: Path) -> None:
    # With ORT's fallback on, the session would be remade on the CPU and reported only as "fell back".
    python = _python_with(tmp_path, _FAILING_TENSORRT)
    result = verify_environment(python, ["TensorrtExecutionProvider", "CPUExecutionProvider"])
    reason = "RuntimeError: TensorRT EP could not build the engine (simulated)"
    assert result["failed"] == {"TensorrtExecutionProvider": reason}
    assert result["tensorrt"] == {"fp32": "no: " + reason}
    assert result["loaded"] == ["CPUExecutionProvider"]


def test_an_installer_copy_that_does_not_import_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = tmp_path / "root" / "edgeinfer"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('half-extracted')\n")
    monkeypatch.setattr(install, "INSTALLER_ROOT", broken.parent)
    with pytest.raises(InstallError) as err:
        verify_environment(Path(sys.executable), ["CPUExecutionProvider"])
    assert str(err.value) == (
        f"cannot verify {sys.executable}: the installer's edgeinfer does not import here: "
        "ImportError: half-extracted"
    )
