"""`edgeinfer capture list` and `edgeinfer capture pull` (boto3 is imported only when they run)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgeinfer.capture.config import CaptureConfig
from edgeinfer.errors import EdgeinferError

_EPILOG = """\
examples:
  edgeinfer capture list --bucket my-capture --group cameras --model efficientnet-lite0 --since 2026-01-05
  edgeinfer capture pull --bucket my-capture --group cameras --model efficientnet-lite0 \\
      --since 2026-01-05 --until 2026-01-11 -o field/
  edgeinfer model build --calibration field/ --validation field/

docs/capture.md, "Bringing field data home", has the folder's layout.
"""


def register(subparsers: Any) -> None:
    capture = subparsers.add_parser(
        "capture",
        help="list captured records in S3 and pull them into a folder (for model build)",
        description="The records devices captured (docs/capture.md): find them by thing group, model and "
        "time, and bring them home as a folder `edgeinfer model build --calibration` reads.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = capture.add_subparsers(dest="capture_command", metavar="ACTION")
    capture.set_defaults(func=lambda _a: (capture.print_help(sys.stderr), 2)[1])
    ls = sub.add_parser(
        "list",
        help="count the records a query names: per thing, model and version, with their bytes",
        description="Count the whole records (image and document) a query names, per thing, model and "
        "version, with their bytes and first and last capture times.",
    )
    _query_options(ls)
    ls.add_argument("--json", action="store_true", help="the records as JSON on stdout, one per line")
    ls.set_defaults(func=run_list)
    pl = sub.add_parser(
        "pull",
        help="download the records a query names into a folder, with a manifest; resumable",
        description="Download each record's image and document into FOLDER under its key below the "
        "prefix, and write FOLDER/capture-manifest.json. A second pull into the same folder skips "
        "what is there whole and adds what is new. On a terminal, a progress bar shows the bytes.",
    )
    _query_options(pl)
    pl.add_argument("-o", "--out", type=Path, required=True, metavar="FOLDER", help="where the records go")
    pl.add_argument(
        "--jobs", type=int, default=8, metavar="N", help="records downloaded at a time (default 8)"
    )
    pl.add_argument("--quiet", action="store_true", help="no progress bar")
    pl.set_defaults(func=run_pull)


def _query_options(p: Any) -> None:
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--group", metavar="NAME", help="an IoT thing group: the records of each thing in it")
    who.add_argument(
        "--thing", action="append", metavar="NAME", help="a thing's records (repeat for more things)"
    )
    p.add_argument(
        "--recursive", action="store_true", help="with --group: the things of its child groups too"
    )
    p.add_argument("--model", required=True, help="the model's name, as the records' keys carry it")
    p.add_argument("--version", help="the model's version (default: every version)")
    p.add_argument("--since", help="from this date (its midnight, UTC) or ISO time on")
    p.add_argument("--until", help="up to this date (the whole day) or before this ISO time")
    p.add_argument("--bucket", required=True, help="the capture bucket (the runtime's capture.bucket)")
    p.add_argument(
        "--prefix",
        default=CaptureConfig.prefix,
        help=f"the capture prefix (the runtime's capture.prefix; default {CaptureConfig.prefix})",
    )
    p.add_argument("--region", help="AWS region of IoT and the bucket (default: the profile's)")
    p.add_argument("--profile", help="AWS profile (default: the usual credential chain)")
    p.add_argument(
        "--s3-endpoint", metavar="URL", help="an S3-compatible store's URL (MinIO: http://minio:9000)"
    )


def _session(profile: str | None, region: str | None) -> Any:
    import boto3

    return boto3.Session(profile_name=profile, region_name=region)


def _query(args: argparse.Namespace, session: Any) -> Any:
    from edgeinfer_cloud.capture.query import Query, group_things, parse_time

    if args.recursive and not args.group:
        raise EdgeinferError("--recursive goes with --group")
    query = Query(
        bucket=args.bucket,
        prefix=args.prefix,
        things=(),
        model=args.model,
        version=args.version,
        since=parse_time(args.since, "--since") if args.since else None,
        until=parse_time(args.until, "--until", end=True) if args.until else None,
        group=args.group,
    )
    query.check()
    if args.group:
        things = tuple(group_things(session.client("iot"), args.group, recursive=args.recursive))
    else:
        things = tuple(sorted(set(args.thing)))
    from dataclasses import replace

    return replace(query, things=things)


def _found(args: argparse.Namespace, session_factory: Callable[..., Any] | None) -> tuple[Any, Any, Any]:
    """The query, the S3 client and the records it names, with AWS's errors as one line."""
    from edgeinfer_cloud.aws_cli import aws_errors
    from edgeinfer_cloud.capture.query import list_records

    with aws_errors():
        session = (session_factory or _session)(args.profile, args.region)
        query = _query(args, session)
        s3 = session.client("s3", endpoint_url=args.s3_endpoint) if args.s3_endpoint else session.client("s3")
        records, orphans = list_records(s3, query)
    if orphans:
        print(f"note: {orphans} document(s) without their image left out", file=sys.stderr)
    return query, s3, records


def _size(n: int) -> str:
    if n < 1000:
        return f"{n} B"
    value = float(n)
    for unit in ("KB", "MB", "GB"):
        value /= 1000
        if value < 1000 or unit == "GB":
            break
    return f"{value:.1f} {unit}"


def run_list(args: argparse.Namespace, session_factory: Callable[..., Any] | None = None) -> int:
    from edgeinfer_cloud.capture.query import summarize

    query, _, records = _found(args, session_factory)
    if args.json:
        for r in records:
            print(
                json.dumps(
                    {
                        "key": r.key,
                        "thing": r.thing,
                        "model": r.model,
                        "version": r.version,
                        "captured_at": r.captured_at,
                        "bytes": r.bytes,
                    }
                )
            )
        return 0
    lines = summarize(records)
    width = max([len(line.thing) for line in lines] + [5])
    for line in lines:
        print(
            f"{line.thing:<{width}}  {line.model} {line.version}  {line.records:>6} records"
            f"  {_size(line.bytes):>9}  {line.first} .. {line.last}"
        )
    total = sum(r.bytes for r in records)
    print(
        f"{len(records)} record(s), {_size(total)}, from {len({r.thing for r in records})} of "
        f"{len(query.things)} thing(s) (s3://{query.bucket}/{query.prefix.strip('/')})"
    )
    return 0


def run_pull(args: argparse.Namespace, session_factory: Callable[..., Any] | None = None) -> int:
    from edgeinfer.progress import Progress
    from edgeinfer_cloud.aws_cli import aws_errors
    from edgeinfer_cloud.capture.pull import pull

    if args.jobs < 1:
        raise EdgeinferError(f"--jobs must be at least 1, got {args.jobs}")
    query, s3, records = _found(args, session_factory)
    if not records:
        raise EdgeinferError(
            f"no captured records of {query.model}{' ' + query.version if query.version else ''} for "
            f"{len(query.things)} thing(s) in s3://{query.bucket}/{query.prefix.strip('/')} in that time"
        )
    import botocore.exceptions as bex

    progress = Progress(quiet=True) if args.quiet else Progress.on_terminal(unit="bytes")
    try:
        with aws_errors(), progress, progress.step("pull", sum(r.bytes for r in records)) as tick:
            report = pull(s3, query, records, args.out, jobs=args.jobs, tick=tick)
    except bex.BotoCoreError as exc:  # a read cut off mid-object: what aws_errors leaves as a traceback
        raise EdgeinferError(
            f"pull stopped: {exc}; the records whole by then are kept: run the same pull to finish"
        ) from None
    print(
        f"{report.records} record(s) in {args.out}: {report.fetched} file(s) downloaded"
        f" ({_size(report.bytes)}), {report.skipped} already there"
    )
    return 0
