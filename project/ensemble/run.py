"""Combine several models' predictions of the same samples: their calibrated log-probabilities, added.

    python -m project.predict --ckpt_path A.ckpt --data.root data/mytexts --data.predict data/mytexts/test \
        --out a.jsonl --log_probs true
    python -m project.predict --ckpt_path B.ckpt --data.root data/mytexts --data.predict data/mytexts/test \
        --out b.jsonl --log_probs true
    python -m project.ensemble a.jsonl b.jsonl [--out ensemble.jsonl] [--top_k 5]

Each input is `project.predict`'s output (JSONL or Parquet) written with `--log_probs true`: every class's
log-probability, each model's logits divided by the temperature fitted on its own val split. Models trained
apart, on their own tokenizers or image sizes, are read by their own configs; their rows are joined here by
the sample's key, so their order and batch sizes do not matter. The sum of calibrated log-probabilities (a
product of experts) picks the class; the rows' probabilities are softmax(sum / n), the normalised geometric
mean of the n models' probabilities, which stays as sure as its models where the product would be surer than
any (benchmarks/README.md, "After NBSVM").

Printed: each model's accuracy and the ensemble's on the samples that carry labels, then one JSON object on
the last line, for scripts. A row that cannot be read (not JSON, no key, log-probabilities missing, not finite
or above 0) is skipped and counted, as is a sample missing from some inputs; classes that differ between the
inputs, or labels that disagree, are one line, before anything is written.

The inputs are joined on disk (join.py), so the predictions of a pool far larger than memory can be combined.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from project.commands import run_command
from project.data.outputs import local_output
from project.ensemble.join import Joined, ensemble_rows, summary
from project.errors import UserError, run_main
from project.shown import shown

MODULE = "project.ensemble"


def check(predictions: list[str], out: str | None, top_k: int) -> list[Path]:
    """The arguments' one-line errors, before any file is read."""
    from project.callbacks.predictions import FORMATS, check_output

    if len(predictions) < 2:
        raise UserError(f"give two prediction files or more (project.predict --log_probs true), got {len(predictions)}")
    paths = [Path(path) for path in predictions]
    for path in paths:
        if path.suffix not in FORMATS:
            raise UserError(f"{path}: a prediction file ends in {' or '.join(FORMATS)}")
        if not path.is_file():
            raise UserError(f"prediction file not found: {path}")
        if path.suffix == ".parquet" and importlib.util.find_spec("pyarrow") is None:
            raise UserError(f'{path}: reading Parquet needs pyarrow: pip install -e ".[parquet]"')
    if len({path.resolve() for path in paths}) < len(paths):
        raise UserError("a prediction file is given twice: it would count its model twice")
    if top_k < 1:
        raise UserError(f"--top_k must be at least 1, got {top_k}")
    if out is not None:
        local_output("--out", out, "ensemble writes a local file")
        check_output(Path(out))
        if Path(out).resolve() in {path.resolve() for path in paths}:
            raise UserError(f"--out {out} is one of the inputs")
    return paths


def ensemble(predictions: list[str], out: str | None = None, top_k: int = 5, quiet: bool = False) -> dict[str, Any]:
    """Add several models' calibrated log-probabilities of the same samples (project.predict --log_probs true).

    Args:
        predictions: project.predict's outputs (.jsonl or .parquet), each written with --log_probs true.
        out: where to write the combined rows (.jsonl or .parquet): key, pred, prob, top classes, label.
        top_k: classes listed per row, most probable first.
        quiet: no progress bars or lines about skipped rows.
    """
    from project.callbacks.predictions import write_rows

    paths = check(predictions, out, top_k)
    # the join's scratch table lies beside the output (on a disk the user chose), else in the temporary folder
    beside = Path(out).parent if out is not None and Path(out).parent.is_dir() else None
    with tempfile.TemporaryDirectory(prefix=".ensemble-", dir=beside) as folder:
        joined = Joined(Path(folder))
        try:
            for index, path in enumerate(paths):
                joined.add(index, path, quiet)
            result = summary(joined, paths)
            if not result["samples"]:
                raise UserError("no sample is in every input: are these predictions of the same data?")
            if result["left_out"] and not quiet:
                print(f"{result['left_out']} samples are not in every input: left out", file=sys.stderr)
            if out is not None:
                rows = write_rows(Path(out), ensemble_rows(joined, len(paths), top_k))
                print(f"wrote {rows} rows to {shown(out)}", file=sys.stderr)
        finally:
            joined.close()
    if "acc" in result:
        for path, accuracy in result["members"].items():
            print(f"{shown(path)}: acc {accuracy:.4f}")
        print(f"ensemble of {len(paths)}: acc {result['acc']:.4f} on {result['labelled']:,} labelled samples")
    elif out is None:
        print("no sample has a label: give --out to write the combined predictions", file=sys.stderr)
    print(json.dumps(result, sort_keys=True))
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return run_command(ensemble, MODULE, argv)


def console() -> None:
    """The `shards-ensemble` console script."""
    run_main(main)
