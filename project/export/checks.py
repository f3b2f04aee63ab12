"""How project.export checks what it wrote: every variant (fp32, pruned, int8) runs next to the checkpoint's own
module on the same real batches (token batches at two padded lengths; every input of a model that takes several), and
a table reports the largest
logit difference, top-1 agreement, accuracy, file size and median CPU latency."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from rich.progress import track
from rich.table import Table
from torch import nn

from project.export.formats import (
    Inputs,
    Runner,
    checked_inputs,
    export_onnx,
    export_torchscript,
    file_sizes,
    median_latency_ms,
    onnx_runner,
    pruned_copy,
    quantize_onnx,
    torchscript_runner,
    zero_share,
)


@dataclass
class Variant:
    """One exported model and what was measured on it."""

    name: str
    path: str
    size_mb: float = 0.0
    gzip_mb: float = 0.0  # zeroed (pruned) weights show here: they compress
    zeros: float = 0.0  # share of convolution and linear weights that are zero
    latency_ms: float = 0.0
    accuracy: float = 0.0
    max_abs_diff: float = 0.0
    top1_agreement: float = 0.0
    counts: dict = field(default_factory=lambda: {"samples": 0, "correct": 0, "agree": 0})


def build_variants(
    options: SimpleNamespace,
    model: nn.Module,
    example: tuple[torch.Tensor, ...],
    calibration: list[tuple[np.ndarray, ...]],
    specs: tuple[Inputs, ...],
) -> dict[str, tuple[Variant, Runner]]:
    """Write every variant into options.out; each comes with a function that runs its file."""
    suffix, export, runner = {
        "onnx": (".onnx", export_onnx, onnx_runner),
        "torchscript": (".pt", export_torchscript, torchscript_runner),
    }[options.format]
    sources = {"fp32": model}
    if options.prune is not None:
        sources[f"pruned-{options.prune:g}"] = pruned_copy(model, options.prune)
    variants = {}
    for name, source in sources.items():
        path = options.out / f"model{'' if name == 'fp32' else '.' + name}{suffix}"
        print(f"exporting {name} to {path}", file=sys.stderr)
        export(source, example, path, specs)
        variants[name] = (Variant(name, str(path), zeros=zero_share(source)), runner(path))
        for mode in options.quantize:
            quantized_name = f"{name}+{mode}" if name != "fp32" else mode
            target = path.with_name(f"{path.stem}.{mode}{suffix}")
            print(f"quantizing {name} to {target}", file=sys.stderr)
            quantize_onnx(path, target, mode, calibration, tuple(spec.name for spec in specs))
            variants[quantized_name] = (Variant(quantized_name, str(target), zeros=zero_share(source)), runner(target))
    return variants


def run_variant(
    variant: Variant, run: Runner, inputs: tuple[torch.Tensor, ...], example: tuple[torch.Tensor, ...]
) -> np.ndarray:
    try:
        return run(inputs)
    except Exception as error:  # noqa: BLE001 - onnxruntime's own classes, for a shape its graph fixed
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(
            f"error: the {variant.name} export cannot run on inputs of shape {shapes(inputs)} (exported "
            f"with {shapes(example)}): {message}",
            file=sys.stderr,
        )
        raise SystemExit(1) from None


def measure(
    cli: Any,
    options: SimpleNamespace,
    variants: dict[str, tuple[Variant, Runner]],
    specs: tuple[Inputs, ...],
    example: tuple[torch.Tensor, ...],
) -> tuple[float, list[int]]:
    """Run the module and every variant on the same batches (token batches also at a second padded length);
    returns the module's own accuracy, and the sequence lengths checked (token inputs)."""
    model, correct, samples, lengths = cli.model, 0, 0, set()
    total = min(options.batches, len(loader(cli, options.split)))
    for batch in track(split_batches(cli, options.split, options.batches), "checking", total=total):
        labels = model.inputs_and_targets(batch)[1].numpy()
        for number, checked in enumerate(checked_inputs(specs, inputs(cli, batch))):
            lengths.update([checked[0].shape[1]] if specs[0].sequence else [])
            with torch.no_grad():
                reference = model(*checked).numpy()
            if number == 0:  # accuracy and agreement on the batch as the split gives it
                correct, samples = correct + int((reference.argmax(1) == labels).sum()), samples + len(labels)
            for variant, run in variants.values():
                logits = run_variant(variant, run, checked, example)
                variant.max_abs_diff = max(variant.max_abs_diff, float(np.abs(logits - reference).max()))
                if number == 0:
                    variant.counts["agree"] += int((logits.argmax(1) == reference.argmax(1)).sum())
                    variant.counts["correct"] += int((logits.argmax(1) == labels).sum())
                    variant.counts["samples"] += len(labels)
    first = tuple(tensor[:1] for tensor in inputs(cli, next(split_batches(cli, options.split, 1))))
    for variant, run in variants.values():
        variant.accuracy = variant.counts["correct"] / variant.counts["samples"]
        variant.top1_agreement = variant.counts["agree"] / variant.counts["samples"]
        variant.size_mb, variant.gzip_mb = file_sizes(Path(variant.path))
        variant.latency_ms = median_latency_ms(run, first, options.repeats)
    return correct / max(samples, 1), sorted(lengths)


def report_table(variants: list[Variant], module_accuracy: float, split: str) -> Table:
    samples = variants[0].counts["samples"]
    table = Table(title=f"export checked on {samples} {split} samples (the module's accuracy: {module_accuracy:.4f})")
    columns = ("variant", "MB", "gzip MB", "zeros", "ms (batch 1)", "accuracy", "max |Δ logit|", "top-1 agree")
    for column in columns:
        table.add_column(column, justify="left" if column == "variant" else "right")
    for v in variants:
        table.add_row(
            v.name,
            f"{v.size_mb:.3f}",
            f"{v.gzip_mb:.3f}",
            f"{v.zeros:.1%}",
            f"{v.latency_ms:.3f}",
            f"{v.accuracy:.4f}",
            f"{v.max_abs_diff:.2e}",
            f"{v.top1_agreement:.2%}",
        )
    return table


def loader(cli: Any, split: str) -> torch.utils.data.DataLoader:
    return cli.datamodule.test_dataloader() if split == "test" else cli.datamodule.val_dataloader()


def inputs(cli: Any, batch: object) -> tuple[torch.Tensor, ...]:
    """What the model's forward takes from a batch, as a tuple in forward's order (an exported model takes the
    same)."""
    given = cli.model.inputs_and_targets(batch)[0]
    return tuple(given) if isinstance(given, tuple | list) else (given,)


def shapes(inputs: tuple[torch.Tensor, ...]) -> str:
    """The inputs' shapes, for a message: [2, 7] for one, [2, 7] and [2, 300] for two."""
    return " and ".join(str(list(tensor.shape)) for tensor in inputs)


def split_batches(cli: Any, split: str, count: int) -> Iterator[dict]:
    return islice(iter(loader(cli, split)), count)
