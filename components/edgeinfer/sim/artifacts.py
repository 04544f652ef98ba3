"""The kernel root's packages/ and work/ folders, as a local deployment lays them out.

`packages/artifacts/<Component>/<Version>/` is the component's artifact folder (a link to the
`--artifactDir` folder greengrass-cli was given, or a folder holding the files that `file:` URIs
name), `packages/artifacts-unarchived/...` holds ZIP artifacts unpacked (nucleus lite leaves it
empty on a local deployment: it unpacks only what it downloads), and `work/<Component>/` is
its working folder, owned by the user it runs as. Everything is checked before anything is laid out.
"""

from __future__ import annotations

import os
import shutil
import stat
import zipfile
from collections.abc import Iterable
from pathlib import Path

from edgeinfer.greengrass.nuclei import NucleusProfile
from edgeinfer.greengrass.recipe import Recipe, RecipeError, artifact_local_path
from edgeinfer.sim.users import RunAs

__all__ = ["Layout", "extract_zip"]


class Layout:
    """Where each component's artifacts and work folder are, and the variables that name them."""

    def __init__(self, root: Path, artifacts_dir: Path | None, profile: NucleusProfile) -> None:
        self.root = root
        self.artifacts_dir = artifacts_dir
        self.profile = profile
        self.paths: dict[str, dict[str, str]] = {}

    def folders(self, recipe: Recipe) -> tuple[Path, Path, Path]:
        art = self.root / "packages" / "artifacts" / recipe.name / recipe.version
        unz = self.root / "packages" / "artifacts-unarchived" / recipe.name / recipe.version
        return art, unz, self.root / "work" / recipe.name

    def sources(self, recipe: Recipe) -> dict[str, Path]:
        """Artifact file name → the file it is deployed from; RecipeError naming the URI if missing."""
        folder = (self.artifacts_dir / recipe.name / recipe.version) if self.artifacts_dir else None
        out: dict[str, Path] = {}
        for artifact in recipe.artifacts:
            if artifact.uri.lower().startswith("docker:"):
                continue
            local = artifact_local_path(artifact.uri)
            candidates = [p for p in (folder / artifact.filename if folder else None, local) if p is not None]
            found = next((p for p in candidates if p.is_file()), None)
            if found is None:
                where = candidates[0] if candidates else f"<artifacts>/{recipe.name}/{recipe.version}"
                raise RecipeError(f"{recipe.file}: {artifact.field}: artifact not found at {where}")
            out[artifact.filename] = found
        return out

    def plan(self, recipes: Iterable[Recipe]) -> dict[str, dict[str, Path]]:
        """Check every recipe's artifacts and name its paths (nothing written yet)."""
        slash = "/" if self.profile.trailing_slash_paths else ""
        plan: dict[str, dict[str, Path]] = {}
        for recipe in recipes:
            art, unz, work = self.folders(recipe)
            plan[recipe.name] = self.sources(recipe)
            self.paths[recipe.name] = {
                "artifacts:path": str(art) + slash,
                "artifacts:decompressedPath": str(unz) + slash,
                "work:path": str(work) + slash,
            }
        return plan

    def lay_out(self, recipe: Recipe, sources: dict[str, Path], run_as: RunAs | None) -> None:
        """Write the component's folders: artifacts linked (or copied in for `file:` URIs), ZIPs
        unpacked, the work folder made and owned by `run_as`."""
        art, unz, work = self.folders(recipe)
        art.parent.mkdir(parents=True, exist_ok=True)
        if art.is_symlink() or art.is_file():
            art.unlink()
        elif art.is_dir():
            shutil.rmtree(art)
        folder = (self.artifacts_dir / recipe.name / recipe.version) if self.artifacts_dir else None
        if folder is not None and folder.is_dir() and all(p.parent == folder for p in sources.values()):
            art.symlink_to(folder.resolve(), target_is_directory=True)
        else:
            art.mkdir(parents=True, exist_ok=True)
            for name, src in sources.items():
                os.symlink(src.resolve(), art / name)
        for artifact in recipe.artifacts if self.profile.unarchives_local_artifacts else ():
            if artifact.unarchive == "ZIP" and artifact.filename in sources:
                archive = sources[artifact.filename]
                dest = unz / archive.name.rsplit(".", 1)[0]
                try:
                    extract_zip(archive, dest)
                except (zipfile.BadZipFile, OSError) as exc:
                    raise RecipeError(f"{recipe.file}: {artifact.field}: cannot unarchive: {exc}") from exc
        unz.mkdir(parents=True, exist_ok=True)
        work.mkdir(parents=True, exist_ok=True)
        if run_as is not None:
            os.chown(work, run_as.uid, run_as.gid)
            for folder_on_way in (self.root / "work", self.root):
                mode = folder_on_way.stat().st_mode
                folder_on_way.chmod(mode | 0o055)  # the nucleus's root is searchable by its users


def extract_zip(archive: Path, dest: Path) -> None:
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            target = (tmp / info.filename).resolve()
            if not str(target).startswith(str(tmp.resolve()) + os.sep) and target != tmp.resolve():
                raise RecipeError(f"{archive}: unsafe path in archive: {info.filename}")
            zf.extract(info, tmp)
            mode = (info.external_attr >> 16) & 0o777
            if mode and not info.is_dir():
                os.chmod(target, mode | stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
