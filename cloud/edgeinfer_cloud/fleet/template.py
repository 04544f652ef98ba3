"""The router fleet's CloudFormation template, built as data and written as YAML.

An Auto Scaling group of EC2 instances, one router process each (holding ConnectionsPerRouter MQTT
connections in the shared subscription); target tracking on the routers' own `BusyShare` metric;
alarms on `Backlog`, on no router in service and on routers gone silent, to an SNS topic when an email
is given. The routers' IoT policy is `policies/cloud-router.json` (the one source, through
`policies.for_cloudformation`), attached to a certificate the user made; its private key is read at
boot from Secrets Manager by the instance role, which may read that one secret and nothing else of it.
docs/fleet.md says why each choice, and what the router publishes (the `METRIC_*` names below).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from edgeinfer_cloud.fleet.parameters import INSTANCE_KINDS, PARAMETERS, Value, check
from edgeinfer_cloud.policies import for_cloudformation

__all__ = [
    "METRIC_BACKLOG",
    "METRIC_BUSY_SHARE",
    "METRIC_DIMENSION",
    "METRIC_NAMESPACE",
    "build",
    "render",
]

# The contract with the router's CloudWatch publisher: one namespace, two metrics, one dimension.
METRIC_NAMESPACE = "edgeinfer/router"
METRIC_BUSY_SHARE = "BusyShare"
METRIC_BACKLOG = "Backlog"
METRIC_DIMENSION = "Fleet"

_USER_DATA = Path(__file__).with_name("user-data.sh")
_FLEET_DIMENSION = [{"Name": METRIC_DIMENSION, "Value": {"Ref": "FleetName"}}]


def _ref(name: str) -> dict[str, str]:
    return {"Ref": name}


def _sub(text: str) -> dict[str, str]:
    return {"Fn::Sub": text}


def _if(condition: str, then: Any, otherwise: Any) -> dict[str, list[Any]]:
    return {"Fn::If": [condition, then, otherwise]}


def _kind_is(kind: str) -> dict[str, list[Any]]:
    return {"Fn::Equals": [{"Fn::FindInMap": ["InstanceKinds", _ref("InstanceType"), "Kind"]}, kind]}


def _conditions() -> dict[str, Any]:
    return {
        "IsGpu": _kind_is("gpu"),
        "IsArm": _kind_is("arm"),
        "HasAlarmEmail": {"Fn::Not": [{"Fn::Equals": [_ref("AlarmEmail"), ""]}]},
    }


def _iot() -> dict[str, Any]:
    """The router's thing (the certificate's only one: the connect statement's thing-name variable
    then resolves from the certificate, whatever suffix each connection's client id carries) and
    its policy, both attached to the user's certificate."""
    return {
        "RouterPolicy": {
            "Type": "AWS::IoT::Policy",
            "Properties": {
                "PolicyDocument": for_cloudformation("cloud-router", router_group="${RouterGroup}")
            },
        },
        "RouterThing": {"Type": "AWS::IoT::Thing", "Properties": {"ThingName": _sub("${FleetName}-router")}},
        "RouterThingCertificate": {
            "Type": "AWS::IoT::ThingPrincipalAttachment",
            "Properties": {
                "ThingName": _ref("RouterThing"),
                "Principal": _ref("RouterCertificateArn"),
                "ThingPrincipalType": "EXCLUSIVE_THING",
            },
        },
        "RouterPolicyCertificate": {
            "Type": "AWS::IoT::PolicyPrincipalAttachment",
            "Properties": {"PolicyName": _ref("RouterPolicy"), "Principal": _ref("RouterCertificateArn")},
        },
    }


def _role() -> dict[str, Any]:
    """What a router instance may do: read its certificate's secret, the wheel and the model, put
    metrics in the router's namespace only; Session Manager instead of SSH keys and open ports."""
    statements = [
        {
            "Sid": "ReadTheRouterCertificate",
            "Effect": "Allow",
            "Action": "secretsmanager:GetSecretValue",
            "Resource": _ref("RouterCertificateSecretArn"),
        },
        {
            "Sid": "ReadTheWheelAndTheModel",
            "Effect": "Allow",
            "Action": "s3:GetObject",
            "Resource": [
                _sub("arn:${AWS::Partition}:s3:::${ArtifactBucket}/${RouterWheelKey}"),
                _sub("arn:${AWS::Partition}:s3:::${ArtifactBucket}/${ModelPrefix}*"),
            ],
        },
        {
            "Sid": "ListTheModel",
            "Effect": "Allow",
            "Action": "s3:ListBucket",
            "Resource": _sub("arn:${AWS::Partition}:s3:::${ArtifactBucket}"),
            "Condition": {"StringLike": {"s3:prefix": _sub("${ModelPrefix}*")}},
        },
        {
            "Sid": "PublishTheRouterMetrics",
            "Effect": "Allow",
            "Action": "cloudwatch:PutMetricData",
            "Resource": "*",  # PutMetricData takes no resource; the condition scopes it
            "Condition": {"StringEquals": {"cloudwatch:namespace": METRIC_NAMESPACE}},
        },
    ]
    return {
        "RouterRole": {
            "Type": "AWS::IAM::Role",
            "Properties": {
                "AssumeRolePolicyDocument": {
                    "Version": "2012-10-17",
                    "Statement": [
                        {
                            "Effect": "Allow",
                            "Principal": {"Service": "ec2.amazonaws.com"},
                            "Action": "sts:AssumeRole",
                        }
                    ],
                },
                "ManagedPolicyArns": [
                    _sub("arn:${AWS::Partition}:iam::aws:policy/AmazonSSMManagedInstanceCore")
                ],
                "Policies": [
                    {
                        "PolicyName": "edgeinfer-router",
                        "PolicyDocument": {"Version": "2012-10-17", "Statement": statements},
                    }
                ],
            },
        },
        "RouterInstanceProfile": {
            "Type": "AWS::IAM::InstanceProfile",
            "Properties": {"Roles": [_ref("RouterRole")]},
        },
    }


def _instances() -> dict[str, Any]:
    image = _if("IsGpu", _ref("GpuImageId"), _if("IsArm", _ref("ArmImageId"), _ref("X86ImageId")))
    user_data = {
        "Fn::Sub": [
            _USER_DATA.read_text(encoding="utf-8"),
            {"Extra": _if("IsGpu", "gpu", "cpu"), "Providers": _if("IsGpu", "cuda,cpu", "cpu")},
        ]
    }
    return {
        "RouterSecurityGroup": {
            "Type": "AWS::EC2::SecurityGroup",
            "Properties": {
                "GroupDescription": "edgeinfer routers: no inbound; out to IoT Core, S3, CloudWatch",
                "VpcId": _ref("VpcId"),
                "SecurityGroupEgress": [
                    {"IpProtocol": "tcp", "FromPort": 443, "ToPort": 443, "CidrIp": "0.0.0.0/0"},
                    {"IpProtocol": "tcp", "FromPort": 8883, "ToPort": 8883, "CidrIp": "0.0.0.0/0"},
                    {"IpProtocol": "tcp", "FromPort": 80, "ToPort": 80, "CidrIp": "0.0.0.0/0"},  # dnf mirrors
                ],
            },
        },
        "RouterLaunchTemplate": {
            "Type": "AWS::EC2::LaunchTemplate",
            "Properties": {
                "LaunchTemplateData": {
                    "ImageId": image,
                    "InstanceType": _ref("InstanceType"),
                    "IamInstanceProfile": {"Arn": {"Fn::GetAtt": ["RouterInstanceProfile", "Arn"]}},
                    "SecurityGroupIds": [_ref("RouterSecurityGroup")],
                    "MetadataOptions": {"HttpTokens": "required"},  # IMDSv2 only
                    "UserData": {"Fn::Base64": user_data},
                }
            },
        },
        "Routers": {
            "Type": "AWS::AutoScaling::AutoScalingGroup",
            "DependsOn": ["RouterThingCertificate", "RouterPolicyCertificate"],
            "Properties": {
                "VPCZoneIdentifier": _ref("Subnets"),
                "LaunchTemplate": {
                    "LaunchTemplateId": _ref("RouterLaunchTemplate"),
                    "Version": {"Fn::GetAtt": ["RouterLaunchTemplate", "LatestVersionNumber"]},
                },
                "MinSize": _ref("MinSize"),
                "MaxSize": _ref("MaxSize"),
                "DesiredCapacity": _ref("DesiredCapacity"),
                "HealthCheckType": "EC2",
                "MetricsCollection": [{"Granularity": "1Minute", "Metrics": ["GroupInServiceInstances"]}],
                "Tags": [{"Key": "Name", "Value": _sub("${FleetName}-router"), "PropagateAtLaunch": True}],
            },
        },
        "BusyShareTracking": {
            "Type": "AWS::AutoScaling::ScalingPolicy",
            "Properties": {
                "AutoScalingGroupName": _ref("Routers"),
                "PolicyType": "TargetTrackingScaling",
                "TargetTrackingConfiguration": {
                    "CustomizedMetricSpecification": {
                        "Namespace": METRIC_NAMESPACE,
                        "MetricName": METRIC_BUSY_SHARE,
                        "Dimensions": _FLEET_DIMENSION,
                        "Statistic": "Average",
                    },
                    "TargetValue": _ref("TargetBusyShare"),
                },
            },
        },
    }


def _alarm(description: str, metric: dict[str, Any], comparison: str, threshold: Any, missing: str) -> Any:
    actions = _if("HasAlarmEmail", [_ref("AlarmTopic")], _ref("AWS::NoValue"))
    return {
        "Type": "AWS::CloudWatch::Alarm",
        "Properties": {
            "AlarmDescription": description,
            **metric,
            "Period": 60,
            "EvaluationPeriods": 5,
            "DatapointsToAlarm": 3,
            "ComparisonOperator": comparison,
            "Threshold": threshold,
            "TreatMissingData": missing,
            "AlarmActions": actions,
            "OKActions": actions,
        },
    }


def _alarms() -> dict[str, Any]:
    router_metric = {"Namespace": METRIC_NAMESPACE, "Dimensions": _FLEET_DIMENSION}
    return {
        "AlarmTopic": {
            "Type": "AWS::SNS::Topic",
            "Condition": "HasAlarmEmail",
            "Properties": {"Subscription": [{"Protocol": "email", "Endpoint": _ref("AlarmEmail")}]},
        },
        "BacklogHigh": _alarm(
            "A router holds more waiting requests than BacklogAlarmThreshold: the fleet is at MaxSize, "
            "or scaling out is slower than the load grows",
            {**router_metric, "MetricName": METRIC_BACKLOG, "Statistic": "Maximum"},
            "GreaterThanThreshold",
            _ref("BacklogAlarmThreshold"),
            "notBreaching",
        ),
        "NoRouterInService": _alarm(
            "No router instance in service: offloads go unanswered",
            {
                "Namespace": "AWS/AutoScaling",
                "MetricName": "GroupInServiceInstances",
                "Dimensions": [{"Name": "AutoScalingGroupName", "Value": _ref("Routers")}],
                "Statistic": "Minimum",
            },
            "LessThanThreshold",
            1,
            "breaching",
        ),
        "RoutersSilent": _alarm(
            "No BusyShare from any router: none is running, or none can reach CloudWatch; scaling is blind",
            {**router_metric, "MetricName": METRIC_BUSY_SHARE, "Statistic": "SampleCount"},
            "LessThanThreshold",
            1,
            "breaching",
        ),
    }


def build(values: Mapping[str, Value] | None = None) -> dict[str, Any]:
    """The template as data, with `values` (parameter name -> value, checked) as its defaults."""
    given = check(values or {})
    resources = {**_iot(), **_role(), **_instances(), **_alarms()}
    outputs = {
        "AutoScalingGroupName": {"Description": "The routers' Auto Scaling group", "Value": _ref("Routers")},
        "RouterThingName": {"Description": "The routers' IoT thing", "Value": _ref("RouterThing")},
        "RouterPolicyName": {"Description": "The routers' IoT policy", "Value": _ref("RouterPolicy")},
        "RouterRoleArn": {
            "Description": "The routers' instance role",
            "Value": {"Fn::GetAtt": ["RouterRole", "Arn"]},
        },
        "AlarmTopicArn": {
            "Condition": "HasAlarmEmail",
            "Description": "SNS topic of the alarms (subscribe more endpoints to it)",
            "Value": _ref("AlarmTopic"),
        },
    }
    return {
        "AWSTemplateFormatVersion": "2010-09-09",
        "Description": "edgeinfer router fleet: an Auto Scaling group of routers scaled on their BusyShare",
        "Parameters": {p.name: p.to_cloudformation(given.get(p.name, p.default)) for p in PARAMETERS},
        "Mappings": {"InstanceKinds": {name: {"Kind": kind} for name, kind in INSTANCE_KINDS.items()}},
        "Conditions": _conditions(),
        "Resources": resources,
        "Outputs": outputs,
    }


def render(values: Mapping[str, Value] | None = None) -> str:
    """The template as YAML (CloudFormation's long-form intrinsic functions: plain YAML mappings)."""
    return yaml.dump(build(values), Dumper=_Dumper, sort_keys=False, width=110, allow_unicode=True)


class _Dumper(yaml.SafeDumper):
    """Writes a value used twice in full both times: CloudFormation rejects YAML aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _text(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    """A string of several lines (the user data) as a literal block, readable as the script it is."""
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|" if "\n" in data else None)


_Dumper.add_representer(str, _text)
