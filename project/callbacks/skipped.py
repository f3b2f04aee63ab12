"""`<stage>/skipped` in the metrics: how many samples of each epoch the stream could not read or decode."""

from __future__ import annotations

from typing import Any

import lightning as L

from project.data.batch import Batch


class SkippedSamples(L.Callback):
    """Logs each stage's count of skipped samples per epoch (train/skipped, val/skipped, test/skipped),
    summed over batches and over ranks. The count is that of the batches the model saw, after any
    decoding on the device; the data module stops the run past `data.max_skipped_fraction`.

    Each batch adds to a plain count, logged once at the epoch's end (a log call a step cost 0.4 ms on a CPU).
    As with any epoch metric of Lightning's, a run resumed within an epoch counts that epoch from its resumption."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}  # stage: samples skipped so far this epoch, on this rank

    def _count(self, stage: str, batch: Any) -> None:
        if isinstance(batch, Batch):
            self._counts[stage] = self._counts.get(stage, 0) + len(batch.skipped)

    def _log(self, pl_module: L.LightningModule, stage: str) -> None:
        if (count := self._counts.pop(stage, None)) is not None:
            pl_module.log(
                f"{stage}/skipped", float(count), on_step=False, on_epoch=True, sync_dist=True, reduce_fx="sum"
            )

    def _start(self, stage: str) -> None:
        self._counts.pop(stage, None)  # what an interrupted epoch counted

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start("train")

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._count("train", batch)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log(pl_module, "train")

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start("val")

    def on_validation_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, *indexes: int
    ) -> None:
        # Lightning passes the batch's index and (with several loaders) the loader's index positionally
        if not trainer.sanity_checking:
            self._count("val", batch)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._log(pl_module, "val")

    def on_test_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start("test")

    def on_test_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, *indexes: int
    ) -> None:
        self._count("test", batch)

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log(pl_module, "test")
