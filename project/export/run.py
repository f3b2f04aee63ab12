"""Export a checkpoint for inference (ONNX or TorchScript, optionally pruned or int8) and check it on real data.

    python -m project.export --ckpt_path P [--format onnx|torchscript] [--quantize [dynamic-int8,static-int8]]
                             [--prune AMOUNT] [--out DIR] [--split test|val] [--batches N] [overrides...]

The model is rebuilt from the run's config.yaml (next to its checkpoints/ folder), read as data, as
project.evaluate does; the split to check on comes from your configs and flags. An exported model takes
what the module's forward takes, and returns logits:
for images, uint8 NCHW ([N, 3, H, W] at the run's data.image_size, any N), normalization inside it; for
text (a data module with a tokenizer), int64 token ids [N, L] padded at the end with the tokenizer's pad
id, any N and any L up to data.max_tokens. A text export comes with the tokenizer.json it was trained
with, copied beside the model file (DIR/tokenizer.json, checked against the checkpoint's tokenizer hash,
named in report.json): tokenize with it, truncate to max_tokens and pad, then run the model.
With `data.tokenizer: hashed` there is no file: DIR/features.json names the hashed n-grams' definition
(project/tasks/text/hashed.py) and its hash. A model with an n-gram branch (model.ngram_branch) takes a second
input, `ngrams`: int64 hashed n-gram ids [N, M] padded with 0, any M up to data.ngram_ids, defined in
DIR/ngrams.json.

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

import json
import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Literal

import numpy as np
from rich.console import Console

from project.callbacks.checkpoint_io import is_local, load_checkpoint_file, local_checkpoint
from project.checkpoint_cli import CheckpointCLI
from project.cli import ProjectCLI, print_train_help
from project.commands import command_line, parse_tool_arguments
from project.data.atomic import replace_atomically, write_json_atomically
from project.data.outputs import local_output
from project.data.paths import check_output, make_folder
from project.errors import UserError, run_main
from project.export.checks import build_variants, inputs, measure, report_table, split_batches
from project.export.formats import (
    Inputs,
)
from project.redact import redact
from project.tasks.text.tokenizer import file_hash


def options(
    *,
    ckpt_path: str,
    format: Literal["onnx", "torchscript"] = "onnx",  # noqa: A002
    quantize: list[Literal["dynamic-int8", "static-int8"]] | None = None,
    prune: float | None = None,
    out: Path | None = None,
    split: Literal["test", "val"] = "test",
    batches: int = 50,
    calibration_batches: int = 10,
    repeats: int = 50,
) -> SimpleNamespace:
    """Export a checkpoint (ONNX or TorchScript, optionally pruned or int8) and check its parity.

    Args:
        ckpt_path: the checkpoint to export (a path or a URL).
        format: the exported file's format.
        quantize: add int8 variants (onnx).
        prune: add a variant with this share of the weights zero.
        out: the output folder (default: <run folder>/export).
        split: the split to check on.
        batches: batches of the split to check on.
        calibration_batches: batches to calibrate static int8 on.
        repeats: timed runs for the median latency.
    """
    local_output("--out", out, "export writes a local folder")
    quantize = list(quantize or [])
    if is_local(ckpt_path) and not Path(ckpt_path).is_file():
        raise UserError(f"checkpoint not found: {ckpt_path}")
    if quantize and format != "onnx":
        raise UserError(f"--quantize {quantize[0]} needs --format onnx (int8 is done by onnxruntime)")
    if prune is not None and not 0 < prune < 1:
        raise UserError(f"--prune must be in (0, 1), got {prune}")
    if min(batches, calibration_batches, repeats) < 1:
        raise UserError("--batches, --calibration_batches and --repeats must be at least 1")
    return SimpleNamespace(
        ckpt_path=ckpt_path,
        format=format,
        quantize=quantize,
        prune=prune,
        out=out,
        split=split,
        batches=batches,
        calibration_batches=calibration_batches,
        repeats=repeats,
    )


def export_help(usage: str) -> None:
    print_train_help(usage + "\nThey override the run's config (e.g. --data.num_workers 0).")


def parse_args(args: list[str]) -> tuple[SimpleNamespace, list[str]]:
    """(export options, overrides of the run's config)."""
    given, overrides = parse_tool_arguments(options, "project.export", args, on_help=export_help)
    return options(**given), overrides


def load_run(ckpt_path: Path, overrides: list[str]) -> ProjectCLI:
    """The run's model (with the checkpoint's weights, in eval mode, on the CPU) and data."""
    cli = CheckpointCLI(args=[f"--ckpt_path={ckpt_path}", *overrides], checkpoint=str(ckpt_path))
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


def model_inputs(cli: ProjectCLI) -> tuple[Inputs, ...]:
    """Images, or token ids when the data module tokenizes (it has a tokenizer file), and then the hashed n-gram
    ids of a model with an n-gram branch."""
    data = cli.datamodule
    if not hasattr(type(data), "tokenizer_path"):
        return (Inputs(),)
    tokens = Inputs("tokens", sequence=True, pad_id=int(data.pad_id), max_length=getattr(data, "max_tokens", None))
    if not getattr(cli.model, "hparams", {}).get("ngram_branch", False):
        return (tokens,)
    return tokens, Inputs("ngrams", sequence=True, pad_id=0, max_length=data.ngram_ids)


def write_ngrams(cli: ProjectCLI, out: Path) -> dict:
    """The n-gram branch's input defined in out/ngrams.json (hashed.py's features, as data.ngram_ids made them);
    what report.json says of it."""
    from project.tasks.text.hashed import HashedNGrams

    data = cli.datamodule
    buckets = data.hash_buckets
    spec = {"features": HashedNGrams.spec(buckets), "buckets": buckets, "sha256": HashedNGrams.fingerprint(buckets)}
    spec.update(max_ids=data.ngram_ids, pad_id=0)
    made = json.dumps(spec, indent=2).encode()
    replace_atomically(out / "ngrams.json", lambda temporary: temporary.write_bytes(made))
    print(f"wrote the n-gram branch's features' definition to {out / 'ngrams.json'}", file=sys.stderr)
    return {"file": "ngrams.json", **spec}


def copy_tokenizer(cli: ProjectCLI, out: Path) -> dict:
    """The tokenizer the model was trained with, copied to out/tokenizer.json; what report.json says of it."""
    data = cli.datamodule
    digest = data.tokenizer_hash  # checked against the training index, and by the model against the checkpoint
    if getattr(data, "hashed", False):  # hashed n-grams: no file, the definition (project/tasks/text/hashed.py)
        spec = {"features": data.tokenizer.spec(data.hash_buckets), "buckets": data.hash_buckets, "sha256": digest}
        made = json.dumps(spec, indent=2).encode()
        replace_atomically(out / "features.json", lambda temporary: temporary.write_bytes(made))
        print(f"wrote the hashed n-gram features' definition to {out / 'features.json'}", file=sys.stderr)
        return {
            "file": "features.json",
            "source": "hashed",
            "sha256": digest,
            "pad_id": 0,
            "max_tokens": data.max_tokens,
        }
    source = Path(data.tokenizer_path)
    target = out / "tokenizer.json"
    if source.is_dir():  # a pretrained model's folder: its tokenizer as AutoTokenizer makes it, in one file
        from project.tasks.text.pretrained import folder_tokenizer

        made = folder_tokenizer(source).to_str().encode("utf-8")  # what the hash was taken of
        replace_atomically(target, lambda temporary: temporary.write_bytes(made))
    elif source.resolve() != target.resolve():
        replace_atomically(target, lambda temporary: shutil.copyfile(source, temporary))
    if file_hash(target) != digest:
        raise UserError(f"{source} changed while it was copied to {target}: run the export again")
    print(f"copied the tokenizer {source} to {target}", file=sys.stderr)
    return {
        "file": target.name,
        "source": str(source),
        "sha256": digest,
        "pad_id": int(data.pad_id),
        "max_tokens": getattr(data, "max_tokens", None),
    }


def output_folder(out: Path | None, run: Path | None) -> Path:
    """The folder to export into, made: --out, else the run folder's `export` (the current folder's for a
    checkpoint URL). A run folder may be a stranger's: a link in it out of it (`export -> someone/else/models`,
    a model file planted as a link) is refused in one line before anything is loaded or written. --out itself
    may be a link: the user named it."""
    root = out if out is not None else (run if run is not None else Path("."))
    out = out if out is not None else root / "export"
    check_output(out, root)
    for existing in out.glob("model*") if out.is_dir() else ():  # large ONNX models are written in place
        check_output(existing, out)
    return make_folder(out)  # one line where --out names a file


def main(args: list[str] | None = None) -> dict:
    options, overrides = parse_args(command_line(args))
    given, remote = options.ckpt_path, not is_local(options.ckpt_path)
    options.ckpt_path = local_checkpoint(options.ckpt_path)  # a URL's copy, in a folder of this user's
    options.out = output_folder(options.out, None if remote else options.ckpt_path.resolve().parent.parent)
    cli = load_run(options.ckpt_path, overrides)
    specs = model_inputs(cli)
    tokenizer = copy_tokenizer(cli, options.out) if specs[0].sequence else None
    ngrams = write_ngrams(cli, options.out) if len(specs) > 1 else None
    first = inputs(cli, next(split_batches(cli, options.split, 1)))
    # batch 2: the batch axis stays free
    example = tuple(tensor[:2] if len(tensor) > 1 else tensor.repeat(2, *[1] * (tensor.dim() - 1)) for tensor in first)
    calibration = []
    if "static-int8" in options.quantize:
        other = "val" if options.split == "test" else "test"  # calibrate on data the table does not report
        batches = split_batches(cli, other, options.calibration_batches)
        calibration = [tuple(tensor.numpy() for tensor in inputs(cli, batch)) for batch in batches]
    variants = build_variants(options, cli.model, example, calibration, specs)
    module_accuracy, lengths = measure(cli, options, variants, specs, example)
    results = [variant for variant, _ in variants.values()]
    Console(width=max(Console().width, 120)).print(report_table(results, module_accuracy, options.split))
    report = {
        "checkpoint": redact(given),
        "format": options.format,
        "split": options.split,
        "module_accuracy": module_accuracy,
        # the exported graph returns logits; softmax(logits / temperature) are predict's calibrated probabilities
        "temperature": float(cli.model.calibration.temperature) if hasattr(cli.model, "calibration") else 1.0,
        "variants": [asdict(v) for v in results],
    }
    if tokenizer is not None:
        report.update(input=specs[0].name, tokenizer=tokenizer, sequence_lengths=lengths)
    if ngrams is not None:
        report.update(inputs=[spec.name for spec in specs], ngrams=ngrams)
        print(f"checked at {len(lengths)} token lengths from {lengths[0]} to {lengths[-1]}", file=sys.stderr)
    write_json_atomically(options.out / "report.json", report)
    tokenizer_file = " with tokenizer.json" if tokenizer else ""
    print(f"exported to {options.out}{tokenizer_file} (report.json holds the table)")
    fp32 = variants["fp32"][0]
    tolerance = 1e-3 * max(1.0, float(np.abs(cli.model(*example).detach().numpy()).max()))
    if fp32.max_abs_diff > tolerance:
        message = f"error: the fp32 export differs from the module by {fp32.max_abs_diff:.2e} (> {tolerance:.1e})"
        print(message, file=sys.stderr)
        raise SystemExit(1)
    return report


def console() -> None:
    """The `shards-export` console script."""
    run_main(main)


if __name__ == "__main__":
    console()
