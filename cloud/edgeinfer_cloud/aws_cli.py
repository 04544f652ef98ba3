"""`edgeinfer publish` and `edgeinfer deploy` (boto3 is imported only when they run)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeinfer.errors import EdgeinferError

if TYPE_CHECKING:
    from edgeinfer_cloud.canary.flow import CanaryPlan
    from edgeinfer_cloud.deploy import JobConfig, Target


class AwsError(EdgeinferError):
    """An AWS call failed in a way the user can fix (credentials, permissions, network)."""


def register(subparsers: Any) -> None:
    pub = subparsers.add_parser(
        "publish",
        help="upload the bundle to S3 and create its Greengrass component versions",
        description=(
            "Build the bundle (quick, idempotent), upload every artifact to "
            "s3://BUCKET/<component>/<version>/ and create the component versions in dependency "
            "order. The bucket name is used exactly as given. Versions already published with "
            "identical artifacts are skipped; different artifacts under an existing version are refused. "
            "On a terminal, a progress bar shows each upload."
        ),
    )
    pub.add_argument(
        "--bucket",
        help="S3 bucket in --region, used exactly as typed (default: the one 'gdk component publish' "
        "uses, gdk-config.json's publish.bucket-<region>-<account>)",
    )
    pub.add_argument("--region", required=True, help="AWS region of the bucket and the components")
    _account_options(pub, "AWS profile (default: the usual credential chain)")
    pub.add_argument("--artifacts", type=Path, help="artifact folder (default: <project>/artifacts)")
    pub.add_argument("--out", type=Path, help="GDK layout folder (default: <project>/greengrass-build)")
    pub.add_argument(
        "--dry-run",
        action="store_true",
        help="check and show what would be done; nothing changes in AWS (the local bundle is still built)",
    )
    pub.set_defaults(func=run_publish)

    dep = subparsers.add_parser(
        "deploy",
        help="deploy the bundle's component versions to a core device or thing group",
        description="Create a Greengrass deployment of the bundle's components (versions from recipes/).",
    )
    dep.add_argument(
        "--target",
        required=True,
        help="thing or thing group ARN, e.g. arn:aws:iot:eu-west-1:123456789012:thinggroup/cameras "
        "(the region is taken from it)",
    )
    dep.add_argument(
        "--config-merge",
        action="append",
        default=[],
        metavar="COMPONENT=JSON",
        help="merge configuration, e.g. com.edgeinfer.InferenceRuntime='{\"maxBatchSize\": 4}' (repeat)",
    )
    dep.add_argument("--name", help="deployment name (default: edgeinfer-<target name>)")
    dep.add_argument("--wait", action="store_true", help="follow the deployment until every device finished")
    _number(dep, "--timeout", 900.0, None, "seconds --wait waits (default {default})")
    _account_options(dep, "AWS profile")
    _rollout_options(dep)
    _canary_options(dep)
    dep.set_defaults(func=run_deploy)


def _account_options(parser: Any, profile_help: str) -> None:
    """The AWS profile and the project folder, which both commands take."""
    parser.add_argument("--profile", help=profile_help)
    parser.add_argument("--project", type=Path, help="project root (default: found from the current folder)")


def _number(parser: Any, flag: str, default: float, metavar: str | None, text: str) -> None:
    """An option taking a number of `default`'s type; its help says the default where `{default}` is."""
    parser.add_argument(
        flag, type=type(default), default=default, metavar=metavar, help=text.format(default=f"{default:g}")
    )


def _canary_options(dep: Any) -> None:
    """`--canary`: `edgeinfer_cloud.canary` (thresholds' defaults: `canary.compare.Thresholds`)."""
    from edgeinfer_cloud.canary.compare import Thresholds

    limits = Thresholds()
    group = dep.add_argument_group(
        "quality canary",
        "deploy to a canary thing group first, watch its things' telemetry windows against every other "
        "thing's, then promote to --target or roll the canaries back to what they ran, saying why "
        "(exit status 1 when rolled back)",
    )
    group.add_argument("--canary", metavar="GROUP", help="thing group name (in the target's account) or ARN")
    _number(group, "--canary-minutes", 30.0, "M", "how long to watch (default {default})")
    group.add_argument(
        "--canary-windows",
        type=int,
        metavar="N",
        help="end the watch early once every canary thing and the fleet sent N windows",
    )
    _number(
        group,
        "--canary-min-requests",
        limits.min_requests,
        "N",
        "requests each side needs before it is judged (default {default})",
    )
    _number(
        group,
        "--canary-p99-ratio",
        limits.p99_ms.ratio,
        "R",
        "roll back when the canary's p99 is over R times the fleet's (default {default})",
    )
    _number(
        group,
        "--canary-error-ratio",
        limits.errors.ratio,
        "R",
        "roll back when the canary's error, OVERLOADED, DEADLINE_EXCEEDED or low-confidence share is "
        "over R times the fleet's (default {default}; each also needs a margin over it)",
    )
    group.add_argument("--broker", metavar="HOST:PORT", help="plain-TCP MQTT broker the telemetry is on")
    group.add_argument("--endpoint", help="AWS IoT Core data endpoint (mutual TLS) the telemetry is on")
    group.add_argument("--cert", help="client certificate (PEM) for --endpoint")
    group.add_argument("--key", help="client private key (PEM) for --endpoint")
    group.add_argument("--ca", help="CA bundle (PEM) for --endpoint (default: the system's)")


def _rollout_options(dep: Any) -> None:
    """Greengrass's iotJobConfiguration (defaults: `edgeinfer_cloud.deploy.JobConfig`)."""
    from edgeinfer_cloud.deploy import JobConfig

    job = JobConfig()
    group = dep.add_argument_group("rollout (the deployment's IoT job)")
    _number(
        group,
        "--rollout-max",
        job.max_per_minute,
        "N",
        "at most N devices notified a minute (default {default})",
    )
    _number(
        group,
        "--rollout-start",
        job.start_per_minute,
        "N",
        "devices a minute at the start (default {default}); the rate grows from there",
    )
    _number(
        group,
        "--rollout-factor",
        job.increment_factor,
        "F",
        "multiply the rate by F (1-5) each --rollout-step (default {default})",
    )
    _number(
        group,
        "--rollout-step",
        job.increase_after,
        "N",
        "grow the rate each time N more devices succeeded (default {default})",
    )
    group.add_argument(
        "--abort",
        action="append",
        default=[],
        metavar="TYPE=PERCENT",
        help="cancel the job once PERCENT of the executed devices ended as TYPE (FAILED, REJECTED, "
        "TIMED_OUT or ALL; repeat; default ALL=10; 'none' for no abort)",
    )
    _number(
        group,
        "--abort-min-things",
        job.abort[0].min_things,
        "N",
        "count toward --abort only after N devices ran the job (default {default})",
    )
    _number(
        group,
        "--job-timeout",
        job.timeout_minutes,
        "MINUTES",
        "a device in progress longer than this times out (1-10080; default {default})",
    )


def _job_config(args: argparse.Namespace) -> JobConfig:
    from dataclasses import replace

    from edgeinfer_cloud.deploy import JobConfig, parse_abort

    if args.abort:
        abort = parse_abort(args.abort, args.abort_min_things)
    else:
        abort = tuple(replace(c, min_things=args.abort_min_things) for c in JobConfig().abort)
    job = JobConfig(
        max_per_minute=args.rollout_max,
        start_per_minute=args.rollout_start,
        increment_factor=args.rollout_factor,
        increase_after=args.rollout_step,
        abort=abort,
        timeout_minutes=args.job_timeout,
    )
    job.check()
    return job


@contextmanager
def aws_errors() -> Iterator[None]:
    """Turn botocore's exceptions into one-line user errors."""
    import botocore.exceptions as bex

    try:
        yield
    except (bex.NoCredentialsError, bex.PartialCredentialsError):
        raise AwsError(
            "no AWS credentials found: set AWS_PROFILE (or --profile), run 'aws configure', "
            "or use an instance role"
        ) from None
    except bex.ProfileNotFound as exc:
        raise AwsError(str(exc)) from None
    except bex.NoRegionError:
        raise AwsError("no AWS region: pass --region") from None
    except bex.InvalidRegionError as exc:
        raise AwsError(f"not an AWS region: {exc.kwargs.get('region_name', exc)!r}") from None
    except (bex.EndpointConnectionError, bex.ConnectTimeoutError) as exc:
        raise AwsError(f"cannot reach AWS: {exc}") from None
    except bex.ClientError as exc:
        err = exc.response.get("Error", {})
        op = getattr(exc, "operation_name", "AWS call")
        code = err.get("Code", "error")
        if code in (
            "ExpiredToken",
            "ExpiredTokenException",
            "InvalidClientTokenId",
            "UnrecognizedClientException",
        ):
            raise AwsError(f"AWS credentials are invalid or expired ({code}): refresh them") from None
        raise AwsError(f"{op} failed: {code}: {err.get('Message', '')}".rstrip(": ")) from None


def _session(profile: str | None, region: str | None) -> Any:
    import boto3

    return boto3.Session(profile_name=profile, region_name=region)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def run_publish(args: argparse.Namespace, session_factory: Callable[..., Any] | None = None) -> int:
    from edgeinfer.bundle.build import build_bundle
    from edgeinfer.progress import Progress
    from edgeinfer_cloud.publish import Clients, publish

    bundle = build_bundle(args.project, artifacts_dir=args.artifacts, out_dir=args.out)
    with aws_errors():
        session = (session_factory or _session)(args.profile, args.region)
        clients = Clients(
            sts=session.client("sts"), s3=session.client("s3"), greengrassv2=session.client("greengrassv2")
        )
        report = publish(
            bundle,
            args.bucket,
            args.region,
            clients,
            dry_run=args.dry_run,
            say=_stderr,
            progress=Progress(quiet=True) if args.dry_run else Progress.on_terminal(unit="bytes"),
        )
    verb = "would create" if report.dry_run else "created"
    print(
        f"{verb} {len(report.created)} component version(s), skipped {len(report.skipped)} "
        f"(account {report.account}, s3://{report.bucket}, {report.region})"
    )
    return 0


def _telemetry(args: argparse.Namespace) -> Any:
    """The MQTT connection the canary watches telemetry on."""
    from edgeinfer.transport.mqtt import connect_client

    client, _ = connect_client(
        broker=args.broker, endpoint=args.endpoint, cert=args.cert, key=args.key, ca=args.ca
    )
    return client


def _canary_plan(args: argparse.Namespace, target: Target) -> CanaryPlan:
    from dataclasses import replace

    from edgeinfer_cloud.canary.compare import Limit, Thresholds
    from edgeinfer_cloud.canary.flow import CanaryPlan, resolve_canary

    if not args.broker and not args.endpoint:
        raise AwsError(
            "--canary watches telemetry: give --broker HOST:PORT or --endpoint (with --cert, --key)"
        )
    if not args.canary_minutes > 0:
        raise AwsError(f"--canary-minutes must be a positive number, got {args.canary_minutes:g}")
    if args.canary_windows is not None and args.canary_windows < 1:
        raise AwsError(f"--canary-windows must be at least 1, got {args.canary_windows}")
    if args.canary_p99_ratio < 1 or args.canary_error_ratio < 1:
        raise AwsError("--canary-p99-ratio and --canary-error-ratio must be at least 1")
    limits = Thresholds()

    def ratio(limit: Limit, value: float) -> Limit:
        return replace(limit, ratio=value)

    thresholds = Thresholds(
        errors=ratio(limits.errors, args.canary_error_ratio),
        overloaded=ratio(limits.overloaded, args.canary_error_ratio),
        deadline_exceeded=ratio(limits.deadline_exceeded, args.canary_error_ratio),
        p99_ms=ratio(limits.p99_ms, args.canary_p99_ratio),
        low_confidence=ratio(limits.low_confidence, args.canary_error_ratio),
        min_requests=max(args.canary_min_requests, 1),
    )
    return CanaryPlan(
        resolve_canary(args.canary, target), args.canary_minutes, args.canary_windows, thresholds
    )


def _run_canary(
    args: argparse.Namespace,
    gg: Any,
    target: Target,
    plan: CanaryPlan,
    *,
    components: dict[str, str],
    merges: dict[str, dict[str, Any]],
    job: JobConfig,
) -> int:
    from edgeinfer_cloud.canary.flow import run_canary
    from edgeinfer_cloud.canary.windows import MqttWindows

    with _telemetry(args) as client:
        outcome = run_canary(
            gg,
            MqttWindows(client),
            target,
            plan,
            components,
            merges=merges,
            job=job,
            deployment_name=args.name,
            wait=args.wait,
            timeout_s=args.timeout,
            say=_stderr,
        )
    if outcome.promoted:
        print(f"canary {plan.canary.name} promoted: deployment {outcome.then.deployment_id} to {target.name}")
        return 0
    print(
        f"canary {plan.canary.name} rolled back ({outcome.then.deployment_id}): "
        + "; ".join(outcome.verdict.reasons)
    )
    return 1


def run_deploy(args: argparse.Namespace, session_factory: Callable[..., Any] | None = None) -> int:
    from edgeinfer.bundle.build import dependency_order, find_project, load_recipes
    from edgeinfer_cloud.deploy import (
        Deployment,
        Following,
        component_spec,
        deploy,
        parse_config_merge,
        parse_target,
    )

    target = parse_target(args.target)
    if not args.timeout > 0:
        raise AwsError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    recipes = load_recipes(args.project or find_project())
    components = {name: recipes[name].version for name in dependency_order(recipes)}
    merges = parse_config_merge(args.config_merge, list(components))
    job = _job_config(args)
    plan = _canary_plan(args, target) if args.canary else None
    with aws_errors():
        gg = (session_factory or _session)(args.profile, target.region).client("greengrassv2")
        if plan is not None:
            return _run_canary(args, gg, target, plan, components=components, merges=merges, job=job)
        deployment = Deployment(target, component_spec(components, merges), args.name, job)
        report = deploy(gg, deployment, wait=args.wait, following=Following(args.timeout, say=_stderr))
    states = ", ".join(f"{d}: {s}" for d, s in sorted(report.statuses.items()))
    print(f"deployment {report.deployment_id}" + (f" ({states})" if states else ""))
    return 0
