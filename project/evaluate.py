"""Evaluate one checkpoint on one split.

    python -m project.evaluate --ckpt_path PATH [--split val|test] [--config FILE]... [--section.key V]...

The model is rebuilt from the run's own config.yaml (next to its checkpoints/ folder), read as data after
configs/default.yaml (project/run_folder.py): its model and what its samples become, never where its data is:
the split comes from your configs and flags (--data.root DIR or --data.test SPEC). The metrics are printed
as a table, then as one JSON object on the last line, for scripts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from project.data.workers import start_forkserver_for
from project.errors import UserError, run_main
from project.tasks import WORKER_MODULES


def early_arguments(args: list[str], *options: str) -> argparse.Namespace:
    """What is read before the full parse (the checkpoint decides which run config to load): --ckpt_path,
    -h, --print_config, and `options` (names such as "--out"; "--data.predict" is read as `predict`)."""
    early = argparse.ArgumentParser(add_help=False, allow_abbrev=False)  # as the full parse: no abbreviations
    early.add_argument("--ckpt_path")
    early.add_argument("-h", "--help", action="store_true")
    early.add_argument("--print_config", nargs="?", const=True)
    for option in options:
        early.add_argument(option, dest=option.lstrip("-").rpartition(".")[2])
    return early.parse_known_args(args)[0]


def check_checkpoint_given(known: argparse.Namespace, purpose: str) -> None:
    """--ckpt_path is given and, when local, exists (`purpose`: "evaluate", "predict with")."""
    from project.callbacks.checkpoint_io import is_local

    if known.ckpt_path is None:
        raise UserError(f"--ckpt_path is required: the checkpoint to {purpose}")
    if is_local(known.ckpt_path) and not Path(known.ckpt_path).is_file():
        raise UserError(f"checkpoint not found: {known.ckpt_path}")


def main(args: list[str] | None = None) -> dict[str, float]:
    args = list(sys.argv[1:] if args is None else args)
    known = early_arguments(args)
    if not (known.help or known.print_config):
        check_checkpoint_given(known, "evaluate")
        start_forkserver_for(args, WORKER_MODULES)  # before the imports below, beside them
    # imported here: the workers' server runs this module too (project/data/workers.py, `preload`)
    from project.cli import EvaluateCLI

    cli = EvaluateCLI(args=args, from_checkpoint=known.ckpt_path or True)
    run = cli.trainer.validate if cli.config.split == "val" else cli.trainer.test
    results = run(cli.model, datamodule=cli.datamodule, ckpt_path=cli.config.ckpt_path)
    metrics = {key: float(value) for result in results for key, value in result.items()}
    if cli.trainer.is_global_zero:
        print(json.dumps(metrics, sort_keys=True))
    return metrics


def console() -> None:
    """The `shards-evaluate` console script."""
    run_main(main)


if __name__ == "__main__":
    console()
