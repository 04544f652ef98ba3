"""`edgeinfer publish`: the built bundle to S3 and AWS IoT Greengrass as private component versions.

1. Checks first, changes nothing until they all pass: credentials (STS), the bucket exists and is in
   the target region (Greengrass reads artifacts from the deployment's region), and for every
   component whether its version already exists. An existing version whose artifact digests equal
   ours is skipped; one with different digests is refused (a published version is immutable: bump
   `edgeinfer.__version__`).
2. Uploads every artifact to `s3://<bucket>/<component>/<version>/<file>`: the bucket is exactly the
   name given, or, when none is, the one `gdk component publish` uses for this project (the
   gdk-config.json `publish.bucket` prefix with `-<region>-<account>` appended, `gdk_bucket`), so that
   the two tools publish to the same place and each skips what the other published. Pass an
   `edgeinfer.progress.Progress` (bytes) to show a bar per upload.
3. Creates the component versions in dependency order, with the artifact URIs rewritten and digests
   set, and waits until each is DEPLOYABLE.

Run twice, the second run uploads and creates nothing. boto3 is imported by the caller
(`edgeinfer_cloud.aws_cli`); this module takes ready clients, so tests pass moto's S3 and a
greengrassv2 client under botocore's Stubber.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeinfer.bundle.build import PLACEHOLDER_PREFIX, Bundle, Component, gdk_config_files
from edgeinfer.errors import EdgeinferError
from edgeinfer.greengrass.recipe import artifact_filename, cget
from edgeinfer.progress import Progress
from edgeinfer_cloud.policies import partition_for

__all__ = [
    "Clients",
    "PublishError",
    "PublishReport",
    "component_arn",
    "gdk_bucket",
    "partition_for",
    "publish",
    "recipe_for_cloud",
]

log = logging.getLogger(__name__)

Say = Callable[[str], None]
_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


class PublishError(EdgeinferError):
    """Publishing cannot proceed: one line that says why and what to do."""


@dataclass
class Clients:
    """boto3 clients for one region (`sts`, `s3`, `greengrassv2`)."""

    sts: Any
    s3: Any
    greengrassv2: Any


@dataclass
class PublishReport:
    account: str
    bucket: str
    region: str
    created: list[str] = field(default_factory=list)  # "name version"
    skipped: list[str] = field(default_factory=list)
    uploaded: list[str] = field(default_factory=list)  # s3 keys
    dry_run: bool = False


def component_arn(region: str, account: str, name: str, version: str) -> str:
    return f"arn:{partition_for(region)}:greengrass:{region}:{account}:components:{name}:versions:{version}"


def _key(comp: Component, filename: str) -> str:
    return f"{comp.name}/{comp.version}/{filename}"


def recipe_for_cloud(comp: Component, bucket: str) -> dict[str, Any]:
    """The built recipe (digests set) with every artifact URI pointing at the bucket."""
    recipe = comp.built_recipe()
    for manifest in cget(recipe, "Manifests") or []:
        for art in cget(manifest, "Artifacts") or []:
            key = next(k for k in art if k.lower() == "uri")
            uri = str(art[key])
            filename = artifact_filename(uri)
            if uri.startswith((PLACEHOLDER_PREFIX, "s3://BUCKET_NAME/")):
                art[key] = f"s3://{bucket}/{_key(comp, filename)}"
    return recipe


def gdk_bucket(root: Path, region: str, account: str) -> str:
    """The bucket `gdk component publish` uploads this project's artifacts to: the `publish.bucket`
    prefix of its gdk-config.json files (one for all), `-<region>-<account>` appended, as GDK's
    `ComponentPublishConfiguration` does."""
    prefixes = set()
    for file in gdk_config_files(root):
        try:
            for settings in json.loads(file.read_text(encoding="utf-8"))["component"].values():
                prefixes.add(str(settings["publish"]["bucket"]).strip())
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise PublishError(f"{file}: no publish.bucket to take the GDK's bucket from") from None
    if len(prefixes) != 1:
        found = ", ".join(sorted(prefixes)) or "none"
        raise PublishError(f"the gdk-config.json files name {found} as publish.bucket: pass --bucket")
    return f"{prefixes.pop()}-{region}-{account}"


def _error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


def _aws_message(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        err = response.get("Error", {})
        return f"{err.get('Code', '')}: {err.get('Message', '')}".strip(": ")
    return str(exc)


def _account(clients: Clients) -> str:
    identity = clients.sts.get_caller_identity()
    return str(identity["Account"])


def _check_bucket(clients: Clients, bucket: str, region: str) -> None:
    try:
        location = clients.s3.get_bucket_location(Bucket=bucket).get("LocationConstraint")
    except Exception as exc:
        code = _error_code(exc)
        if code == "NoSuchBucket":
            raise PublishError(
                f"bucket {bucket} does not exist (create it in {region}; the name is used exactly as given)"
            ) from None
        if code in ("AccessDenied", "AllAccessDisabled"):
            raise PublishError(f"no access to bucket {bucket}: {_aws_message(exc)}") from None
        raise
    bucket_region = {None: "us-east-1", "": "us-east-1", "EU": "eu-west-1"}.get(location, location)
    if bucket_region != region:
        raise PublishError(
            f"bucket {bucket} is in {bucket_region}, not {region}: Greengrass needs the artifacts in the "
            f"region of the components (use a bucket in {region} or --region {bucket_region})"
        )


def _check_bucket_name(bucket: str, how: str) -> None:
    if not _BUCKET_RE.fullmatch(bucket) or ".." in bucket:
        raise PublishError(
            f"invalid S3 bucket name {bucket!r}: 3-63 lower-case letters, digits, dots and hyphens ({how})"
        )


def _existing_digests(clients: Clients, arn: str) -> dict[str, str] | None:
    """filename → digest of the published version, or None when it does not exist."""
    try:
        response = clients.greengrassv2.get_component(arn=arn, recipeOutputFormat="JSON")
    except Exception as exc:
        if _error_code(exc) == "ResourceNotFoundException":
            return None
        raise
    raw = response["recipe"]
    recipe = json.loads(raw.read() if hasattr(raw, "read") else raw)
    digests: dict[str, str] = {}
    for manifest in cget(recipe, "Manifests") or []:
        for art in cget(manifest, "Artifacts") or []:
            filename = artifact_filename(str(cget(art, "Uri") or ""))
            digests[filename] = str(cget(art, "Digest") or "")
    return digests


def _upload(
    clients: Clients, comp: Component, bucket: str, report: PublishReport, say: Say, *, progress: Progress
) -> None:
    for art in comp.artifacts:
        key = _key(comp, art.filename)
        try:
            head = clients.s3.head_object(Bucket=bucket, Key=key)
            if head.get("Metadata", {}).get("sha256") == art.sha256:
                continue
        except Exception as exc:
            if _error_code(exc) not in ("404", "NoSuchKey", "NotFound"):
                raise
        say(f"  uploading s3://{bucket}/{key} ({art.size / 1e6:.1f} MB)")
        with progress.step(art.filename, art.size) as tick:
            clients.s3.upload_file(
                str(art.path), bucket, key, ExtraArgs={"Metadata": {"sha256": art.sha256}}, Callback=tick
            )
        report.uploaded.append(key)


def _wait_deployable(
    clients: Clients,
    arn: str,
    *,
    name: str,
    timeout_s: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> None:
    deadline = clock() + timeout_s
    while True:
        status = clients.greengrassv2.describe_component(arn=arn).get("status", {})
        state = status.get("componentState")
        if state == "DEPLOYABLE":
            return
        if state == "FAILED":
            errors = "; ".join(f"{k}: {v}" for k, v in (status.get("errors") or {}).items())
            raise PublishError(
                f"{name}: Greengrass refused the component: {status.get('message', '')} {errors}"
            )
        if clock() >= deadline:
            raise PublishError(
                f"{name}: still {state} after {timeout_s:.0f} s (check the Greengrass console)"
            )
        sleep(2.0)


def publish(
    bundle: Bundle,
    bucket: str | None,
    region: str,
    clients: Clients,
    *,
    dry_run: bool = False,
    say: Say = lambda line: log.info("%s", line),
    wait_timeout_s: float = 300.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    progress: Progress | None = None,
) -> PublishReport:
    """Publish every component of `bundle` (dependencies first). See the module docstring.

    `bucket` None: the GDK's (`gdk_bucket`). `progress` shows the uploads (e.g.
    `Progress.on_terminal(unit="bytes")`); none by default."""
    if bucket is not None:
        _check_bucket_name(bucket, "the name is used exactly as given: no region or account is appended")
    account = _account(clients)
    if bucket is None:
        bucket = gdk_bucket(bundle.root, region, account)
        _check_bucket_name(bucket, "the GDK's: the gdk-config.json prefix, region and account")
    _check_bucket(clients, bucket, region)
    report = PublishReport(account=account, bucket=bucket, region=region, dry_run=dry_run)

    todo: list[Component] = []
    conflicts: list[str] = []
    for comp in bundle.components:
        arn = component_arn(region, account, comp.name, comp.version)
        existing = _existing_digests(clients, arn)
        ours = {a.filename: a.digest for a in comp.artifacts}
        if existing is None:
            todo.append(comp)
        elif existing == ours:
            report.skipped.append(f"{comp.name} {comp.version}")
            say(f"{comp.name} {comp.version}: already published with identical artifacts, skipped")
        else:
            changed = sorted(n for n in set(existing) | set(ours) if existing.get(n) != ours.get(n))
            conflicts.append(f"{comp.name} {comp.version} ({', '.join(changed)})")
    if conflicts:
        raise PublishError(
            f"already published with different artifacts: {'; '.join(conflicts)}: published versions are "
            "immutable, bump the version (edgeinfer.__version__ in components/edgeinfer/__init__.py) "
            "and build again"
        )

    with progress or Progress(quiet=True) as bars:
        for comp in todo:
            arn = component_arn(region, account, comp.name, comp.version)
            if dry_run:
                say(
                    f"{comp.name} {comp.version}: would upload {len(comp.artifacts)} artifact(s) "
                    f"and create {arn}"
                )
                report.created.append(f"{comp.name} {comp.version}")
                continue
            say(f"{comp.name} {comp.version}: publishing")
            _upload(clients, comp, bucket, report, say, progress=bars)
            recipe = json.dumps(recipe_for_cloud(comp, bucket), indent=2).encode()
            token = str(uuid.UUID(bytes=hashlib.sha256(recipe).digest()[:16]))
            clients.greengrassv2.create_component_version(inlineRecipe=recipe, clientToken=token)
            _wait_deployable(clients, arn, name=comp.name, timeout_s=wait_timeout_s, clock=clock, sleep=sleep)
            report.created.append(f"{comp.name} {comp.version}")
            say(f"{comp.name} {comp.version}: created {arn}")
    return report
