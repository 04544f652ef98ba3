"""`edgeinfer cloud fleet-template`: write the router fleet's CloudFormation template for given values."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from edgeinfer.files import write_output
from edgeinfer_cloud.fleet.parameters import PARAMETERS, Parameter, Value
from edgeinfer_cloud.fleet.template import METRIC_BACKLOG, METRIC_BUSY_SHARE, METRIC_NAMESPACE, render
from edgeinfer_cloud.policies.cli import cloud_commands

_DESCRIPTION = f"""\
Write the CloudFormation template (YAML) of a fleet of cloud routers: an EC2 Auto Scaling group, one
router per instance holding --connections-per-router MQTT connections in the shared subscription,
scaled by target tracking on the routers' own {METRIC_NAMESPACE} {METRIC_BUSY_SHARE} metric, with
alarms ({METRIC_BACKLOG} high, no router in service, routers silent) and the router's IoT policy
attached to your certificate, whose key the instances read from Secrets Manager at boot.

Every option sets that template parameter's default; what you leave out keeps the template's default
or, for the account's own values (endpoint, certificate, bucket, VPC, subnets), is asked for at
deploy. Values are checked as CloudFormation will check them. docs/fleet.md has the whole story."""

_EPILOG = """\
before deploying (once):
  aws iot create-keys-and-certificate --set-as-active > router-cert.json
  jq '{certificatePem, privateKey: .keyPair.PrivateKey}' router-cert.json > secret.json
  aws secretsmanager create-secret --name edgeinfer/router-cert --secret-string file://secret.json
  shred -u router-cert.json secret.json
  pip wheel --no-deps -w dist . && aws s3 cp dist/edgeinfer-*.whl s3://BUCKET/wheels/
  aws s3 sync artifacts/com.edgeinfer.ModelStore/0.1.0/ s3://BUCKET/models/lite2/

examples:
  edgeinfer cloud fleet-template -o fleet.yaml
  edgeinfer cloud fleet-template --instance-type g5.xlarge --min-size 1 --max-size 8 \\
      --target-busy-share 70 --connections-per-router 8 --fleet-name prod -o fleet.yaml
  aws cloudformation deploy --template-file fleet.yaml --stack-name edgeinfer-fleet \\
      --capabilities CAPABILITY_IAM --parameter-overrides VpcId=vpc-... Subnets=subnet-a,subnet-b \\
      IotEndpoint=xxxx-ats.iot.eu-west-1.amazonaws.com RouterCertificateArn=arn:aws:iot:... \\
      RouterCertificateSecretArn=arn:aws:secretsmanager:... ArtifactBucket=BUCKET \\
      RouterWheelKey=wheels/edgeinfer-0.2.0-py3-none-any.whl ModelPrefix=models/lite2/
"""


def register(subparsers: Any) -> None:
    p = cloud_commands(subparsers).add_parser(
        "fleet-template",
        help="write the CloudFormation template of an auto-scaled router fleet (EC2, GPU or CPU)",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-o", "--out", type=Path, help="write the YAML to this file instead of stdout")
    for parameter in PARAMETERS:
        p.add_argument(
            parameter.flag,
            dest=parameter.name,
            metavar=_metavar(parameter),
            help=_help(parameter),
        )
    p.set_defaults(func=run)


def _metavar(parameter: Parameter) -> str:
    if parameter.allowed_values:
        return "TYPE"
    if parameter.is_number:
        return "N"
    return "ID,ID" if parameter.is_list else parameter.flag.removeprefix("--").split("-")[-1].upper()


def _help(parameter: Parameter) -> str:
    text = parameter.description
    if parameter.allowed_values:
        text += f"; one of {', '.join(parameter.allowed_values)}"
    elif parameter.constraint:
        text += f"; {parameter.constraint}"
    if parameter.default not in (None, ""):
        text += f" (template default: {parameter.default})"
    else:
        text += " (no default: asked for at deploy)" if parameter.default is None else ""
    return text.replace("%", "%%")  # argparse %-formats help


def values_from(args: argparse.Namespace) -> dict[str, Value]:
    """The parameters given on the command line (a list parameter comma-separated)."""
    values: dict[str, Value] = {}
    for parameter in PARAMETERS:
        given = getattr(args, parameter.name)
        if given is None:
            continue
        values[parameter.name] = (
            [v.strip() for v in given.split(",") if v.strip()] if parameter.is_list else given
        )
    return values


def run(args: argparse.Namespace) -> int:
    values = values_from(args)
    text = render(values)
    if args.out is None:
        sys.stdout.write(text)
        return 0
    write_output(args.out, text.encode())
    missing = [p.name for p in PARAMETERS if p.default is None and p.name not in values]
    needs = f"; deploy gives {', '.join(missing)}" if missing else ""
    print(f"fleet-template: wrote {args.out}{needs} (--capabilities CAPABILITY_IAM)", file=sys.stderr)
    return 0
