"""`edgeinfer build`: artifacts/, recipes with digests and greengrass-build/ (see `build`)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "build",
        help="build the Greengrass bundle: artifacts/, recipes with digests, greengrass-build/",
        description=(
            "Build every component's artifacts into artifacts/<Component>/<Version>/ (a wheel of the "
            "project for the code components, the model files written by 'edgeinfer model build' for "
            "the model store), the recipes with artifact digests and the GDK layout greengrass-build/. "
            "Then 'greengrass-cli deployment create --recipeDir recipes --artifactDir artifacts' works "
            "as-is. Quick and idempotent. The recipes are first checked against both Greengrass nuclei "
            "(classic and lite): one that a nucleus would refuse is not built (--check lists why)."
        ),
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="only say, per recipe, what each nucleus would refuse (file:line: field: reason); exit 1 if any",
    )
    parser.add_argument(
        "--nucleus",
        action="append",
        choices=["classic", "lite"],
        default=[],
        help="hold the recipes to this nucleus only (repeat; default: both)",
    )
    parser.add_argument("--project", type=Path, help="project root (default: found from the current folder)")
    parser.add_argument("--artifacts", type=Path, help="artifact folder (default: <project>/artifacts)")
    parser.add_argument("--out", type=Path, help="GDK layout folder (default: <project>/greengrass-build)")
    parser.add_argument(
        "--component", action="append", default=[], metavar="NAME", help="build only this component (repeat)"
    )
    parser.add_argument(
        "--gdk",
        metavar="NAME",
        help="GDK custom build of one component (what gdk-config.json runs): ./greengrass-build/ as "
        "'gdk component publish' reads it",
    )
    parser.add_argument(
        "--wheelhouse",
        type=Path,
        metavar="DIR",
        help="ship these wheels as the installer's offline wheelhouse (wheelhouse.zip)",
    )
    parser.set_defaults(func=run)


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def check(args: argparse.Namespace) -> int:
    from edgeinfer.bundle.build import NUCLEI, check_recipes, find_project, stale_gdk_configs

    project = find_project(args.project)
    nuclei = tuple(dict.fromkeys(args.nucleus)) or NUCLEI
    refused = 0
    results = check_recipes(project, nuclei)
    versions = {r.name: r.version for r in results}
    stale = stale_gdk_configs(project, versions)
    for file, name, have in stale:
        print(
            f"{_shown(file)}: {name} {have}, the bundle builds {versions[name]}: the GDK would publish "
            f"{have} (a plain 'edgeinfer build' writes {versions[name]} there)"
        )
    for result in results:
        verdicts = ", ".join(f"{n} {'ok' if not result.findings[n] else 'refuses'}" for n in nuclei)
        print(f"{_shown(result.file)}: {result.name}: {verdicts}")
        for nucleus in nuclei:
            for finding in result.findings[nucleus]:
                refused += 1
                line = f":{finding.line}" if finding.line else ""
                print(f"  {_shown(finding.file)}{line}: {finding.field}: {finding.reason} ({nucleus})")
    if refused:
        print(f"{refused} finding(s): a nucleus would refuse these recipes", file=sys.stderr)
    return 1 if refused or stale else 0


def run(args: argparse.Namespace) -> int:
    from edgeinfer.bundle.build import NUCLEI, build_bundle

    if args.check:
        return check(args)
    start = time.perf_counter()
    bundle = build_bundle(
        args.project,
        artifacts_dir=args.artifacts,
        out_dir=args.out,
        only=args.component,
        gdk=args.gdk,
        wheelhouse=args.wheelhouse,
        nuclei=tuple(dict.fromkeys(args.nucleus)) or NUCLEI,
    )
    for comp in bundle.components:
        size = sum(a.size for a in comp.artifacts)
        files = ", ".join(a.filename for a in comp.artifacts) or "no artifacts"
        print(f"{comp.name} {comp.version}: {files} ({size / 1e6:.1f} MB)")
    print(
        f"built {len(bundle.components)} component(s) in {time.perf_counter() - start:.2f} s: "
        f"{bundle.artifacts_dir}, {bundle.out_dir}",
        file=sys.stderr,
    )
    return 0
