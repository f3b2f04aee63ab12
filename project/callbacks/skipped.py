"""`<stage>/skipped` in the metrics: how many samples of each epoch the stream could not read or decode."""

from __future__ import annotations

from typing import Any

import lightning as L

from project.data.batch import Batch


class SkippedSamples(L.Callback):
    """Logs each stage's count of skipped samples per epoch (train/skipped, val/skipped, test/skipped),
    summed over batches and over ranks. The count is that of the batches the model saw, after any
    decoding on the device; the data module stops the run past `data.max_skipped_fraction`."""

    def _log(self, pl_module: L.LightningModule, stage: str, batch: Any) -> None:
        if isinstance(batch, Batch):
            pl_module.log(
                f"{stage}/skipped",
                float(len(batch.skipped)),
                on_step=False,
                on_epoch=True,
                reduce_fx="sum",
                sync_dist=True,
                batch_size=max(1, len(batch)),
            )

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._log(pl_module, "train", batch)

    def on_validation_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, *indexes: int
    ) -> None:
        # Lightning passes the batch's index and (with several loaders) the loader's index positionally
        if not trainer.sanity_checking:
            self._log(pl_module, "val", batch)

    def on_test_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, *indexes: int
    ) -> None:
        # Lightning passes the batch's index and (with several loaders) the loader's index positionally
        self._log(pl_module, "test", batch)
