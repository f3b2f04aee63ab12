"""Combine several models' predictions of the same samples: their calibrated log-probabilities, added.

    python -m project.predict --ckpt_path A.ckpt --data.predict data/mytexts/test --out a.jsonl --log_probs true
    python -m project.predict --ckpt_path B.ckpt --data.predict data/mytexts/test --out b.jsonl --log_probs true
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
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from rich.progress import BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from project.commands import Spellings, run_command
from project.errors import UserError, run_main

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
        check_output(Path(out))
        if Path(out).resolve() in {path.resolve() for path in paths}:
            raise UserError(f"--out {out} is one of the inputs")
    return paths


def read_rows(path: Path, advance: Callable[[int], Any] = lambda done: None) -> Iterator[tuple[int, Any]]:
    """(line number, row) of a JSONL or Parquet file; a JSONL line that is not JSON gives None. `advance` is
    told the bytes (JSONL) or rows (Parquet) read."""
    if path.suffix == ".parquet":
        number = 0
        for batch in parquet_file(path).iter_batches(columns=["key", "label", "log_probs"]):
            for row in batch.to_pylist():
                number += 1
                advance(1)
                if isinstance(row.get("log_probs"), list):  # Parquet's map reads back as (key, value) pairs
                    row["log_probs"] = dict(row["log_probs"])
                yield number, row
        return
    with open(path, "rb") as lines:
        for number, line in enumerate(lines, 1):
            advance(len(line))
            try:
                yield number, json.loads(line)
            except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested past the parser
                yield number, None


def row_values(row: Any, classes: list[str] | None) -> tuple[str, list[str], np.ndarray, str | None] | str:
    """(key, class names, log-probabilities, label) of a row, or why it cannot be used."""
    if not isinstance(row, dict) or not isinstance(row.get("key"), str):
        return "not a row with a key"
    given = row.get("log_probs")
    if not isinstance(given, dict) or not given:
        return "no log_probs"
    names = list(given) if classes is None else classes
    if classes is not None and (len(given) != len(classes) or any(name not in given for name in classes)):
        return "classes " + ", ".join(sorted(set(given) ^ set(classes))[:3])
    try:
        values = np.array([float(given[name]) for name in names], dtype=np.float64)
    except (TypeError, ValueError):
        return "log_probs that are not numbers"
    if not np.isfinite(values).all() or values.max() > 1e-3 or not 0.99 < np.exp(values).sum() < 1.01:
        return "log_probs that are not a distribution's"
    label = row.get("label")
    return row["key"], names, values, label if isinstance(label, str) else None


class Combined:
    """The running sum of each key's log-probabilities, and each input's predicted class, over the inputs."""

    def __init__(self) -> None:
        self.classes: list[str] | None = None
        self.slot: dict[str, int] = {}  # key -> row of the arrays below
        self.sums: list[np.ndarray] = []
        self.labels: list[str | None] = []
        self.predicted: list[list[int]] = []  # per row, each input's argmax (-1: not in that input)
        self.skipped: dict[str, int] = {}  # per input, rows that could not be used

    def complete(self, slot: int, count: int) -> bool:
        """Whether each of the `count` inputs held the row's sample."""
        return len(self.predicted[slot]) == count and -1 not in self.predicted[slot]

    def add(self, index: int, path: Path, quiet: bool) -> None:
        skipped, reasons, keys_here = 0, [], set()
        with Progress(*progress_columns(path), disable=quiet, transient=True) as progress:
            task = progress.add_task(path.name, total=size(path))
            for number, row in read_rows(path, lambda done: progress.advance(task, done)):
                skipped += self.add_row(index, path, number, row, keys_here, reasons)
        self.skipped[str(path)] = skipped
        if skipped and not quiet:
            print(f"{path}: {skipped} rows skipped ({'; '.join(reasons[:3])})", file=sys.stderr)

    def add_row(self, index: int, path: Path, number: int, row: Any, keys_here: set[str], reasons: list[str]) -> int:
        """Adds one row of input `index`; 1 when it was skipped (its reason appended), else 0."""
        values = row_values(row, self.classes)
        if isinstance(values, str) and self.classes is not None and values.startswith("classes "):
            raise UserError(
                f"{path} has other classes than the first input ({values[8:]}, ...): are these models of the same task?"
            )
        if isinstance(values, str) or values[0] in keys_here:
            reasons.append(f"line {number}: {values if isinstance(values, str) else 'a key given twice'}")
            return 1
        key, names, log_probs, label = values
        keys_here.add(key)
        self.classes = self.classes or names
        slot = self.slot.get(key)
        if slot is None:  # new here (after the first input, a sample some input lacks: left out below)
            self.slot[key] = slot = len(self.sums)
            self.sums.append(np.zeros(len(names)))
            self.labels.append(label)
            self.predicted.append([])
        if label is not None and self.labels[slot] is not None and label != self.labels[slot]:
            raise UserError(
                f"{path} labels {key!r} {label!r} where an input before labels it {self.labels[slot]!r}: "
                "are these predictions of the same samples?"
            )
        self.labels[slot] = self.labels[slot] or label
        self.sums[slot] += log_probs
        self.predicted[slot] += [-1] * (index - len(self.predicted[slot])) + [int(log_probs.argmax())]
        return 0


def parquet_file(path: Path) -> Any:
    """The Parquet file, once it opens and has predict's columns with log_probs."""
    import pyarrow as pa
    import pyarrow.parquet as pq  # there: check() asked for it

    try:
        opened = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as error:
        raise UserError(f"{path} cannot be read as Parquet: {str(error).splitlines()[0]}") from None
    missing = {"key", "label", "log_probs"} - set(opened.schema_arrow.names)
    if missing:
        raise UserError(f"{path} has no {', '.join(sorted(missing))} column: predict with --log_probs true")
    return opened


def size(path: Path) -> int:
    """What the progress bar counts to: a JSONL file's bytes, a Parquet file's rows."""
    return path.stat().st_size if path.suffix != ".parquet" else parquet_file(path).metadata.num_rows


def progress_columns(path: Path) -> tuple:
    counted = DownloadColumn() if path.suffix != ".parquet" else MofNCompleteColumn()
    return TextColumn("{task.description}"), BarColumn(), counted, TimeRemainingColumn()


def ensemble_rows(combined: Combined, count: int, top_k: int) -> Iterator[bytes]:
    """The combined rows of the samples every input holds, as JSON lines."""
    names = combined.classes or []
    for key, slot in combined.slot.items():
        if not combined.complete(slot, count):
            continue
        log_probs = combined.sums[slot] / count
        probs = np.exp(log_probs - log_probs.max())
        probs /= probs.sum()
        order = np.argsort(-combined.sums[slot], kind="stable")[: min(top_k, len(names))]
        row = {
            "key": key,
            "pred": names[order[0]],
            "pred_index": int(order[0]),
            "prob": round(float(probs[order[0]]), 6),
            "top_classes": [names[i] for i in order],
            "top_probs": [round(float(probs[i]), 6) for i in order],
        }
        if combined.labels[slot] is not None:
            row["label"] = combined.labels[slot]
        yield (json.dumps(row) + "\n").encode()


def summary(combined: Combined, paths: list[Path]) -> dict[str, Any]:
    """Accuracy of each input and of the sum on the labelled samples every input holds, and the counts."""
    names = combined.classes or []
    index = {name: i for i, name in enumerate(names)}
    complete = [slot for slot in combined.slot.values() if combined.complete(slot, len(paths))]
    labelled = [slot for slot in complete if combined.labels[slot] in index]
    result: dict[str, Any] = {
        "samples": len(complete),
        "left_out": len(combined.slot) - len(complete),
        "skipped_rows": combined.skipped,
        "labelled": len(labelled),
    }
    if labelled:
        truth = np.array([index[combined.labels[slot]] for slot in labelled])
        chosen = np.array([combined.sums[slot].argmax() for slot in labelled])
        members = np.array([combined.predicted[slot] for slot in labelled])
        result["members"] = {str(path): float((members[:, i] == truth).mean()) for i, path in enumerate(paths)}
        result["acc"] = float((chosen == truth).mean())
    return result


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
    combined = Combined()
    for index, path in enumerate(paths):
        combined.add(index, path, quiet)
    result = summary(combined, paths)
    if not result["samples"]:
        raise UserError("no sample is in every input: are these predictions of the same data?")
    if result["left_out"] and not quiet:
        print(f"{result['left_out']} samples are not in every input: left out", file=sys.stderr)
    if out is not None:
        rows = write_rows(Path(out), ensemble_rows(combined, len(paths), top_k))
        print(f"wrote {rows} rows to {out}", file=sys.stderr)
    if "acc" in result:
        for path, accuracy in result["members"].items():
            print(f"{path}: acc {accuracy:.4f}")
        print(f"ensemble of {len(paths)}: acc {result['acc']:.4f} on {result['labelled']:,} labelled samples")
    elif out is None:
        print("no sample has a label: give --out to write the combined predictions", file=sys.stderr)
    print(json.dumps(result, sort_keys=True))
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return run_command(ensemble, MODULE, argv, Spellings(positional_list=True))


def console() -> None:
    """The `shards-ensemble` console script."""
    run_main(main)


if __name__ == "__main__":
    console()
