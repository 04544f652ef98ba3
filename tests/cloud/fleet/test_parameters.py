"""The fleet's parameters: checked as CloudFormation checks them, and docs/fleet.md lists each one
with the type and default the rendered template gives it."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from edgeinfer_cloud.fleet.parameters import INSTANCE_KINDS, PARAMETERS, FleetError, check
from edgeinfer_cloud.fleet.template import render
from tests.helpers import PROJECT


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"InstanceType": "p5.48xlarge"}, "--instance-type: 'p5.48xlarge' is not one of g5.xlarge"),
        ({"MinSize": 0}, "--min-size: 0 is out of range (1 to 100)"),
        ({"TargetBusyShare": "99"}, "--target-busy-share: 99 is out of range"),
        ({"ConnectionsPerRouter": "many"}, "--connections-per-router: not a number: 'many'"),
        ({"FleetName": "prod fleet"}, "--fleet-name: 'prod fleet' is not letters, digits"),
        ({"AlarmEmail": "ops"}, "--alarm-email: 'ops' is not an email address, or empty"),
        ({"Subnets": ["subnet-0123456789abcdef0", "sn-1"]}, "--subnets: 'sn-1' is not subnet ids"),
        ({"Subnets": []}, "--subnets: give at least one value"),
        (
            {"RouterWheelKey": "wheels/edgeinfer.tar.gz"},
            "--router-wheel-key: 'wheels/edgeinfer.tar.gz' is not",
        ),
        (
            {"MinSize": 3, "DesiredCapacity": 2},
            "--min-size <= --desired-capacity <= --max-size, not 3 / 2 / 4",
        ),
        ({"MinSize": 5, "MaxSize": 2}, "not 5 / 1 / 2"),
        ({"Colour": "blue"}, "unknown fleet parameter(s): Colour"),
    ],
)
def test_a_bad_value_is_refused_naming_its_flag(values: dict[str, Any], message: str) -> None:
    with pytest.raises(FleetError) as caught:
        check(values)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_numbers_are_held_as_numbers_and_an_unasked_desired_capacity_follows_the_sizes() -> None:
    assert check({"MinSize": "3", "MaxSize": "8", "TargetBusyShare": "72.5"}) == {
        "MinSize": 3,
        "MaxSize": 8,
        "TargetBusyShare": 72.5,
        "DesiredCapacity": 3,
    }
    assert check({"AlarmEmail": ""}) == {"AlarmEmail": ""}


def test_every_instance_type_has_a_kind_the_template_maps_to_an_image() -> None:
    assert set(INSTANCE_KINDS.values()) == {"gpu", "x86", "arm"}
    assert {t.split(".")[0] for t in INSTANCE_KINDS} == {"g5", "g6", "c7i", "m7i", "c7g"}


def test_each_flag_is_the_parameter_name_in_kebab_case() -> None:
    flags = {p.name: p.flag for p in PARAMETERS}
    assert flags["InstanceType"] == "--instance-type"
    assert flags["X86ImageId"] == "--x86-image-id"
    assert len(set(flags.values())) == len(flags)


def _docs_table() -> list[list[str]]:
    text = (PROJECT / "docs" / "fleet.md").read_text(encoding="utf-8")
    section = text.split("## Parameters", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def _code(text: str) -> str:
    return re.sub(r"^`(.*)`$", r"\1", text)


def test_docs_list_every_parameter_in_the_templates_order_with_its_type_and_default() -> None:
    parameters = yaml.safe_load(render())["Parameters"]
    rows = _docs_table()
    assert [_code(row[0]) for row in rows] == list(parameters)
    for row in rows:
        parameter = parameters[_code(row[0])]
        assert _code(row[1]) == parameter["Type"], row[0]
        default = parameter.get("Default")
        assert _code(row[2]) == ("—" if default is None else '""' if default == "" else str(default)), row[0]
        assert row[3], f"{row[0]} has no description"
