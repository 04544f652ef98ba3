"""edgeinfer.codec gives the standard library's results and errors, at native speed."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from edgeinfer import codec

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


def _outcome(fn: Any, *args: Any, **kwargs: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(*args, **kwargs)
    except Exception as exc:
        return "error", type(exc)


@given(JSON_VALUES)
def test_dumps_is_the_same_json_value(value: Any) -> None:
    assert json.loads(codec.dumps(value)) == value
    assert codec.loads(codec.dumps(value)) == value


@given(JSON_VALUES)
def test_dumpb_is_the_stdlibs_compact_utf8(value: Any) -> None:
    assert json.loads(codec.dumpb(value)) == value
    assert codec.dumpb({"k": "é", "n": [1, 2]}) == '{"k":"é","n":[1,2]}'.encode()
    assert codec.dumpb({1: "int key"}) == b'{"1":"int key"}'  # the stdlib's answer, via the fallback


@given(st.text() | st.binary())
@settings(max_examples=300)
def test_loads_matches_the_stdlib_on_any_input(data: str | bytes) -> None:
    ours, theirs = _outcome(codec.loads, data), _outcome(json.loads, data)
    big = isinstance(theirs[1], int) and not -(2**63) <= theirs[1] < 2**64
    assume(not big)  # the documented difference, tested below
    assert ours[0] == theirs[0]
    if ours[0] == "ok":
        assert ours == theirs
    else:
        assert issubclass(ours[1], ValueError)


@pytest.mark.parametrize(
    "text",
    [
        "NaN",
        "[Infinity, -Infinity]",
        '"\\ud800"',  # a lone surrogate
        '{"a": 1, "a": 2}',
        '"caf\\u00e9"',
    ],
)
def test_loads_corners_where_the_fast_path_refuses_are_the_stdlibs(text: str) -> None:
    ours, theirs = codec.loads(text), json.loads(text)
    assert repr(ours) == repr(theirs)  # repr: NaN != NaN


def test_the_two_documented_differences() -> None:
    assert codec.loads(str(2**70)) == float(2**70)  # json.loads: the exact int
    assert codec.dumps([float("nan"), float("inf")]) == "[null,null]"  # json.dumps: [NaN, Infinity]


def test_dumps_falls_back_for_what_orjson_cannot_write() -> None:
    assert json.loads(codec.dumps({1: 2**70})) == {"1": 2**70}
    with pytest.raises(TypeError):
        codec.dumps({"x": object()})


@given(st.binary(max_size=4096))
def test_b64_round_trip_matches_the_stdlib(data: bytes) -> None:
    encoded = codec.b64encode(data)
    assert encoded == base64.b64encode(data)
    assert codec.b64decode(encoded) == data
    assert codec.b64decode(encoded.decode(), validate=True) == data


@given(st.text(alphabet="ABCDabcd0189+/=\n -_*é", max_size=40), st.booleans())
@settings(max_examples=500)
def test_b64decode_matches_the_stdlib_on_any_input(text: str, validate: bool) -> None:
    ours = _outcome(codec.b64decode, text, validate=validate)
    theirs = _outcome(base64.b64decode, text, validate=validate)
    assert ours == theirs


def test_b64decode_lenient_and_strict_errors_are_the_stdlibs() -> None:
    assert codec.b64decode("aGVs\nbG8=") == b"hello"  # lenient: the newline is skipped
    with pytest.raises(binascii.Error):
        codec.b64decode("aGVs\nbG8=", validate=True)
    with pytest.raises(binascii.Error):
        codec.b64decode("aGVsbG8")  # padding
    with pytest.raises(ValueError, match="ASCII"):
        codec.b64decode("aGVsbG8é")
