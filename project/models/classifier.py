"""ImageClassifier: normalizes uint8 batches on the device, runs a backbone, logs torchmetrics."""

from __future__ import annotations

import functools
import math
from typing import Literal

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import MeanMetric, SumMetric
from torchmetrics.classification import MulticlassAccuracy

from project.models.backbones import build_backbone

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class ImageClassifier(L.LightningModule):
    """An image classifier trained with cross-entropy and AdamW.

    Args:
        num_classes: number of classes (linked from the data's shard index; never set it by hand).
        class_names: names of the classes (linked from the data), kept in checkpoints for reports.
        backbone: network by name; see project/models/backbones.py.
        width: channel width of the small CNN's first stage.
        lr: peak learning rate.
        weight_decay: AdamW weight decay.
        schedule: learning-rate schedule over the whole run: onecycle (linear warmup to lr, then cosine
            decay to zero), cosine (cosine decay from lr, no warmup) or constant.
        warmup_fraction: share of the steps spent warming up (onecycle).
        label_smoothing: cross-entropy label smoothing.
        mean: per-channel mean of the images in [0, 1], subtracted on the device.
        std: per-channel standard deviation of the images in [0, 1].
    """

    def __init__(
        self,
        num_classes: int = 10,
        class_names: list[str] | None = None,
        backbone: str = "small_cnn",
        width: int = 32,
        lr: float = 3e-3,
        weight_decay: float = 0.05,
        schedule: Literal["onecycle", "cosine", "constant"] = "onecycle",
        warmup_fraction: float = 0.15,
        label_smoothing: float = 0.0,
        mean: tuple[float, float, float] = IMAGENET_MEAN,
        std: tuple[float, float, float] = IMAGENET_STD,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.backbone = build_backbone(backbone, num_classes, width)
        # uint8 images cross to the device; scaling and normalizing there is one fused, cheap op
        std_tensor, mean_tensor = torch.tensor(std).view(1, -1, 1, 1), torch.tensor(mean).view(1, -1, 1, 1)
        self.register_buffer("scale", 1 / (255 * std_tensor), persistent=False)
        self.register_buffer("shift", mean_tensor / std_tensor, persistent=False)
        self.metrics = nn.ModuleDict(
            {f"{stage}_acc": MulticlassAccuracy(num_classes, average="micro") for stage in ("train", "val", "test")}
        )
        self.mean_loss = nn.ModuleDict({f"{stage}_loss": MeanMetric() for stage in ("val", "test")})
        # samples the data stream could not read (see ShardDataModule.max_skipped_fraction)
        self.skipped = nn.ModuleDict({f"{stage}_skipped": SumMetric() for stage in ("train", "val", "test")})

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Logits for a batch of uint8 (or already scaled float) images, NCHW."""
        if images.dtype == torch.uint8:
            images = images.float() * self.scale - self.shift
        return self.backbone(images)

    def _step(self, batch: dict, stage: str) -> torch.Tensor:
        logits = self(batch["image"])
        labels = batch["label"]
        loss = F.cross_entropy(logits, labels, label_smoothing=self.hparams.label_smoothing)
        accuracy = self.metrics[f"{stage}_acc"]
        accuracy(logits, labels)
        size = len(labels)
        skipped = self.skipped[f"{stage}_skipped"]
        skipped.update(float(len(batch.get("skipped", ()))))
        self.log(f"{stage}/skipped", skipped, on_step=False, on_epoch=True, batch_size=size)
        if stage == "train":
            self.log("train/loss", loss, prog_bar=True, batch_size=size)
            self.log("train/acc", accuracy, on_step=False, on_epoch=True, batch_size=size)
        else:
            # metric objects sync across ranks once per epoch, weighted by samples: exact under DDP
            self.mean_loss[f"{stage}_loss"].update(loss, weight=size)
            self.log(f"{stage}/loss", self.mean_loss[f"{stage}_loss"], prog_bar=True, batch_size=size)
            self.log(f"{stage}/acc", accuracy, prog_bar=True, batch_size=size)
        return loss

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._step(batch, "val")

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._step(batch, "test")

    def configure_optimizers(self):  # noqa: ANN201
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
        if self.hparams.schedule == "constant":
            return optimizer
        # the total is this run's, read when the optimizer is (re)built: a resumed run that is longer, or
        # on another number of devices, continues along its own schedule instead of overrunning the old one
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup = self.hparams.warmup_fraction if self.hparams.schedule == "onecycle" else 0.0
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, functools.partial(lr_factor, total=total, warmup=warmup)
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def lr_factor(step: int, total: int, warmup: float) -> float:
    """Linear warmup over the first `warmup` fraction of `total` steps, then cosine decay to zero."""
    warmup_steps = int(total * warmup)
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total - warmup_steps))
    return 0.5 * (1 + math.cos(math.pi * progress))
