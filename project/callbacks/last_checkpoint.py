"""checkpoints/last.ckpt, saved after the epoch's validation when a step save falls on an epoch's last batch.

Lightning's `ModelCheckpoint` with `every_n_train_steps` (configs/trainer/spot.yaml) saves in `on_train_batch_end`.
When that step is an epoch's last, validation runs after the save, and Lightning saves once per step, so the file
keeps the state from before validation: without what validation changes (the model's calibration temperature,
project/tasks/calibration.py; EarlyStopping's count). A run resumed from it never runs that validation again, so it
would end with other buffers than the uninterrupted run (`test_crashes.py` found it). Here such a save waits until
validation has ended, as a checkpoint without step saves does; Lightning defers the same way for a monitored metric.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint


def validation_follows(trainer: pl.Trainer) -> bool:
    """Whether the batch that just ended is its epoch's last, with a validation run after it."""
    if not getattr(trainer.fit_loop.epoch_loop.batch_progress, "is_last_batch", False):
        return False
    if not trainer.enable_validation:
        return False
    batches = trainer.num_val_batches
    if not (sum(batches) if isinstance(batches, list) else batches):
        return False
    every = trainer.check_val_every_n_epoch
    return every is None or (trainer.current_epoch + 1) % every == 0


class LastCheckpoint(ModelCheckpoint):
    """Lightning's `ModelCheckpoint` (every option as there), whose step-triggered save at an epoch's last batch
    is made after that epoch's validation."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._save_after_validation = False

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any, **kwargs: Any) -> None:
        steps = self._every_n_train_steps
        if steps >= 1 and trainer.global_step % steps == 0 and validation_follows(trainer):
            self._save_after_validation = True
            return
        super().on_train_batch_end(trainer, pl_module, *args, **kwargs)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if self._save_after_validation and not trainer.sanity_checking:
            self._save_after_validation = False
            if not self._should_skip_saving_checkpoint(trainer):
                candidates = self._monitor_candidates(trainer)
                self._save_topk_checkpoint(trainer, candidates)
                self._save_last_checkpoint(trainer, candidates)
