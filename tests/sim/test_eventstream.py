"""Event-stream framing, and the IPC server at the wire level (ping, refused connect, bad frames)."""

from __future__ import annotations

import json
import socket
import struct
import uuid
import zlib
from collections.abc import Callable

import pytest

from edgeinfer.sim import Simulator
from edgeinfer.sim import eventstream as es
from tests.helpers.sim import Device


def test_round_trip_of_every_header_type_split_anywhere() -> None:
    headers = {
        ":message-type": es.APPLICATION_MESSAGE,
        ":message-flags": es.FLAG_TERMINATE_STREAM,
        ":stream-id": 7,
        "flag": True,
        "off": False,
        "raw": b"\x00\x01",
        "id": uuid.UUID(int=5),
        ":content-type": "application/json",
    }
    frame = es.encode(headers, b'{"a": 1}')
    total, _headers_len, prelude_crc = struct.unpack(">III", frame[:12])
    assert total == len(frame)
    assert prelude_crc == zlib.crc32(frame[:8])
    assert struct.unpack(">I", frame[-4:])[0] == zlib.crc32(frame[:-4])
    for cut in range(len(frame)):
        decoder = es.Decoder()
        frames = decoder.feed(frame[:cut]) + decoder.feed(frame[cut:] + frame)
        assert len(frames) == 2
        assert frames[0].headers == headers
        assert frames[0].payload == b'{"a": 1}'
        assert (frames[0].message_type, frames[0].flags, frames[0].stream_id) == (0, 2, 7)


def test_corrupt_frames_are_refused() -> None:
    frame = bytearray(es.encode({":message-type": 0}, b"x"))
    frame[-5] ^= 0xFF
    with pytest.raises(es.FrameError, match="message CRC"):
        es.Decoder().feed(bytes(frame))
    with pytest.raises(es.FrameError, match="prelude CRC"):
        es.Decoder().feed(b"\x00" * 8 + b"\x00\x00\x00\x01")


def _recv_frames(sock: socket.socket, n: int) -> list[es.Frame]:
    decoder = es.Decoder()
    frames: list[es.Frame] = []
    while len(frames) < n:
        data = sock.recv(65536)
        if not data:
            break
        frames += decoder.feed(data)
    return frames


@pytest.fixture
def sim(simulator: Callable[..., Simulator], device: Device) -> Simulator:
    device.add("com.example.Raw")
    return simulator(device.recipes, device.artifacts)


def _connect_frame(token: str) -> bytes:
    headers = {":message-type": es.CONNECT, ":message-flags": 0, ":stream-id": 0, ":version": "0.1.0"}
    return es.encode(headers, json.dumps({"authToken": token}).encode())


def test_ping_connect_and_unknown_operation_on_the_wire(sim: Simulator) -> None:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(sim.socket_path)
        sock.sendall(es.encode({":message-type": es.PING, ":message-flags": 0, ":stream-id": 0}, b"hi"))
        (pong,) = _recv_frames(sock, 1)
        assert (pong.message_type, pong.payload) == (es.PING_RESPONSE, b"hi")
        sock.sendall(_connect_frame(sim.ipc_env("com.example.Raw")["SVCUID"]))
        (ack,) = _recv_frames(sock, 1)
        assert (ack.message_type, ack.flags) == (es.CONNECT_ACK, es.FLAG_CONNECTION_ACCEPTED)
        sock.sendall(
            es.encode(
                {
                    ":message-type": es.APPLICATION_MESSAGE,
                    ":message-flags": 0,
                    ":stream-id": 1,
                    "operation": "aws.greengrass#NoSuchThing",
                    ":content-type": "application/json",
                },
                b"{}",
            )
        )
        (err,) = _recv_frames(sock, 1)
        assert (err.message_type, err.flags, err.stream_id) == (
            es.APPLICATION_ERROR,
            es.FLAG_TERMINATE_STREAM,
            1,
        )
        assert "service-model-type" not in err.headers
        assert "unsupported operation" in json.loads(err.payload)["message"]


def test_a_refused_connect_leaves_the_hang_up_to_the_client(sim: Simulator) -> None:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(sim.socket_path)
        sock.sendall(_connect_frame("wrong"))
        (ack,) = _recv_frames(sock, 1)
        assert (ack.message_type, ack.flags) == (es.CONNECT_ACK, 0)
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(1)  # the server did not close the connection
