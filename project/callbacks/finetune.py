"""Freeze a pretrained backbone, and optionally unfreeze it at a given epoch: a callback in the config, beside the
model whose `backbone` it freezes (configs/model/linear_probe.yaml, mobilenet_v3_finetune.yaml):

    trainer:
      callbacks+:
        - class_path: project.callbacks.finetune.BackboneFreeze
          init_args: {unfreeze_at_epoch: 1, train_bn: true}
"""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import BackboneFinetuning
from torch.nn.modules.batchnorm import _BatchNorm
from torch.optim import Optimizer

from project.errors import UserError


class BackboneFreeze(BackboneFinetuning):
    """Lightning's BackboneFinetuning, with the backbone's parameter groups in the optimizer from the start.

    BackboneFinetuning adds the backbone as a new parameter group when it unfreezes it and then sets
    that group's learning rate once per epoch; our per-step schedule would not know that group, so here
    the model's optimizer already holds every group (the backbone's at `lr * backbone_lr_factor`: the
    discriminative learning rate) and unfreezing only turns the backbone's gradients back on.
    Freezing, the BatchNorm policy and checkpoint state are BackboneFinetuning's own. The model is any
    LightningModule with a `backbone` module (ImageClassifier's: the features before its head).

    Args:
        unfreeze_at_epoch: first epoch that trains the backbone; None keeps it frozen for the whole run.
        train_bn: keep training the backbone's BatchNorm layers (weights and running statistics) while it
            is frozen; False freezes them too, in evaluation mode.
    """

    def __init__(self, *, unfreeze_at_epoch: int | None = None, train_bn: bool = True) -> None:
        super().__init__(unfreeze_backbone_at_epoch=unfreeze_at_epoch or 0, train_bn=train_bn)
        self.unfreeze_at_epoch = unfreeze_at_epoch

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit" and self.unfreeze_at_epoch is not None and trainer.world_size > 1:
            # DDP reduces only the parameters that needed gradients when it wrapped the model
            raise UserError(
                "BackboneFreeze's unfreeze_at_epoch works on one device only: under DDP the backbone's gradients "
                "would never be synchronized after unfreezing. Train the frozen phase, then fine-tune in a second "
                "run with --model.backbone.weights <its checkpoint>, or use --model.backbone_lr_factor alone"
            )
        super().setup(trainer, pl_module, stage)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # BaseFinetuning would put back the parameter groups it stored at an epoch start, with that
        # moment's learning rates; ours never change, and the optimizer's restored state is exact
        self._restarting = False

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        if not self.train_bn and not all(p.requires_grad for p in pl_module.backbone.parameters()):
            # a frozen backbone normalizes with its own running statistics, as it will at evaluation
            for module in pl_module.backbone.modules():
                if isinstance(module, _BatchNorm):
                    module.eval()

    def freeze_before_training(self, pl_module: L.LightningModule) -> None:
        self.freeze(pl_module.backbone, train_bn=self.train_bn)

    def finetune_function(self, pl_module: L.LightningModule, epoch: int, optimizer: Optimizer) -> None:
        # `>=`: a run resumed past the unfreezing epoch starts frozen (setup) and must unfreeze again
        due = self.unfreeze_at_epoch is not None and epoch >= self.unfreeze_at_epoch
        if due and not all(p.requires_grad for p in pl_module.backbone.parameters()):
            self.make_trainable(pl_module.backbone)
