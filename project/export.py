"""Export a checkpoint for inference (ONNX or TorchScript, optionally pruned or int8) and check it on real data.

    python -m project.export --ckpt_path P [--format onnx|torchscript] [--quantize dynamic-int8|static-int8 ...]
                             [--prune AMOUNT] [--out DIR] [--split test|val] [--batches N] [overrides...]

The model and data are rebuilt from the run's config.yaml (next to its checkpoints/ folder), as
project.evaluate does. An exported model takes what the module's forward takes: uint8 images, NCHW
([N, 3, H, W] at the run's data.image_size, any N), and returns logits; normalization is inside it.

Variants: fp32 always; `--prune A` adds a copy whose A share of smallest-magnitude convolution and linear
weights is zeroed (torch.nn.utils.prune, global L1); `--quantize` adds an int8 version of each. Every
variant runs on real batches of the split next to the checkpoint's own module, and a table reports the
max abs difference of the logits, top-1 agreement, accuracy, file size and median CPU latency at batch 1
(also written to DIR/report.json). An fp32 export that disagrees with the module is an error (exit 1).

int8 comes from onnxruntime.quantization on the ONNX graph, so --quantize needs --format onnx: torch
2.14 deprecates torch.ao.quantization and quantized tensors, and its successor (torchao's PT2E) gives
int8 CPU code only through torch.compile, not as a file. static-int8 quantizes weights per channel and
activations with ranges calibrated on real batches of the other evaluation split (QDQ format);
dynamic-int8 quantizes weights and computes activation ranges at run time (no calibration, slower).
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from itertools import islice
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.progress import track
from rich.table import Table
from torch import nn

from project.cli import ProjectCLI, print_train_help
from project.errors import UserError, run_main
from project.evaluate import run_config
from project.export_formats import (
    Runner,
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


def parse_args(args: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        prog="python -m project.export",
        description="Export a checkpoint (ONNX or TorchScript, optionally pruned or int8) and check its parity.",
    )
    parser.add_argument("--ckpt_path", type=Path, required=True, help="the checkpoint to export")
    parser.add_argument("--format", choices=("onnx", "torchscript"), default="onnx")
    parser.add_argument("--quantize", nargs="+", default=[], choices=("dynamic-int8", "static-int8"),
                        help="add int8 variants (onnx)")  # fmt: skip
    parser.add_argument("--prune", type=float, metavar="AMOUNT", help="add a variant with this share of weights zero")
    parser.add_argument("--out", type=Path, help="output folder (default: <run folder>/export)")
    parser.add_argument("--split", choices=("test", "val"), default="test", help="the split to check on")
    parser.add_argument("--batches", type=int, default=50, help="batches of the split to check on")
    parser.add_argument("--calibration-batches", type=int, default=10, help="batches to calibrate static int8 on")
    parser.add_argument("--repeats", type=int, default=50, help="timed runs for the median latency")
    if "-h" in args or "--help" in args:
        print_train_help(parser.format_help() + "\nThey override the run's config (e.g. --data.num_workers 0).")
    options, overrides = parser.parse_known_args(args)
    if not options.ckpt_path.is_file():
        raise UserError(f"checkpoint not found: {options.ckpt_path}")
    if options.quantize and options.format != "onnx":
        raise UserError(f"--quantize {options.quantize[0]} needs --format onnx (int8 is done by onnxruntime)")
    if options.prune is not None and not 0 < options.prune < 1:
        raise UserError(f"--prune must be in (0, 1), got {options.prune}")
    if min(options.batches, options.calibration_batches, options.repeats) < 1:
        raise UserError("--batches, --calibration-batches and --repeats must be at least 1")
    return options, overrides


def load_run(ckpt_path: Path, overrides: list[str]) -> ProjectCLI:
    """The run's model (with the checkpoint's weights, in eval mode, on the CPU) and data."""
    cli = ProjectCLI(args=overrides, extra_config_files=run_config(ckpt_path), from_checkpoint=True)
    try:
        state = torch.load(ckpt_path, map_location="cpu", weights_only=True)["state_dict"]
    except (OSError, RuntimeError, KeyError, TypeError, pickle.UnpicklingError) as error:
        raise UserError(f"{ckpt_path} is not a Lightning checkpoint: {error}") from None
    missing, unexpected = cli.model.load_state_dict(state, strict=False)
    if missing or unexpected:
        names = ", ".join([*(f"missing {k}" for k in missing[:2]), *(f"unexpected {k}" for k in unexpected[:2])])
        raise UserError(f"{ckpt_path} does not fit the model of its run's config: {names}")
    if not hasattr(cli.model, "inputs_and_targets"):
        raise UserError(
            f"project.export checks an export on batches of its split, so it needs a model with "
            f"inputs_and_targets(batch) (what forward takes, and the labels); {type(cli.model).__name__} has none"
        )
    cli.model.cpu().eval()
    return cli


def loader(cli: ProjectCLI, split: str) -> torch.utils.data.DataLoader:
    return cli.datamodule.test_dataloader() if split == "test" else cli.datamodule.val_dataloader()


def inputs(cli: ProjectCLI, batch: object) -> torch.Tensor:
    """What the model's forward takes from a batch (an exported model takes the same)."""
    return cli.model.inputs_and_targets(batch)[0]


def split_batches(cli: ProjectCLI, split: str, count: int) -> Iterator[dict]:
    return islice(iter(loader(cli, split)), count)


def build_variants(
    options: argparse.Namespace, model: nn.Module, example: torch.Tensor, calibration: list[np.ndarray]
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
        export(source, example, path)
        variants[name] = (Variant(name, str(path), zeros=zero_share(source)), runner(path))
        for mode in options.quantize:
            quantized_name = f"{name}+{mode}" if name != "fp32" else mode
            target = path.with_name(f"{path.stem}.{mode}{suffix}")
            print(f"quantizing {name} to {target}", file=sys.stderr)
            quantize_onnx(path, target, mode, calibration)
            variants[quantized_name] = (Variant(quantized_name, str(target), zeros=zero_share(source)), runner(target))
    return variants


def measure(cli: ProjectCLI, options: argparse.Namespace, variants: dict[str, tuple[Variant, Runner]]) -> float:
    """Run the module and every variant on the same batches; returns the module's own accuracy."""
    model, correct, samples = cli.model, 0, 0
    total = min(options.batches, len(loader(cli, options.split)))
    for batch in track(split_batches(cli, options.split, options.batches), "checking", total=total):
        images, labels = model.inputs_and_targets(batch)
        labels = labels.numpy()
        with torch.no_grad():
            reference = model(images).numpy()
        correct, samples = correct + int((reference.argmax(1) == labels).sum()), samples + len(labels)
        for variant, run in variants.values():
            logits = run(images)
            variant.max_abs_diff = max(variant.max_abs_diff, float(np.abs(logits - reference).max()))
            variant.counts["agree"] += int((logits.argmax(1) == reference.argmax(1)).sum())
            variant.counts["correct"] += int((logits.argmax(1) == labels).sum())
            variant.counts["samples"] += len(labels)
    first = inputs(cli, next(split_batches(cli, options.split, 1)))[:1]
    for variant, run in variants.values():
        variant.accuracy = variant.counts["correct"] / variant.counts["samples"]
        variant.top1_agreement = variant.counts["agree"] / variant.counts["samples"]
        variant.size_mb, variant.gzip_mb = file_sizes(Path(variant.path))
        variant.latency_ms = median_latency_ms(run, first, options.repeats)
    return correct / max(samples, 1)


def report_table(variants: list[Variant], module_accuracy: float, split: str) -> Table:
    samples = variants[0].counts["samples"]
    table = Table(title=f"export checked on {samples} {split} samples (the module's accuracy: {module_accuracy:.4f})")
    columns = ("variant", "MB", "gzip MB", "zeros", "ms (batch 1)", "accuracy", "max |Δ logit|", "top-1 agree")
    for column in columns:
        table.add_column(column, justify="left" if column == "variant" else "right")
    for v in variants:
        table.add_row(v.name, f"{v.size_mb:.3f}", f"{v.gzip_mb:.3f}", f"{v.zeros:.1%}", f"{v.latency_ms:.3f}",
                      f"{v.accuracy:.4f}", f"{v.max_abs_diff:.2e}", f"{v.top1_agreement:.2%}")  # fmt: skip
    return table


def main(args: list[str] | None = None) -> dict:
    options, overrides = parse_args(list(sys.argv[1:] if args is None else args))
    cli = load_run(options.ckpt_path, overrides)
    options.out = options.out or options.ckpt_path.resolve().parent.parent / "export"
    options.out.mkdir(parents=True, exist_ok=True)
    images = inputs(cli, next(split_batches(cli, options.split, 1)))
    example = images[:2] if len(images) > 1 else images.repeat(2, 1, 1, 1)  # batch 2: the batch axis stays free
    calibration = []
    if "static-int8" in options.quantize:
        other = "val" if options.split == "test" else "test"  # calibrate on data the table does not report
        calibration = [inputs(cli, b).numpy() for b in split_batches(cli, other, options.calibration_batches)]
    variants = build_variants(options, cli.model, example, calibration)
    module_accuracy = measure(cli, options, variants)
    results = [variant for variant, _ in variants.values()]
    Console(width=max(Console().width, 120)).print(report_table(results, module_accuracy, options.split))
    report = {"checkpoint": str(options.ckpt_path), "format": options.format, "split": options.split,
              "module_accuracy": module_accuracy, "variants": [asdict(v) for v in results]}  # fmt: skip
    (options.out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"exported to {options.out} (report.json holds the table)")
    fp32 = variants["fp32"][0]
    tolerance = 1e-3 * max(1.0, float(np.abs(cli.model(example).detach().numpy()).max()))
    if fp32.max_abs_diff > tolerance:
        message = f"error: the fp32 export differs from the module by {fp32.max_abs_diff:.2e} (> {tolerance:.1e})"
        print(message, file=sys.stderr)
        raise SystemExit(1)
    return report


if __name__ == "__main__":
    run_main(main)
