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

import sys
from pathlib import Path

from project.errors import UserError, run_main


def main(args: list[str] | None = None) -> int:
    # imported here: the workers' server runs this module too (project/data/workers.py, `preload`)
    from project.callbacks.predictions import PredictionWriter
    from project.checkpoint_cli import PredictCLI
    from project.data.files import PACKED_KEY, unpack_key

    cli = PredictCLI(args=args)
    config, data, model = cli.config, cli.datamodule, cli.model
    if not callable(getattr(model, "features", None)):
        raise UserError(f"{type(model).__name__} cannot predict: it has no features(batch) and head")
    index = data.index("predict")  # resolved (a plain folder packed) before the trainer starts
    names = list(getattr(model.hparams, "class_names", None) or [str(i) for i in range(model.hparams.num_classes)])
    ckpt = Path(config.ckpt_path)
    writer = PredictionWriter(
        Path(config.out),
        names,
        top_k=config.top_k,
        embeddings=config.embeddings,
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
