"""Predict with one checkpoint on data with or without labels, streaming rows to a JSONL or Parquet file.

    python -m project.predict --ckpt_path PATH --data.predict SPEC --out FILE [--top_k K] [--embeddings true]
        [--log_probs true] [--config FILE]... [--section.key V]...

SPEC is anything a split takes (a folder of shards, a shard index, a glob, a brace pattern, a URL, a list),
or a plain folder of the files the task reads (images; .txt files for the text task). Each sample is read
exactly once over every rank and worker (the evaluation plan), and each row holds its key (a plain folder's
file path), the predicted class and its probability, the top-k classes with theirs, the label when the
sample has one, with `--embeddings true` the features before the head, and with `--log_probs true` every
class's calibrated log-probability (what `python -m project.ensemble` adds up). Rows reach the disk as they are
made; under DDP each rank writes its part and rank 0 merges them at the end. A killed run, started again
with the same command, continues where each rank stopped. The run's own config.yaml (next to its
checkpoints/ folder) rebuilds its model, read as data, as for `project.evaluate`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from project.callbacks.predictions import check_output
from project.data.workers import start_forkserver_for
from project.errors import UserError, run_main
from project.evaluate import check_checkpoint_given, early_arguments
from project.tasks import WORKER_MODULES


def checkpoint_classes(path: str) -> list[str] | None:
    """The class names a checkpoint's model was trained with (its hyperparameters), if it records them."""
    from project.callbacks.checkpoint_io import load_checkpoint_file

    checkpoint = load_checkpoint_file(path)  # weights only: a file that would run code is refused here
    hyperparameters = checkpoint.get("hyper_parameters") if isinstance(checkpoint, dict) else None
    names = (hyperparameters if isinstance(hyperparameters, dict) else {}).get("class_names")
    return [str(name) for name in names] if isinstance(names, list | tuple) and names else None


def main(args: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if args is None else args)
    known = early_arguments(args, "--out", "--data.predict", "--data.classes")
    if not (known.help or known.print_config):
        check_checkpoint_given(known, "predict with")
        if known.out is None:
            raise UserError("--out is required: the .jsonl or .parquet file to write")
        if known.predict is None:
            raise UserError("--data.predict is required: the shards or folder of files to predict on")
        check_output(Path(known.out))
        classes = checkpoint_classes(known.ckpt_path) if known.classes is None else None
        if classes:  # the model's own classes: the training data need not be there any more
            args = [f"--data.classes={json.dumps(classes)}", *args]
        start_forkserver_for(args, WORKER_MODULES)  # before the imports below, beside them
    # imported here: the workers' server runs this module too (project/data/workers.py, `preload`)
    from project.callbacks.predictions import PredictionWriter
    from project.cli import PredictCLI
    from project.data.files import PACKED_KEY, unpack_key

    cli = PredictCLI(args=args, from_checkpoint=known.ckpt_path or True)
    config, data, model = cli.config, cli.datamodule, cli.model
    if not callable(getattr(model, "features", None)):
        raise UserError(f"{type(model).__name__} cannot predict: it has no features(batch) and head")
    if config.top_k < 1:
        raise UserError(f"--top_k must be at least 1, got {config.top_k}")
    index = data.index("predict")  # resolved (a plain folder packed) before the trainer starts
    names = list(getattr(model.hparams, "class_names", None) or [str(i) for i in range(model.hparams.num_classes)])
    ckpt = Path(config.ckpt_path)
    writer = PredictionWriter(
        Path(config.out),
        names,
        config.top_k,
        config.embeddings,
        key_name=unpack_key if PACKED_KEY in index.extra else str,
        identity=f"{ckpt.resolve()}:{ckpt.stat().st_size}:{ckpt.stat().st_mtime_ns}",
        log_probs=config.log_probs,
    )
    cli.trainer.callbacks.append(writer)
    cli.trainer.predict(model, datamodule=data, ckpt_path=str(ckpt), return_predictions=False)
    rows = writer.merged_rows
    if rows is not None:
        left_out = f" ({index.nsamples - rows} unreadable samples left out)" if rows < index.nsamples else ""
        print(f"wrote {rows} rows to {config.out}{left_out}", file=sys.stderr)
    return rows or 0


def console() -> None:
    """The `shards-predict` console script."""
    run_main(main)


if __name__ == "__main__":
    console()
