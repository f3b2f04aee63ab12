"""Preemption and dead workers: save the current step to last.ckpt and stop.

On SIGTERM (spot VMs, Kubernetes, schedulers) Lightning notices the signal after the current batch (on every
rank, under DDP) and raises `SIGTERMException`; this callback saves the checkpoint there, so a restart with
`--ckpt_path last` continues exactly where the run stopped. On SLURM, Lightning's own SIGUSR1 auto-requeue
does the same.

A DataLoader worker that dies (most often the out-of-memory killer's SIGKILL) makes the fetch of the next
batch raise, before that batch reaches the model: every finished step is in the loops' progress and the data
module's position, so the checkpoint saved then holds the last completed step, and resuming trains the
batch that could not be fetched. The callback also makes the loaders notice a dead worker within a second
(`dead_worker.poll_workers_often`). The entry point turns the error into one line (`worker_died_message`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from project.callbacks.dead_worker import DeadWorker, dead_worker, poll_workers_often


def last_checkpoint_path(trainer: L.Trainer) -> Path:
    """The `last` ModelCheckpoint's file, else <run folder>/checkpoints/last.ckpt."""
    return configured_last(trainer) or Path(trainer.log_dir or trainer.default_root_dir) / "checkpoints" / "last.ckpt"


def configured_last(trainer: L.Trainer) -> Path | None:
    """The `last` ModelCheckpoint's file, if there is one (without `trainer.log_dir`, a collective call)."""
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.filename == "last" and callback.dirpath:
            return Path(callback.dirpath) / f"last{callback.FILE_EXTENSION}"
    return None


class PreemptionCheckpoint(L.Callback):
    """Save checkpoints/last.ckpt at the current step when the run receives SIGTERM, or when a DataLoader
    worker of a single-process fit dies. `saved` is (path, step) once it has saved."""

    def __init__(self) -> None:
        self.saved: tuple[Path, int] | None = None

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        # only a fit has a step to save: a test after it holds the best checkpoint's weights, not the last
        if trainer.state.fn != TrainerFn.FITTING or trainer.sanity_checking or trainer.fast_dev_run:
            return
        if isinstance(exception, SIGTERMException):
            self._save(trainer)  # every rank calls it; rank 0 writes
            rank_zero_info(f"SIGTERM: saved {self.saved[0]} at step {self.saved[1]}")
        elif trainer.world_size == 1 and dead_worker(exception) and not _step_in_flight(trainer):
            # under DDP the other ranks wait in a collective for this one: saving (a barrier) would hang
            self._save(trainer)

    def _save(self, trainer: L.Trainer) -> None:
        path = last_checkpoint_path(trainer)
        trainer.save_checkpoint(path)
        self.saved = (path, trainer.global_step)

    def _poll_often(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        poll_workers_often(trainer)

    # a dead worker noticed within a second, in every stage that reads batches (an epoch's loader exists at
    # its start, except the training one after the first epoch: that one from its first batch on)
    on_train_epoch_start = on_train_batch_start = _poll_often
    on_validation_epoch_start = on_validation_batch_start = _poll_often
    on_test_epoch_start = on_test_batch_start = _poll_often
    on_predict_epoch_start = on_predict_batch_start = _poll_often


def _step_in_flight(trainer: L.Trainer) -> bool:
    """Whether a training step had begun and not finished. Our workers' deaths are found while fetching,
    between steps; a worker forked by the trainer (`data.worker_start fork`) is found by torch's SIGCHLD
    handler, which raises wherever the trainer is, maybe amid an optimizer step: nothing is saved then."""
    progress = trainer.fit_loop.epoch_loop.batch_progress.current
    return progress.ready != progress.completed


def worker_died_message(trainer: L.Trainer, dead: DeadWorker) -> str:
    """One line: which worker died, what usually kills workers, and what `--ckpt_path last` resumes from."""
    saved = next((c.saved for c in trainer.callbacks if isinstance(c, PreemptionCheckpoint) and c.saved), None)
    last = configured_last(trainer)  # not trainer.log_dir: under DDP the other ranks wait in another collective
    if saved is not None:
        then = f"saved {saved[0]} at step {saved[1]}: --ckpt_path last continues the run from there"
    elif last is not None and last.is_file():
        then = f"--ckpt_path last continues the run from the last checkpoint saved, {last}"
    else:
        then = "no checkpoint was saved: run it again"
    return (
        f"a data-loading worker died ({dead.describe()}); what usually kills workers is memory (the "
        "out-of-memory killer): lower data.shuffle_buffer or data.num_workers; " + then
    )
