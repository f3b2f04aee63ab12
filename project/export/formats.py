"""What project.export writes and runs: ONNX and TorchScript files, pruned copies, int8 versions (through
onnxruntime), and how each file is timed and sized; `Inputs`, what an exported model takes. A model may take
several inputs (a text model with an n-gram branch takes token ids and n-gram ids): they travel as a tuple, in
forward's order, through every export, check and runner."""

from __future__ import annotations

import copy
import logging
import statistics
import time
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch import nn
from torch.nn.utils import prune

from project.data.atomic import replace_atomically

warnings.filterwarnings("ignore", message=r".*`torch.jit.\w+` is deprecated.*")  # TorchScript is asked for
# several inputs share one batch axis on purpose: the exporter says it keeps one name for it
warnings.filterwarnings("ignore", message=r".*axis name: batch will not be used, since it shares.*")
PRUNABLE = (nn.Linear, nn.modules.conv._ConvNd)
Runner = Callable[[tuple[torch.Tensor, ...]], np.ndarray]  # forward's inputs, in order: the logits
SECOND_LENGTH_STEP = 8  # a token batch is checked again padded this much longer (or cut to half, at the limit)


@dataclass(frozen=True)
class Inputs:
    """What an exported model takes: images (any batch size) or, with `sequence`, token ids [N, L] padded
    with `pad_id`, any N and any L up to `max_length`."""

    name: str = "images"
    sequence: bool = False
    pad_id: int = 0
    max_length: int | None = None

    def dynamic_shapes(self) -> tuple[dict[int, torch.export.Dim]]:
        return (self.axes(torch.export.Dim("batch")),)

    def axes(self, batch: torch.export.Dim) -> dict[int, torch.export.Dim]:
        """This input's free axes: the batch (shared by every input), and a sequence's length."""
        axes = {0: batch}
        if self.sequence:
            axes[1] = (
                torch.export.Dim(self.name, max=self.max_length) if self.max_length else torch.export.Dim(self.name)
            )
        return axes

    def checked(self, batch: torch.Tensor) -> list[torch.Tensor]:
        """The inputs a parity check runs for a batch: the batch, and a token batch also at a second padded
        length, so that an export that fixed the example's length fails the check."""
        if not self.sequence:
            return [batch]
        length = batch.shape[1]
        if self.max_length is None or length + SECOND_LENGTH_STEP <= self.max_length:
            padding = torch.full((len(batch), SECOND_LENGTH_STEP), self.pad_id, dtype=batch.dtype)
            return [batch, torch.cat([batch, padding], 1)]
        return [batch, batch[:, : max(1, length // 2)]]  # padded at the end: each row keeps its first tokens


def dynamic_shapes(specs: tuple[Inputs, ...]) -> tuple[dict[int, torch.export.Dim], ...]:
    """The free axes of each of forward's inputs; one batch axis for all of them."""
    if len(specs) == 1:
        return specs[0].dynamic_shapes()
    batch = torch.export.Dim("batch")
    return tuple(spec.axes(batch) for spec in specs)


def checked_inputs(specs: tuple[Inputs, ...], batch: tuple[torch.Tensor, ...]) -> list[tuple[torch.Tensor, ...]]:
    """The inputs a parity check runs for a batch: as the split gives it, and (when any input is a sequence) with
    every sequence at its second padded length (`Inputs.checked`)."""
    each = [spec.checked(tensor) for spec, tensor in zip(specs, batch, strict=True)]
    if all(len(checked) == 1 for checked in each):
        return [batch]
    return [batch, tuple(checked[-1] for checked in each)]


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


def export_onnx(
    model: nn.Module, example: tuple[torch.Tensor, ...], path: Path, specs: tuple[Inputs, ...] = (Inputs(),)
) -> None:
    # weights go inside the file unless protobuf's 2 GB limit forces an external data file
    large = sum(p.numel() * p.element_size() for p in model.parameters()) > 1.5e9

    def export(target: Path) -> None:
        with torch.no_grad():
            torch.onnx.export(
                model,
                tuple(example),
                str(target),
                input_names=[spec.name for spec in specs],
                output_names=["logits"],
                dynamic_shapes=dynamic_shapes(specs),
                external_data=large,
                verbose=False,
            )

    if large:  # the graph names its data file: written in place, a rename would leave it the temporary's name
        export(path)
    else:
        replace_atomically(path, export)  # whole or absent


def export_torchscript(
    model: nn.Module, example: tuple[torch.Tensor, ...], path: Path, specs: tuple[Inputs, ...] = (Inputs(),)
) -> None:
    # traced, not scripted: the forward branches on dtype and shape, which tracing fixes for uint8 NCHW
    # (sizes read from the input, like a token batch's length, stay symbolic in the trace);
    # Lightning's to_torchscript lets the tracer walk the module without a trainer attached
    def export(target: Path) -> None:
        with torch.no_grad():
            if isinstance(model, L.LightningModule):
                model.to_torchscript(str(target), method="trace", example_inputs=tuple(example))
            else:
                torch.jit.save(torch.jit.trace(model, tuple(example)), str(target))

    replace_atomically(path, export)  # whole or absent


def onnx_runner(path: Path) -> Runner:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()  # the same threads as torch, for a fair latency
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [given.name for given in session.get_inputs()]
    return lambda inputs: session.run(None, {name: tensor.numpy() for name, tensor in zip(names, inputs, strict=True)})[
        0
    ]


def torchscript_runner(path: Path) -> Runner:
    module = torch.jit.load(str(path), map_location="cpu").eval()

    def run(inputs: tuple[torch.Tensor, ...]) -> np.ndarray:
        with torch.no_grad():
            return module(*inputs).numpy()

    return run


def quantize_onnx(
    source: Path,
    target: Path,
    mode: str,
    calibration: list[tuple[np.ndarray, ...]],
    names: tuple[str, ...] = ("images",),
) -> None:
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
            return None if batch is None else dict(zip(names, batch, strict=True))

    def quantize(temporary: Path) -> None:
        prepared = temporary.with_name(f"{temporary.stem}.prepared.onnx")
        try:
            quant_pre_process(str(source), str(prepared))
        except Exception:  # noqa: BLE001 - its symbolic shape inference gives up on some graphs (BERT's attention)
            quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)  # ONNX's own inference only
        try:
            if mode == "dynamic-int8":
                quantize_dynamic(str(prepared), str(temporary), weight_type=QuantType.QInt8)
            else:  # its per-channel pass logs a warning for every norm's 1-d weight, on the root logger
                quiet_root_warnings()
                quantize_static(
                    str(prepared),
                    str(temporary),
                    Batches(),
                    quant_format=QuantFormat.QDQ,
                    per_channel=True,
                    activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8,
                )
        finally:
            prepared.unlink(missing_ok=True)

    replace_atomically(target, quantize)  # whole or absent


def quiet_root_warnings() -> None:
    """Drop onnxruntime's per-channel "Axis 1 is out-of-range for weight ... with rank 1" lines (a norm's weight
    has one axis; it is quantized per tensor, as it should be), which it logs on the root logger."""
    root = logging.getLogger()
    if not any(isinstance(each, RankOneAxis) for each in root.filters):
        root.addFilter(RankOneAxis())


class RankOneAxis(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "is out-of-range for weight" not in record.getMessage()


def file_sizes(path: Path) -> tuple[float, float]:
    """(MB, gzip-compressed MB) of a model file and its external data file, if any."""
    files = [p for p in (path, path.with_name(path.name + ".data")) if p.exists()]
    data = b"".join(p.read_bytes() for p in files)
    return len(data) / 1e6, len(zlib.compress(data, 6)) / 1e6


def median_latency_ms(run: Runner, inputs: tuple[torch.Tensor, ...], repeats: int) -> float:
    for _ in range(5):
        run(inputs)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run(inputs)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000
