"""Preemption: on SIGTERM (spot VMs, Kubernetes, schedulers) save the current step to last.ckpt and stop.

Lightning notices the signal after the current batch (on every rank, under DDP) and raises
`SIGTERMException`; this callback saves the checkpoint there, so a restart with `--ckpt_path last`
continues exactly where the run stopped. On SLURM, Lightning's own SIGUSR1 auto-requeue does the same.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException


def last_checkpoint_path(trainer: L.Trainer) -> Path:
    """The `last` ModelCheckpoint's file, else <run folder>/checkpoints/last.ckpt."""
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.filename == "last" and callback.dirpath:
            return Path(callback.dirpath) / f"last{callback.FILE_EXTENSION}"
    return Path(trainer.log_dir or trainer.default_root_dir) / "checkpoints" / "last.ckpt"


class PreemptionCheckpoint(L.Callback):
    """Save checkpoints/last.ckpt at the current step when the run receives SIGTERM."""

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException) or trainer.sanity_checking or trainer.fast_dev_run:
            return
        path = last_checkpoint_path(trainer)
        trainer.save_checkpoint(path)  # every rank calls it; rank 0 writes
        rank_zero_info(f"SIGTERM: saved {path} at step {trainer.global_step}")
