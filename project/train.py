"""Train, then test the best checkpoint (the last one when `callbacks.best_checkpoint` is null).

    python -m project.train [--config FILE]... [--section.key VALUE]... [--ckpt_path PATH]

configs/default.yaml is always loaded first; `--print_config` shows the resolved configuration and
`--help` documents every option.
"""

from __future__ import annotations

import sys
from pathlib import Path

from project.errors import UserError, run_main


def main(args: list[str] | None = None) -> None:
    # imported here: the workers' server runs this module too (project/data/workers.py, `preload`)
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from project.callbacks.dead_worker import dead_worker
    from project.callbacks.preemption import worker_died_message
    from project.callbacks.save_config import print_run_folder
    from project.cli import ProjectCLI

    cli = ProjectCLI(args=args)
    trainer, model, datamodule = cli.trainer, cli.model, cli.datamodule
    try:
        trainer.fit(model, datamodule=datamodule, ckpt_path=cli.config.ckpt_path)
        if trainer.interrupted:
            return
        best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
        # a resumed run keeps the best path of its first run, relative to where that one started
        trainer.test(model, datamodule=datamodule, ckpt_path=best if best and Path(best).is_file() else None)
    except SIGTERMException:
        # PreemptionCheckpoint has saved the step; 143 = 128 + SIGTERM, what a killed process reports
        print("stopped by SIGTERM: restart with --ckpt_path last to continue", file=sys.stderr)
        raise SystemExit(143) from None
    except RuntimeError as error:
        dead = dead_worker(error)
        if dead is None:
            raise
        # PreemptionCheckpoint has saved the last completed step (a single-process fit)
        raise UserError(worker_died_message(trainer, dead)) from None
    print_run_folder(trainer)


def console() -> None:
    """The `shards-train` console script."""
    run_main(main)


if __name__ == "__main__":
    console()
