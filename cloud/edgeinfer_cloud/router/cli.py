"""`edgeinfer cloud router`: run a router process (start as many as you like; they share the stream).

Each process holds `--connections` MQTT connections in the shared subscription, each paced within AWS
IoT Core's per-connection limits (docs/router.md: how many connections and processes a load needs)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from edgeinfer.errors import EdgeinferError

log = logging.getLogger(__name__)

_EPILOG = """\
examples:
  edgeinfer cloud router --broker 127.0.0.1:1883
  edgeinfer cloud router --broker 127.0.0.1:1883 --model-dir artifacts/com.edgeinfer.ModelStore/0.1.0
  edgeinfer cloud router --endpoint xxxx-ats.iot.eu-west-1.amazonaws.com \\
      --cert router.pem.crt --key router.pem.key --ca AmazonRootCA1.pem --workers 2 \
      --connections 4 --cloudwatch --region eu-west-1
  edgeinfer cloud router --broker 127.0.0.1:1883 --sagemaker-endpoint lite2-prod --region eu-west-1
"""


def register(subparsers: Any) -> None:
    cloud = subparsers.add_parser(
        "cloud",
        help="cloud side: the hybrid router, IoT policies",
        description="Cloud side: the hybrid router and the IoT policies it and the devices need.",
    )
    sub = cloud.add_subparsers(dest="cloud_command", metavar="COMMAND")
    cloud.set_defaults(func=lambda _args: _usage(cloud))
    p = sub.add_parser(
        "router",
        help="serve offloaded requests (MQTT shared subscription; run any number of them)",
        description=(
            "Serve the requests edge devices offload on edgeinfer/+/offload and answer each on "
            "edgeinfer/{thing}/offload/result. Routers of one --group split the stream between them."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = p.add_argument_group("broker (one of)")
    where.add_argument(
        "--broker", metavar="HOST:PORT", help="plain TCP to a local broker (the simulated core)"
    )
    where.add_argument("--endpoint", metavar="HOST", help="AWS IoT Core data endpoint (mutual TLS)")
    p.add_argument("--port", type=int, default=8883, help="IoT Core port (default 8883)")
    p.add_argument("--cert", metavar="FILE", help="X.509 certificate for --endpoint")
    p.add_argument("--key", metavar="FILE", help="private key for --endpoint")
    p.add_argument("--ca", metavar="FILE", help="CA bundle for --endpoint (default: the system's)")
    p.add_argument(
        "--client-id", help="MQTT client id (default: edgeinfer-router-<pid>; -<i> added per connection)"
    )
    p.add_argument(
        "--connections",
        type=int,
        default=1,
        metavar="N",
        help="MQTT connections this process holds in the shared subscription (default 1)",
    )
    pacing = p.add_argument_group("pacing (per connection, each way; docs/router.md)")
    pacing.add_argument(
        "--pacing",
        choices=("auto", "on", "off"),
        default="auto",
        help="auto (default): on with --endpoint (IoT Core's limits), off with --broker (a local broker)",
    )
    pacing.add_argument(
        "--pacing-scale",
        type=float,
        default=1.0,
        metavar="F",
        help="the default limits times F, 0 < F <= 1 (default 1: under IoT Core's with a margin)",
    )
    pacing.add_argument(
        "--receive-maximum",
        type=int,
        metavar="N",
        help="unacknowledged QoS 1 offloads the broker may send a connection (default: the pacing's)",
    )
    p.add_argument("--group", default="edgeinfer-router", help="shared-subscription group")
    backend = p.add_argument_group("backend")
    backend.add_argument(
        "--model-dir",
        metavar="DIR",
        help="model store to run (default: the EfficientNet-Lite2 FP32 store built by "
        "'edgeinfer model build --arch lite2 --no-int8')",
    )
    backend.add_argument(
        "--providers", default="cpu", help="ONNX Runtime providers in order, comma-separated (default cpu)"
    )
    backend.add_argument("--threads", type=int, default=0, help="ORT intra-op threads (0: one per core)")
    backend.add_argument("--sagemaker-endpoint", metavar="NAME", help="use a SageMaker endpoint instead")
    backend.add_argument("--region", help="AWS region for SageMaker / CloudWatch")
    p.add_argument("--workers", type=int, default=1, help="worker threads (default 1)")
    p.add_argument("--max-batch-size", type=int, default=8, help="largest batch a worker runs")
    p.add_argument("--max-queue", type=int, default=256, help="waiting requests before OVERLOADED")
    p.add_argument("--known-things", metavar="T1,T2", help="only these things may offload")
    p.add_argument("--cloudwatch", action="store_true", help="publish metrics to CloudWatch")
    p.add_argument("--namespace", default="edgeinfer/router", help="CloudWatch namespace")
    p.add_argument(
        "--fleet",
        metavar="NAME",
        help="the Fleet dimension of BusyShare and Backlog, the signal to scale on (default: --group)",
    )
    p.add_argument(
        "--metrics-every",
        type=float,
        default=60.0,
        metavar="S",
        help="publish the metrics (the scaling signal among them) every S s (default 60)",
    )
    p.add_argument(
        "--report-every",
        type=float,
        default=60.0,
        metavar="S",
        help="log counts and the fleet view every S s",
    )
    p.set_defaults(func=run)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def default_model_dir() -> Path:
    from edgeinfer.model.build import BuildOptions

    return BuildOptions(arch="lite2", int8=False).output_dir()


def _connect(args: argparse.Namespace, pacing: Any) -> list[Any]:
    """`--connections` clients, distinct client ids; all or none (the ones made are closed on failure)."""
    import os

    base = args.client_id or f"edgeinfer-router-{os.getpid()}"
    ids = [base] if args.connections == 1 else [f"{base}-{i}" for i in range(args.connections)]
    receive_maximum = None if pacing is None else pacing.receive_maximum
    clients: list[Any] = []
    try:
        for client_id in ids:
            clients.append(_connect_one(args, client_id, receive_maximum))
    except BaseException:
        for client in clients:
            client.close()
        raise
    return clients


def _connect_one(args: argparse.Namespace, client_id: str, receive_maximum: int | None) -> Any:
    from edgeinfer.transport import TransportError
    from edgeinfer.transport.mqtt import MqttPubSub, parse_broker

    try:
        if args.broker and args.endpoint:
            raise EdgeinferError("give either --broker HOST:PORT or --endpoint HOST, not both")
        if args.broker:
            try:
                host, port = parse_broker(args.broker)
            except ValueError as exc:
                raise EdgeinferError(f"--broker: {exc}") from None
            return MqttPubSub.connect_tcp(host, port, client_id=client_id, receive_maximum=receive_maximum)
        if args.endpoint:
            if not args.cert or not args.key:
                raise EdgeinferError("--endpoint needs --cert FILE and --key FILE (mutual TLS)")
            return MqttPubSub.connect_iot_core(
                args.endpoint,
                port=args.port,
                cert_filepath=args.cert,
                pri_key_filepath=args.key,
                ca_filepath=args.ca,
                client_id=client_id,
                receive_maximum=receive_maximum,
            )
    except TransportError as exc:
        raise EdgeinferError(str(exc)) from None
    raise EdgeinferError("say where to connect: --broker HOST:PORT or --endpoint HOST --cert --key")


def _pacing(args: argparse.Namespace) -> Any:
    """The per-connection `PacingConfig` the flags ask for (None: unpaced)."""
    from edgeinfer_cloud.router.pacer import PacingConfig

    if args.pacing == "off" or (args.pacing == "auto" and not args.endpoint):
        return None
    try:
        pacing = PacingConfig().scaled(args.pacing_scale, args.receive_maximum)
        pacing.check()
    except ValueError as exc:
        raise EdgeinferError(f"pacing: {exc}") from None
    return pacing


def _backend(args: argparse.Namespace) -> Any:
    from edgeinfer_cloud.router.backends import BackendError, OnnxBackend, SageMakerBackend

    if args.sagemaker_endpoint:
        return SageMakerBackend(args.sagemaker_endpoint, region_name=args.region)
    from edgeinfer.runtime.config import normalize_provider

    model_dir = Path(args.model_dir) if args.model_dir else default_model_dir()
    if not (model_dir / "manifest.json").is_file():
        hint = "" if args.model_dir else " (build it: edgeinfer model build --arch lite2 --no-int8)"
        raise EdgeinferError(f"no model store at {model_dir}{hint}")
    providers = [normalize_provider(p) for p in args.providers.split(",") if p.strip()]
    try:
        return OnnxBackend.load(
            model_dir,
            providers=providers,
            max_batch_size=args.max_batch_size,
            intra_op_num_threads=args.threads,
        )
    except BackendError as exc:
        raise EdgeinferError(f"cannot load the model: {exc}") from None


def _check(args: argparse.Namespace) -> frozenset[str] | None:
    """Refuse what would start a router that cannot work, before anything loads; returns the
    --known-things set (None: any thing)."""
    import math
    import re

    from edgeinfer.messages import is_thing_name
    from edgeinfer.runtime.config import is_known_provider

    for flag, value, low in (
        ("--workers", args.workers, 1),
        ("--connections", args.connections, 1),
        ("--threads", args.threads, 0),
        ("--max-batch-size", args.max_batch_size, 1),
        ("--max-queue", args.max_queue, 1),
    ):
        if value < low:
            raise EdgeinferError(f"{flag} must be at least {low}, not {value}")
    for flag, seconds in (("--report-every", args.report_every), ("--metrics-every", args.metrics_every)):
        if not (math.isfinite(seconds) and seconds > 0):
            raise EdgeinferError(f"{flag} must be a positive number of seconds, not {seconds}")
    if not (math.isfinite(args.pacing_scale) and 0 < args.pacing_scale <= 1):
        raise EdgeinferError(f"--pacing-scale must be in (0, 1], not {args.pacing_scale}")
    # The group is one level of a $share/{group}/... filter, and the IoT policy's resource.
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,128}", args.group):
        raise EdgeinferError(
            f"--group: not a shared-subscription group name (letters, digits, _ and -): {args.group!r}"
        )
    if not args.sagemaker_endpoint:
        names = [p.strip() for p in args.providers.split(",")]
        unknown = [p for p in names if not is_known_provider(p)]
        if unknown or not any(names):
            raise EdgeinferError(
                f"--providers: unknown provider {', '.join(map(repr, unknown)) or repr(args.providers)} "
                "(tensorrt, cuda, cpu or ORT's provider names, comma-separated)"
            )
    if not args.known_things:
        return None
    things = [t.strip() for t in args.known_things.split(",") if t.strip()]
    bad = [t for t in things if not is_thing_name(t)]
    if bad or not things:
        raise EdgeinferError(
            f"--known-things: not thing names: {', '.join(map(repr, bad or [args.known_things]))}"
        )
    return frozenset(things)


def run(args: argparse.Namespace) -> int:
    from edgeinfer_cloud.aws_cli import aws_errors
    from edgeinfer_cloud.router.router import Router, RouterConfig

    known = _check(args)
    pacing = _pacing(args)
    uses_aws = bool(args.sagemaker_endpoint or args.cloudwatch)  # botocore is the [cloud] extra's
    with aws_errors() if uses_aws else contextlib.nullcontext():  # no region, a bad one → one line
        backend = _backend(args)
        metrics = None
        if args.cloudwatch:
            from edgeinfer_cloud.router.metrics import CloudWatchMetrics

            metrics = CloudWatchMetrics(
                namespace=args.namespace, router=args.group, fleet=args.fleet, region_name=args.region
            )
    clients = _connect(args, pacing)
    pubsub = clients[0]
    config = RouterConfig(
        group=args.group,
        workers=args.workers,
        max_batch_size=args.max_batch_size,
        max_queue=args.max_queue,
        known_things=known,
        pacing=pacing,
        metrics_interval_s=args.metrics_every,
    )
    router = Router(clients, backend, config, metrics=metrics)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    router.start()
    print(
        f"router: serving {backend.model_ref.name} ({backend.provider}) for group {args.group} "
        f"via {pubsub.describe} on {len(clients)} connection(s), "
        f"{'paced' if pacing else 'unpaced'}; Ctrl-C to stop",
        file=sys.stderr,
    )
    try:
        while not stop.wait(args.report_every):
            stats = router.stats()
            fleet = router.fleet.snapshot()
            seen = ", ".join(
                f"{t} {f['throughput_rps']:.0f} rps p99 {f['p99_ms']} ms" for t, f in fleet.items()
            )
            print(
                f"router: {stats['answered']} answered ({stats['ok']} ok), {stats['queued']} queued; "
                f"fleet: {seen or 'no telemetry yet'}",
                file=sys.stderr,
            )
    finally:
        router.stop()
        for client in clients:
            client.close()
        stats = router.stats()
        print(
            f"router: answered {stats['answered']} ({stats['ok']} ok, errors {stats['errors'] or 'none'})",
            file=sys.stderr,
        )
        for name, conn in stats["connections"].items():
            if conn:  # paced: what each connection carried, and how long its pacers held it
                paced_s = conn["in_waited_s"] + conn["out_waited_s"]
                print(
                    f"router: connection {name}: {conn['in_messages']:.0f} in, "
                    f"{conn['out_messages']:.0f} out, paced {paced_s:.1f} s",
                    file=sys.stderr,
                )
    return 0
