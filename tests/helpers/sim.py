"""Helpers for the simulated-core tests: recipes and artifacts in a tmp greengrass-cli layout."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import yaml

PYTHON = sys.executable
BOTH_NUCLEI = {"os": "linux", "runtime": "*"}  # a Platform both nuclei read (lite needs the runtime)
ALLOW_ALL = {
    "aws.greengrass.ipc.pubsub": {"all": {"operations": ["*"], "resources": ["*"]}},
    "aws.greengrass.ipc.mqttproxy": {"all": {"operations": ["*"], "resources": ["*"]}},
}


class Device:
    """A recipes/ + artifacts/ pair under tmp_path. `platform` is the manifests' Platform where `add`
    names none (default: `{"os": "linux"}`, which nucleus lite does not read)."""

    def __init__(self, root: Path, platform: dict[str, str] | None = None) -> None:
        self.platform = platform or {"os": "linux"}
        self.recipes = root / "recipes"
        self.artifacts = root / "artifacts"
        self.recipes.mkdir(parents=True)
        self.artifacts.mkdir(parents=True)

    def add(
        self,
        name: str,
        version: str = "1.0.0",
        *,
        lifecycle: dict[str, Any] | None = None,
        config: dict[str, Any] | None = None,
        access: dict[str, Any] | None = None,
        deps: dict[str, Any] | None = None,
        files: dict[str, str | bytes] | None = None,
        artifacts: list[dict[str, Any]] | None = None,
        fmt: str = "yaml",
        extra: dict[str, Any] | None = None,
        platform: dict[str, str] | None = None,
    ) -> Path:
        art_dir = self.artifacts / name / version
        for filename, content in (files or {}).items():
            art_dir.mkdir(parents=True, exist_ok=True)
            data = content if isinstance(content, bytes) else textwrap.dedent(content).encode()
            (art_dir / filename).write_bytes(data)
        default = dict(config or {})
        if access is not None:
            default["accessControl"] = access
        recipe: dict[str, Any] = {
            "RecipeFormatVersion": "2020-01-25",
            "ComponentName": name,
            "ComponentVersion": version,
            "ComponentConfiguration": {"DefaultConfiguration": default},
            "Manifests": [
                {
                    "Platform": platform or self.platform,
                    "Lifecycle": lifecycle or {},
                    "Artifacts": artifacts
                    if artifacts is not None
                    else [{"URI": f"s3://bucket/{name}/{f}"} for f in (files or {})],
                }
            ],
        }
        if deps:
            recipe["ComponentDependencies"] = deps
        recipe.update(extra or {})
        path = self.recipes / f"{name}-{version}.{fmt}"
        path.write_text(json.dumps(recipe, indent=2) if fmt == "json" else yaml.safe_dump(recipe))
        return path
