"""Training-time pruning: Lightning's ModelPruning, configurable from YAML (configs/callbacks/prune.yaml), with
checkpoints that hold the weights their validation metric was measured on."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch import callbacks


class ModelPruning(callbacks.ModelPruning):
    """Lightning's ModelPruning, with two changes.

    - `pruning_fn` is typed as a name only. Lightning types it `Callable | str`: jsonargparse then reads
      "l1_unstructured" but cannot write it back into the run's config.yaml (which evaluate and export
      read), and it would instantiate a class path such as torch.nn.utils.prune.L1Unstructured.
    - Pruning happens at the start of each epoch after the first, not at the end of each epoch. At the
      end, it runs after validation but before ModelCheckpoint saves, so best.ckpt would hold weights
      pruned once more than those that scored its val/acc, and the last pruning would never be trained.

    Masks are not saved in checkpoints (they hold plain weights with zeros), so a resumed run continues
    from the pruned weights but lets pruned weights grow back until the next pruning.

    Args:
        pruning_fn: a torch.nn.utils.prune function by name: l1_unstructured, random_unstructured,
            ln_structured or random_structured.
        **kwargs: ModelPruning's other arguments (amount, parameter_names, use_global_unstructured,
            use_lottery_ticket_hypothesis, make_pruning_permanent, verbose, ...).
    """

    def __init__(self, *, pruning_fn: str = "l1_unstructured", **kwargs: Any) -> None:
        super().__init__(pruning_fn, **kwargs)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch > 0:
            self._run_pruning(trainer.current_epoch - 1)  # what Lightning would have run at the previous end

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pass  # moved to the next epoch's start

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pass  # (with prune_on_train_epoch_end=false Lightning prunes here, before the checkpoint too)
