"""One of each: the helpers that exist once in the tree stay the only ones.

Each guard reads the sources as text: a second definition fails here with its place named, before a
review has to find it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import PROJECT

SOURCE_ROOTS = ["components", "cloud", "bench"]


def _sources(*roots: str) -> list[Path]:
    return sorted(path for root in roots or SOURCE_ROOTS for path in (PROJECT / root).rglob("*.py"))


def _places(pattern: str, *roots: str) -> list[str]:
    """`file:line` of every line matching `pattern` in the project's sources (or the given roots)."""
    regex = re.compile(pattern)
    found = []
    for path in _sources(*roots):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if regex.search(line):
                found.append(f"{path.relative_to(PROJECT)}:{number}")
    return found


def _files(places: list[str]) -> list[str]:
    return sorted({place.rsplit(":", 1)[0] for place in places})


def test_one_sha256_of_a_file() -> None:
    # A file digest read in chunks is edgeinfer.files.sha256_file; hashing bytes in memory is fine.
    assert _files(_places(r"iter\(lambda: \w+\.read\(")) == ["components/edgeinfer/files.py"]
    assert _files(_places(r"def \w*sha256\w*\(")) == ["components/edgeinfer/files.py"]


@pytest.mark.parametrize("root", SOURCE_ROOTS)
def test_sources_exist(root: str) -> None:
    assert _sources(root), f"no sources under {root}/: the guards above would pass vacuously"


# /proc's formats are read by edgeinfer.procfs alone: /proc/<pid>/stat's fields after the command's
# closing parenthesis, cmdline's NUL-separated argv, /proc/stat's cpu lines, meminfo.
_PROC_FORMATS = "|".join(
    [
        r'r(?:split|partition|find)\(b?"\)"',
        r'split\(b"\\0"\)',
        r'startswith\("cpu',
        r'"VmRSS:',
        r"/proc/\{",
        r'"/proc/(?:stat|uptime|meminfo)"',
    ]
)


def test_one_proc_reader() -> None:
    found = _files(_places(_PROC_FORMATS))
    assert found == ["components/edgeinfer/procfs.py"]
    # A process's resident memory is procfs.process_rss_bytes.
    assert _files(_places(r"def \w*rss\w*\(")) == ["components/edgeinfer/procfs.py"]


def test_one_request_encoder() -> None:
    # Requests are encoded by edgeinfer.messages.Request (load generators: edgeinfer_bench.requests),
    # never as a dict with a base64 image written by hand.
    assert _places(r'"image":\s*\w*\.?b64encode') == []
    assert _files(_places(r'"__ID__"')) == ["bench/edgeinfer_bench/requests.py"]


def test_one_mqtt_client() -> None:
    # An MQTT connection is edgeinfer.transport.mqtt.MqttPubSub (the simulator's IoT bridge and the
    # tests' cloud side included): no other code builds an awscrt client or connection. The one
    # exception is the IPC benchmark's baseline, which measures bare awscrt on purpose.
    builders = r"\bmqtt5?\.(?:Client|Connection)\(|mqtt_connection_builder|mqtt5_client_builder\."
    assert _files(_places(builders)) == [
        "bench/edgeinfer_bench/sim.py",
        "components/edgeinfer/transport/mqtt.py",
    ]
    assert _places(r"^class \w*Mqtt\w*Client\b") == []


def test_one_wait_in_the_tests() -> None:
    # Polling for a condition is tests.helpers.wait (wait_for -> bool, eventually asserts).
    assert _files(_places(r"^def _?(?:wait_for|eventually)\(", "tests")) == ["tests/helpers/wait.py"]
