"""`edgeinfer publish`: S3 against moto, every greengrassv2 call through botocore's Stubber."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from edgeinfer import __version__, cli
from edgeinfer.bundle.build import Bundle
from edgeinfer.progress import Progress
from edgeinfer_cloud.publish import Clients, PublishError, publish
from tests.cloud.aws_fixtures import (
    BUCKET,
    NOW,
    REGION,
    ROOT,
    Capture,
    arns,
    aws_env,
    bundle,
    clients,
    expect_create,
    expect_existing,
    expect_missing,
)

__all__ = ["aws_env", "bundle", "clients"]  # fixtures


def expect_first_publish(c: Clients, stub: Stubber, bundle: Bundle) -> list[Capture]:
    """Queue the calls of a publish into an empty account; returns what will see each recipe created."""
    captures = []
    for arn in arns(c, bundle):
        expect_missing(stub, arn)
    for arn, comp in zip(arns(c, bundle), bundle.components, strict=True):
        capture = Capture()
        expect_create(stub, arn, comp.name, comp.version, capture)
        captures.append(capture)
    return captures


def run_first_publish(
    c: Clients, stub: Stubber, bundle: Bundle, progress: Progress | None = None
) -> list[dict[str, Any]]:
    """A publish into an empty account; returns the recipes it created."""
    captures = expect_first_publish(c, stub, bundle)
    report = publish(bundle, BUCKET, REGION, c, sleep=lambda s: None, progress=progress)
    assert report.created == [f"{comp.name} {comp.version}" for comp in bundle.components]
    return [json.loads(cap.values[0]) for cap in captures]


def test_publish_uploads_and_creates_in_dependency_order(
    clients: tuple[Clients, Stubber], bundle: Bundle
) -> None:
    c, stub = clients
    recipes = run_first_publish(c, stub, bundle)
    names = [r["ComponentName"] for r in recipes]
    assert names.index("com.edgeinfer.ModelStore") < names.index("com.edgeinfer.InferenceRuntime")
    assert names.index("com.edgeinfer.RuntimeInstaller") < names.index("com.edgeinfer.InferenceRuntime")
    keys = {o["Key"] for o in c.s3.list_objects_v2(Bucket=BUCKET)["Contents"]}
    for recipe, comp in zip(recipes, bundle.components, strict=True):
        for manifest in recipe["Manifests"]:
            for art in manifest.get("Artifacts", []):
                filename = art["URI"].rsplit("/", 1)[-1]
                # the exact bucket, under <component>/<version>/
                assert art["URI"] == f"s3://{BUCKET}/{comp.name}/{comp.version}/{filename}"
                assert f"{comp.name}/{comp.version}/{filename}" in keys
                assert art["Algorithm"] == "SHA-256"
                body = c.s3.get_object(Bucket=BUCKET, Key=f"{comp.name}/{comp.version}/{filename}")["Body"]
                local = next(a for a in comp.artifacts if a.filename == filename)
                assert body.read() == local.path.read_bytes()
                assert art["Digest"] == local.digest


class CountingProgress(Progress):
    """Quiet, but counts what each upload step was told (boto3 calls back from its transfer threads)."""

    def __init__(self) -> None:
        super().__init__(quiet=True)
        self.steps: list[tuple[str, int, list[int]]] = []
        self.lock = threading.Lock()

    @contextmanager
    def step(self, description: str, total: int) -> Iterator[Callable[[int], None]]:
        sent: list[int] = []
        self.steps.append((description, total, sent))

        def tick(n: int) -> None:
            with self.lock:
                sent.append(n)

        yield tick


def test_each_upload_reports_its_bytes_to_the_progress_bar(
    clients: tuple[Clients, Stubber], bundle: Bundle
) -> None:
    c, stub = clients
    progress = CountingProgress()
    run_first_publish(c, stub, bundle, progress)
    uploaded = [a for comp in bundle.components for a in comp.artifacts]
    assert [(d, t) for d, t, _ in progress.steps] == [(a.filename, a.size) for a in uploaded]
    assert [sum(sent) for _, _, sent in progress.steps] == [a.size for a in uploaded]


def test_publish_twice_is_idempotent(clients: tuple[Clients, Stubber], bundle: Bundle) -> None:
    c, stub = clients
    recipes = run_first_publish(c, stub, bundle)
    before = {o["Key"]: o["LastModified"] for o in c.s3.list_objects_v2(Bucket=BUCKET)["Contents"]}
    for arn, recipe in zip(arns(c, bundle), recipes, strict=True):
        expect_existing(stub, arn, recipe)
    report = publish(bundle, BUCKET, REGION, c)
    assert report.created == []
    assert report.uploaded == []
    assert len(report.skipped) == len(bundle.components)
    after = {o["Key"]: o["LastModified"] for o in c.s3.list_objects_v2(Bucket=BUCKET)["Contents"]}
    assert after == before


def test_digest_conflict_is_refused_before_anything_changes(
    clients: tuple[Clients, Stubber], bundle: Bundle
) -> None:
    c, stub = clients
    for arn, comp in zip(arns(c, bundle), bundle.components, strict=True):
        if comp.name == "com.edgeinfer.ModelStore":
            recipe = comp.built_recipe()
            recipe["Manifests"][0]["Artifacts"][2]["Digest"] = "c29tZXRoaW5nIGVsc2U="
            expect_existing(stub, arn, recipe)
        else:
            expect_missing(stub, arn)
    version = re.escape(__version__)
    with pytest.raises(
        PublishError, match=rf"com\.edgeinfer\.ModelStore {version} \(model_fp32\.onnx\)"
    ) as err:
        publish(bundle, BUCKET, REGION, c)
    assert "bump the version (edgeinfer.__version__" in str(err.value)
    assert "\n" not in str(err.value)
    assert c.s3.list_objects_v2(Bucket=BUCKET).get("KeyCount") == 0  # nothing uploaded


def test_dry_run_changes_nothing(clients: tuple[Clients, Stubber], bundle: Bundle) -> None:
    c, stub = clients
    for arn in arns(c, bundle):
        expect_missing(stub, arn)
    lines: list[str] = []
    report = publish(bundle, BUCKET, REGION, c, dry_run=True, say=lines.append)
    assert len(report.created) == len(bundle.components)
    assert c.s3.list_objects_v2(Bucket=BUCKET).get("KeyCount") == 0
    assert all("would upload" in line for line in lines)


def test_bucket_in_another_region_is_refused(clients: tuple[Clients, Stubber], bundle: Bundle) -> None:
    c, _stub = clients
    boto3.client("s3", region_name="us-west-2").create_bucket(
        Bucket="elsewhere", CreateBucketConfiguration={"LocationConstraint": "us-west-2"}
    )
    with pytest.raises(PublishError, match="bucket elsewhere is in us-west-2, not eu-central-1"):
        publish(bundle, "elsewhere", REGION, c)


def test_missing_bucket_is_refused(clients: tuple[Clients, Stubber], bundle: Bundle) -> None:
    c, _stub = clients
    with pytest.raises(PublishError, match="bucket no-such-bucket-here does not exist"):
        publish(bundle, "no-such-bucket-here", REGION, c)


def test_failed_component_is_one_line(clients: tuple[Clients, Stubber], bundle: Bundle) -> None:
    c, stub = clients
    first, *rest = arns(c, bundle)
    for arn in (first, *rest):
        expect_missing(stub, arn)
    comp = bundle.components[0]
    stub.add_response(
        "create_component_version",
        {
            "arn": first,
            "componentName": comp.name,
            "componentVersion": comp.version,
            "creationTimestamp": NOW,
            "status": {"componentState": "REQUESTED"},
        },
        expected_params={"inlineRecipe": Capture(), "clientToken": Capture()},
    )
    stub.add_response(
        "describe_component",
        {"arn": first, "status": {"componentState": "FAILED", "message": "artifact not accessible"}},
        expected_params={"arn": first},
    )
    with pytest.raises(PublishError, match="Greengrass refused the component: artifact not accessible"):
        publish(bundle, BUCKET, REGION, c)


def test_cli_without_credentials_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, bundle: Bundle, capsys: pytest.CaptureFixture[str]
) -> None:
    for key in list(__import__("os").environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    argv = ["publish", "--bucket", BUCKET, "--region", REGION, "--project", str(ROOT)]
    argv += ["--artifacts", str(bundle.artifacts_dir), "--out", str(tmp_path / "gb")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("edgeinfer: error: no AWS credentials found")
    assert err.count("\n") == 1


def test_cli_missing_artifact_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["publish", "--bucket", BUCKET, "--region", REGION, "--project", str(ROOT)]
    argv += ["--artifacts", str(tmp_path / "empty"), "--out", str(tmp_path / "gb")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "edgeinfer model build" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("name", ["My_Bucket", "ab", "bucket-", "a..b", " spaced "])
def test_invalid_bucket_name_is_refused_before_any_call(name: str, bundle: Bundle) -> None:
    with pytest.raises(PublishError, match="invalid S3 bucket name"):
        publish(bundle, name, REGION, Clients(sts=None, s3=None, greengrassv2=None))


def test_without_a_bucket_it_publishes_where_gdk_component_publish_does(
    clients: tuple[Clients, Stubber], bundle: Bundle
) -> None:
    from edgeinfer_cloud.publish import gdk_bucket

    c, stub = clients
    acct = str(c.sts.get_caller_identity()["Account"])
    gdk = gdk_bucket(ROOT, REGION, acct)
    prefix = json.loads((ROOT / "gdk-config.json").read_text())["component"]
    assert gdk == f"{next(iter(prefix.values()))['publish']['bucket']}-{REGION}-{acct}"
    c.s3.create_bucket(Bucket=gdk, CreateBucketConfiguration={"LocationConstraint": REGION})
    captures = expect_first_publish(c, stub, bundle)
    report = publish(bundle, None, REGION, c, sleep=lambda s: None)
    assert report.bucket == gdk
    for cap, comp in zip(captures, bundle.components, strict=True):
        for manifest in json.loads(cap.values[0])["Manifests"]:
            for art in manifest.get("Artifacts", []):
                assert art["URI"].startswith(f"s3://{gdk}/{comp.name}/{comp.version}/")  # GDK's keys too
