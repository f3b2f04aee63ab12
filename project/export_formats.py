"""What project.export writes and runs: ONNX and TorchScript files, pruned copies, int8 versions (through
onnxruntime), and how each file is timed and sized."""

from __future__ import annotations

import copy
import statistics
import time
import warnings
import zlib
from collections.abc import Callable
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch import nn
from torch.nn.utils import prune

warnings.filterwarnings("ignore", message=r".*`torch.jit.\w+` is deprecated.*")  # TorchScript is asked for
PRUNABLE = (nn.Linear, nn.modules.conv._ConvNd)
Runner = Callable[[torch.Tensor], np.ndarray]


def pruned_copy(model: nn.Module, amount: float) -> nn.Module:
    """A copy with the `amount` share of smallest-magnitude convolution and linear weights set to zero."""
    pruned = copy.deepcopy(model)
    weights = [(module, "weight") for module in pruned.modules() if isinstance(module, PRUNABLE)]
    prune.global_unstructured(weights, pruning_method=prune.L1Unstructured, amount=amount)
    for module, name in weights:
        prune.remove(module, name)  # bake the mask into plain weights: the exporters see ordinary tensors
    return pruned


def zero_share(model: nn.Module) -> float:
    weights = [module.weight for module in model.modules() if isinstance(module, PRUNABLE)]
    total = sum(weight.numel() for weight in weights)
    return sum(int((weight == 0).sum()) for weight in weights) / max(total, 1)


def export_onnx(model: nn.Module, example: torch.Tensor, path: Path) -> None:
    # weights go inside the file unless protobuf's 2 GB limit forces an external data file
    large = sum(p.numel() * p.element_size() for p in model.parameters()) > 1.5e9
    batch = torch.export.Dim("batch")
    with torch.no_grad():
        torch.onnx.export(model, (example,), str(path), input_names=["images"], output_names=["logits"],
                          dynamic_shapes=({0: batch},), external_data=large, verbose=False)  # fmt: skip


def export_torchscript(model: nn.Module, example: torch.Tensor, path: Path) -> None:
    # traced, not scripted: the forward branches on dtype and shape, which tracing fixes for uint8 NCHW;
    # Lightning's to_torchscript lets the tracer walk the module without a trainer attached
    with torch.no_grad():
        if isinstance(model, L.LightningModule):
            model.to_torchscript(str(path), method="trace", example_inputs=example)
        else:
            torch.jit.save(torch.jit.trace(model, example), str(path))


def onnx_runner(path: Path) -> Runner:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()  # the same threads as torch, for a fair latency
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda images: session.run(None, {name: images.numpy()})[0]


def torchscript_runner(path: Path) -> Runner:
    module = torch.jit.load(str(path), map_location="cpu").eval()

    def run(images: torch.Tensor) -> np.ndarray:
        with torch.no_grad():
            return module(images).numpy()

    return run


def quantize_onnx(source: Path, target: Path, mode: str, calibration: list[np.ndarray]) -> None:
    """int8 with onnxruntime.quantization, after its recommended pre-processing (shape inference,
    graph optimization that folds batch norms into convolutions)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Batches(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter(calibration)

        def get_next(self) -> dict | None:
            batch = next(self.batches, None)
            return None if batch is None else {"images": batch}

    prepared = target.with_name(f"{target.stem}.prepared.onnx")
    quant_pre_process(str(source), str(prepared))
    if mode == "dynamic-int8":
        quantize_dynamic(str(prepared), str(target), weight_type=QuantType.QInt8)
    else:
        quantize_static(str(prepared), str(target), Batches(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)  # fmt: skip
    prepared.unlink()


def file_sizes(path: Path) -> tuple[float, float]:
    """(MB, gzip-compressed MB) of a model file and its external data file, if any."""
    files = [p for p in (path, path.with_name(path.name + ".data")) if p.exists()]
    data = b"".join(p.read_bytes() for p in files)
    return len(data) / 1e6, len(zlib.compress(data, 6)) / 1e6


def median_latency_ms(run: Runner, image: torch.Tensor, repeats: int) -> float:
    for _ in range(5):
        run(image)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run(image)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000
