"""Export a checkpoint for inference (ONNX or TorchScript, optionally pruned or int8) and check it on real data.

    python -m project.export --ckpt_path P [--format onnx|torchscript] [--quantize dynamic-int8|static-int8 ...]
                             [--prune AMOUNT] [--out DIR] [--split test|val] [--batches N] [overrides...]

The model and data are rebuilt from the run's config.yaml (next to its checkpoints/ folder), as
project.evaluate does. An exported model takes what the module's forward takes, and returns logits:
for images, uint8 NCHW ([N, 3, H, W] at the run's data.image_size, any N), normalization inside it; for
text (a data module with a tokenizer), int64 token ids [N, L] padded at the end with the tokenizer's pad
id, any N and any L up to data.max_tokens. A text export comes with the tokenizer.json it was trained
with, copied beside the model file (DIR/tokenizer.json, checked against the checkpoint's tokenizer hash,
named in report.json): tokenize with it, truncate to max_tokens and pad, then run the model.

Variants: fp32 always; `--prune A` adds a copy whose A share of smallest-magnitude convolution and linear
weights is zeroed (torch.nn.utils.prune, global L1); `--quantize` adds an int8 version of each. Every
variant runs on real batches of the split next to the checkpoint's own module, and a table reports the
max abs difference of the logits, top-1 agreement, accuracy, file size and median CPU latency at batch 1
(also written to DIR/report.json). Token batches are checked at their own padded length and again at a
second one, so that an export that fixed the example's length fails. An fp32 export that disagrees with
the module, or a variant that cannot run on a batch of the split, is an error (exit 1).

int8 comes from onnxruntime.quantization on the ONNX graph, so --quantize needs --format onnx: torch
2.14 deprecates torch.ao.quantization and quantized tensors, and its successor (torchao's PT2E) gives
int8 CPU code only through torch.compile, not as a file. static-int8 quantizes weights per channel and
activations with ranges calibrated on real batches of the other evaluation split (QDQ format);
dynamic-int8 quantizes weights and computes activation ranges at run time (no calibration, slower).
"""

from __future__ import annotations

import argparse
import shutil
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

from project.callbacks.checkpoint_io import is_local, load_checkpoint_file, local_checkpoint
from project.cli import ProjectCLI, print_train_help
from project.data.atomic import replace_atomically, write_json_atomically
from project.data.redact import redact
from project.errors import UserError, run_main
from project.evaluate import run_config
from project.export_formats import (
    Inputs,
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
from project.tasks.text.tokenizer import file_hash


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
    parser.add_argument("--ckpt_path", required=True, help="the checkpoint to export (a path or a URL)")
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
    if is_local(options.ckpt_path) and not Path(options.ckpt_path).is_file():
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
    checkpoint = load_checkpoint_file(ckpt_path)  # weights only: a file that would run code is refused
    state = checkpoint.get("state_dict") if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict):
        raise UserError(f"{ckpt_path} is not a Lightning checkpoint: it has no state_dict")
    cli.model.on_load_checkpoint(checkpoint)  # the model's own checks, as Lightning runs them (the tokenizer's)
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


def model_inputs(cli: ProjectCLI) -> Inputs:
    """Images, or token ids when the data module tokenizes (it has a tokenizer file)."""
    data = cli.datamodule
    if not hasattr(type(data), "tokenizer_path"):
        return Inputs()
    return Inputs("tokens", sequence=True, pad_id=int(data.pad_id), max_length=getattr(data, "max_tokens", None))


def copy_tokenizer(cli: ProjectCLI, out: Path) -> dict:
    """The tokenizer the model was trained with, copied to out/tokenizer.json; what report.json says of it."""
    data = cli.datamodule
    source = Path(data.tokenizer_path)
    digest = data.tokenizer_hash  # checked against the training index, and by the model against the checkpoint
    target = out / "tokenizer.json"
    if source.resolve() != target.resolve():
        replace_atomically(target, lambda temporary: shutil.copyfile(source, temporary))
    if file_hash(target) != digest:
        raise UserError(f"{source} changed while it was copied to {target}: run the export again")
    print(f"copied the tokenizer {source} to {target}", file=sys.stderr)
    return {"file": target.name, "source": str(source), "sha256": digest, "pad_id": int(data.pad_id),
            "max_tokens": getattr(data, "max_tokens", None)}  # fmt: skip


def loader(cli: ProjectCLI, split: str) -> torch.utils.data.DataLoader:
    return cli.datamodule.test_dataloader() if split == "test" else cli.datamodule.val_dataloader()


def inputs(cli: ProjectCLI, batch: object) -> torch.Tensor:
    """What the model's forward takes from a batch (an exported model takes the same)."""
    return cli.model.inputs_and_targets(batch)[0]


def split_batches(cli: ProjectCLI, split: str, count: int) -> Iterator[dict]:
    return islice(iter(loader(cli, split)), count)


def build_variants(
    options: argparse.Namespace, model: nn.Module, example: torch.Tensor, calibration: list[np.ndarray], spec: Inputs
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
        export(source, example, path, spec)
        variants[name] = (Variant(name, str(path), zeros=zero_share(source)), runner(path))
        for mode in options.quantize:
            quantized_name = f"{name}+{mode}" if name != "fp32" else mode
            target = path.with_name(f"{path.stem}.{mode}{suffix}")
            print(f"quantizing {name} to {target}", file=sys.stderr)
            quantize_onnx(path, target, mode, calibration, spec.name)
            variants[quantized_name] = (Variant(quantized_name, str(target), zeros=zero_share(source)), runner(target))
    return variants


def run_variant(variant: Variant, run: Runner, inputs: torch.Tensor, example: torch.Tensor) -> np.ndarray:
    try:
        return run(inputs)
    except Exception as error:  # noqa: BLE001 - onnxruntime's own classes, for a shape its graph fixed
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"error: the {variant.name} export cannot run on inputs of shape {list(inputs.shape)} (exported "
              f"with {list(example.shape)}): {message}", file=sys.stderr)  # fmt: skip
        raise SystemExit(1) from None


def measure(
    cli: ProjectCLI,
    options: argparse.Namespace,
    variants: dict[str, tuple[Variant, Runner]],
    spec: Inputs,
    example: torch.Tensor,
) -> tuple[float, list[int]]:
    """Run the module and every variant on the same batches (token batches also at a second padded length);
    returns the module's own accuracy, and the sequence lengths checked (token inputs)."""
    model, correct, samples, lengths = cli.model, 0, 0, set()
    total = min(options.batches, len(loader(cli, options.split)))
    for batch in track(split_batches(cli, options.split, options.batches), "checking", total=total):
        batch_inputs, labels = model.inputs_and_targets(batch)
        labels = labels.numpy()
        for number, checked in enumerate(spec.checked(batch_inputs)):
            lengths.update([checked.shape[1]] if spec.sequence else [])
            with torch.no_grad():
                reference = model(checked).numpy()
            if number == 0:  # accuracy and agreement on the batch as the split gives it
                correct, samples = correct + int((reference.argmax(1) == labels).sum()), samples + len(labels)
            for variant, run in variants.values():
                logits = run_variant(variant, run, checked, example)
                variant.max_abs_diff = max(variant.max_abs_diff, float(np.abs(logits - reference).max()))
                if number == 0:
                    variant.counts["agree"] += int((logits.argmax(1) == reference.argmax(1)).sum())
                    variant.counts["correct"] += int((logits.argmax(1) == labels).sum())
                    variant.counts["samples"] += len(labels)
    first = inputs(cli, next(split_batches(cli, options.split, 1)))[:1]
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
        table.add_row(v.name, f"{v.size_mb:.3f}", f"{v.gzip_mb:.3f}", f"{v.zeros:.1%}", f"{v.latency_ms:.3f}",
                      f"{v.accuracy:.4f}", f"{v.max_abs_diff:.2e}", f"{v.top1_agreement:.2%}")  # fmt: skip
    return table


def main(args: list[str] | None = None) -> dict:
    options, overrides = parse_args(list(sys.argv[1:] if args is None else args))
    given, remote = options.ckpt_path, not is_local(options.ckpt_path)
    options.ckpt_path = local_checkpoint(options.ckpt_path)  # a URL's copy, in a folder of this user's
    cli = load_run(options.ckpt_path, overrides)
    options.out = options.out or (Path("export") if remote else options.ckpt_path.resolve().parent.parent / "export")
    options.out.mkdir(parents=True, exist_ok=True)
    spec = model_inputs(cli)
    tokenizer = copy_tokenizer(cli, options.out) if spec.sequence else None
    first = inputs(cli, next(split_batches(cli, options.split, 1)))
    # batch 2: the batch axis stays free
    example = first[:2] if len(first) > 1 else first.repeat(2, *[1] * (first.dim() - 1))
    calibration = []
    if "static-int8" in options.quantize:
        other = "val" if options.split == "test" else "test"  # calibrate on data the table does not report
        calibration = [inputs(cli, b).numpy() for b in split_batches(cli, other, options.calibration_batches)]
    variants = build_variants(options, cli.model, example, calibration, spec)
    module_accuracy, lengths = measure(cli, options, variants, spec, example)
    results = [variant for variant, _ in variants.values()]
    Console(width=max(Console().width, 120)).print(report_table(results, module_accuracy, options.split))
    report = {"checkpoint": redact(given), "format": options.format, "split": options.split,
              "module_accuracy": module_accuracy, "variants": [asdict(v) for v in results]}  # fmt: skip
    if tokenizer is not None:
        report.update(input=spec.name, tokenizer=tokenizer, sequence_lengths=lengths)
        print(f"checked at {len(lengths)} token lengths from {lengths[0]} to {lengths[-1]}", file=sys.stderr)
    write_json_atomically(options.out / "report.json", report)
    tokenizer_file = " with tokenizer.json" if tokenizer else ""
    print(f"exported to {options.out}{tokenizer_file} (report.json holds the table)")
    fp32 = variants["fp32"][0]
    tolerance = 1e-3 * max(1.0, float(np.abs(cli.model(example).detach().numpy()).max()))
    if fp32.max_abs_diff > tolerance:
        message = f"error: the fp32 export differs from the module by {fp32.max_abs_diff:.2e} (> {tolerance:.1e})"
        print(message, file=sys.stderr)
        raise SystemExit(1)
    return report


if __name__ == "__main__":
    run_main(main)
