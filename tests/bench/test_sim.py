"""`edgeinfer bench sim` the command: its IoT Core options checked before anything starts."""

from __future__ import annotations

import pytest

from edgeinfer.cli import main


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--iot-size", "4", "--iot-size must be 8 to 131072"),
        ("--iot-size", "140000", "IoT Core's message limit"),
        ("--iot-messages", "-1", "--iot-messages must be 0"),
        ("--iot-delay-ms", "-5", "--iot-delay-ms must be 0 or more"),
    ],
)
def test_bad_iot_options_are_one_line_errors_before_anything_starts(
    option: str, value: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "sim", option, value]) != 0
    err = capsys.readouterr().err.strip()
    assert says in err
    assert len(err.splitlines()) == 1
