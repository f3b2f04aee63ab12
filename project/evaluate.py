"""Evaluate one checkpoint on one split.

    python -m project.evaluate --ckpt_path PATH [--split val|test] [--config FILE]... [--section.key V]...

The model is rebuilt from the run's own config.yaml (next to its checkpoints/ folder), read as data after
configs/default.yaml (project/run_folder.py): its model and what its samples become, never where its data is:
the split comes from your configs and flags (--data.root DIR or --data.test SPEC). `--ckpt_path` may stand in a
--config file too; a flag of the checkpoint's task's own settings (`--data.max_tokens` for a text model) needs that
task named when your configuration's is another (`--data TextShards`, or the task's config). The metrics are
printed as a table, then as one JSON object on the last line, for scripts.
"""

from __future__ import annotations

import json

from project.errors import run_main


def main(args: list[str] | None = None) -> dict[str, float]:
    # imported here: the workers' server runs this module too (project/data/workers.py, `preload`)
    from project.checkpoint_cli import EvaluateCLI

    cli = EvaluateCLI(args=args)
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
