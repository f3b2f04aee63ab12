"""ImageClassifier: normalizes uint8 batches on the device, runs a backbone and a head, logs torchmetrics."""

from __future__ import annotations

import functools
import math
import os
from typing import Any, Literal

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from torch import nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix
from torchvision.transforms import v2

from project.tasks.image.backbones import build_backbone
from project.tasks.image.batch import ImageBatch
from project.tasks.image.report import CONFUSION_IMAGE_UP_TO, batch_grid, render_confusion_matrix

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
PER_CLASS_SCALARS_UP_TO = 100  # more classes than this: per-class accuracy only in the confusion matrix


class ImageClassifier(L.LightningModule):
    """An image classifier: a backbone (features) and a linear head, trained with cross-entropy.

    Args:
        num_classes: number of classes (linked from the data's shard index; never set it by hand).
        class_names: names of the classes (linked from the data), kept in checkpoints for reports.
        image_size: input size (linked from the data); vision transformers trained from scratch use it.
        backbone: "small_cnn" or any torchvision classification model: resnet18, resnet50,
            mobilenet_v3_small, mobilenet_v3_large, efficientnet_b0, convnext_tiny, vit_b_16, ...
        weights: pretrained weights: a torchvision weight name ("DEFAULT", "IMAGENET1K_V1"), downloaded
            once into torch's hub cache, or the path of a local weights file; None trains from scratch.
        width: channel width of the small CNN's first stage.
        freeze_backbone: train only the head (the backbone's BatchNorm layers follow train_bn).
        unfreeze_at_epoch: freeze the backbone until this epoch, then train it too (one device only).
        backbone_lr_factor: the backbone's learning rate relative to the head's (discriminative rates).
        train_bn: keep training BatchNorm layers of a frozen backbone.
        optimizer: adamw, or sgd with Nesterov momentum.
        lr: peak learning rate (of the head).
        momentum: SGD momentum.
        weight_decay: weight decay of weights; norms, biases and embeddings get none.
        schedule: learning-rate schedule over the whole run, after `warmup_fraction` of linear warmup:
            cosine (decay to zero), onecycle (OneCycleLR's shape: cosine rise from lr/25, cosine decay to
            lr/1e4) or constant.
        warmup_fraction: share of the steps spent warming up.
        label_smoothing: cross-entropy label smoothing.
        mixup_alpha: MixUp's Beta(alpha, alpha) mixing; 0 turns it off.
        cutmix_alpha: CutMix's Beta(alpha, alpha) box size; 0 turns it off. With both on, each batch
            uses one of them at random.
        channels_last: NHWC memory layout: faster convolutions on tensor cores with mixed precision.
        compile: torch.compile the backbone (slower start, faster steps on GPUs).
        mean: per-channel mean of the images in [0, 1], subtracted on the device.
        std: per-channel standard deviation of the images in [0, 1].
    """

    def __init__(
        self,
        num_classes: int = 10,
        class_names: list[str] | None = None,
        image_size: int = 224,
        backbone: str = "small_cnn",
        weights: str | None = None,
        width: int = 32,
        freeze_backbone: bool = False,
        unfreeze_at_epoch: int | None = None,
        backbone_lr_factor: float = 1.0,
        train_bn: bool = True,
        optimizer: Literal["adamw", "sgd"] = "adamw",
        lr: float = 3e-3,
        momentum: float = 0.9,
        weight_decay: float = 0.05,
        schedule: Literal["cosine", "onecycle", "constant"] = "cosine",
        warmup_fraction: float = 0.15,
        label_smoothing: float = 0.0,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
        channels_last: bool = False,
        compile: bool = False,
        mean: tuple[float, float, float] = IMAGENET_MEAN,
        std: tuple[float, float, float] = IMAGENET_STD,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.backbone, self.head = build_backbone(backbone, num_classes, width, weights, image_size)
        # uint8 images cross to the device; scaling and normalizing there is one fused, cheap op
        std_tensor, mean_tensor = torch.tensor(std).view(1, -1, 1, 1), torch.tensor(mean).view(1, -1, 1, 1)
        self.register_buffer("scale", 1 / (255 * std_tensor), persistent=False)
        self.register_buffer("shift", mean_tensor / std_tensor, persistent=False)
        self.metrics = nn.ModuleDict(
            {f"{stage}_acc": MulticlassAccuracy(num_classes, average="micro") for stage in ("train", "val", "test")}
        )
        self.mean_loss = nn.ModuleDict({f"{stage}_loss": MeanMetric() for stage in ("val", "test")})
        self.confusion = MulticlassConfusionMatrix(num_classes)  # test only; synced across ranks
        mixes = [v2.MixUp(alpha=mixup_alpha, num_classes=num_classes)] if mixup_alpha > 0 else []
        mixes += [v2.CutMix(alpha=cutmix_alpha, num_classes=num_classes)] if cutmix_alpha > 0 else []
        self.mix = v2.RandomChoice(mixes) if mixes else None
        self.example_input_array = torch.zeros(2, 3, image_size, image_size, dtype=torch.uint8)
        self._batch_logged = False

    # -- forward -------------------------------------------------------------------------------------

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """Float, normalized images from uint8 ones (float images are taken as already normalized)."""
        if images.shape[1] == 1:  # grey images: the backbones (and pretrained weights) expect RGB
            images = images.expand(-1, 3, -1, -1)
        if images.dtype == torch.uint8:
            images = images.float() * self.scale - self.shift
        if self.hparams.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return images

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Logits for a batch of uint8 (or already normalized float) images, NCHW."""
        return self.head(self.backbone(self.normalize(images)))

    def configure_model(self) -> None:
        if self.hparams.channels_last:
            self.to(memory_format=torch.channels_last)
        if self.hparams.compile:
            self.backbone.compile()  # in place: state_dict keys stay those of the plain module

    def configure_callbacks(self) -> list[Callback]:
        if self.hparams.freeze_backbone or self.hparams.unfreeze_at_epoch is not None:
            from project.callbacks.finetune import BackboneFreeze

            return [BackboneFreeze(self.hparams.unfreeze_at_epoch, train_bn=self.hparams.train_bn)]
        return []

    # -- steps ---------------------------------------------------------------------------------------

    def inputs_and_targets(self, batch: ImageBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """What `forward` takes from a batch, and what its output is scored against (export, bench)."""
        return batch.image, batch.label

    def training_step(self, batch: ImageBatch, batch_idx: int) -> torch.Tensor:
        images, labels = self.normalize(batch.image), batch.label
        targets = labels
        if self.mix is not None:
            # seeded by step and rank, so that a resumed run mixes exactly as the uninterrupted one
            seed = hash((int(os.environ.get("PL_GLOBAL_SEED", 0)), self.global_step, self.global_rank))
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed % 2**63)
                images, targets = self.mix(images, labels)
        logits = self.head(self.backbone(images))
        loss = F.cross_entropy(logits, targets, label_smoothing=self.hparams.label_smoothing)
        self._log_stage("train", logits, labels, loss)
        return loss

    def validation_step(self, batch: ImageBatch, batch_idx: int) -> None:
        logits = self(batch.image)
        loss = F.cross_entropy(logits, batch.label, label_smoothing=self.hparams.label_smoothing)
        self._log_stage("val", logits, batch.label, loss)

    def test_step(self, batch: ImageBatch, batch_idx: int) -> None:
        logits = self(batch.image)
        loss = F.cross_entropy(logits, batch.label, label_smoothing=self.hparams.label_smoothing)
        self.confusion.update(logits, batch.label)
        self._log_stage("test", logits, batch.label, loss)

    def _log_stage(self, stage: str, logits: torch.Tensor, labels: torch.Tensor, loss: torch.Tensor) -> None:
        accuracy = self.metrics[f"{stage}_acc"]
        accuracy(logits, labels)
        size = len(labels)
        if stage == "train":
            self.log("train/loss", loss, prog_bar=True, batch_size=size)
            self.log("train/acc", accuracy, on_step=False, on_epoch=True, batch_size=size)
        else:
            # metric objects sync across ranks once per epoch, weighted by samples: exact under DDP
            self.mean_loss[f"{stage}_loss"].update(loss, weight=size)
            self.log(f"{stage}/loss", self.mean_loss[f"{stage}_loss"], prog_bar=True, batch_size=size)
            self.log(f"{stage}/acc", accuracy, prog_bar=True, batch_size=size)

    def on_train_batch_start(self, batch: ImageBatch, batch_idx: int) -> None:
        """The first training batch of a fit, as the model sees it, as an image grid in TensorBoard."""
        if not self._batch_logged and (logger := self._tensorboard()) is not None:
            logger.experiment.add_image("train/first_batch", batch_grid(batch.image), self.global_step)
        self._batch_logged = True

    def on_test_epoch_end(self) -> None:
        matrix = self.confusion.compute().cpu()  # identical on every rank
        self.confusion.reset()
        names = self.hparams.class_names or [str(i) for i in range(self.hparams.num_classes)]
        if self.hparams.num_classes <= PER_CLASS_SCALARS_UP_TO:
            per_class = matrix.diag() / matrix.sum(1).clamp(min=1)
            for name, value in zip(names, per_class.tolist(), strict=True):
                self.log(f"test/acc_class/{name}", value, sync_dist=False, rank_zero_only=True)
        logger = self._tensorboard()
        if logger is not None and len(matrix) <= CONFUSION_IMAGE_UP_TO:
            logger.experiment.add_image("test/confusion_matrix", render_confusion_matrix(matrix, names), 0)
            logger.experiment.flush()

    def _tensorboard(self) -> TensorBoardLogger | None:
        """The run's TensorBoard logger, on global rank zero only (images are written once)."""
        if self._trainer is None or not self.trainer.is_global_zero:
            return None
        return next((logger for logger in self.loggers if isinstance(logger, TensorBoardLogger)), None)

    # -- optimization --------------------------------------------------------------------------------

    def parameter_groups(self) -> list[dict[str, Any]]:
        """Head and backbone, each split into decayed weights and undecayed norms, biases and embeddings."""
        groups = []
        parts = (("head", self.head, 1.0), ("backbone", self.backbone, self.hparams.backbone_lr_factor))
        for part, module, factor in parts:
            decay, no_decay = [], []
            for name, parameter in module.named_parameters():
                embedding = any(part in name for part in ("pos_embed", "class_token", "relative_position"))
                (no_decay if parameter.ndim <= 1 or embedding else decay).append(parameter)
            lr = self.hparams.lr * factor
            groups += [
                {"name": part, "params": decay, "lr": lr, "weight_decay": self.hparams.weight_decay},
                {"name": f"{part}_no_decay", "params": no_decay, "lr": lr, "weight_decay": 0.0},
            ]
        # frozen parameters stay in their groups: they get no gradient, and so no update
        return [group for group in groups if group["params"]]

    def configure_optimizers(self):  # noqa: ANN201
        groups = self.parameter_groups()
        if self.hparams.optimizer == "sgd":
            optimizer = torch.optim.SGD(groups, lr=self.hparams.lr, momentum=self.hparams.momentum, nesterov=True)
        else:
            optimizer = torch.optim.AdamW(groups, lr=self.hparams.lr)
        if self.hparams.schedule == "constant" and self.hparams.warmup_fraction == 0:
            return optimizer
        # the total is this run's, read when the optimizer is (re)built: a resumed run that is longer, or
        # on another number of devices, continues along its own schedule instead of overrunning the old one
        total = max(1, int(self.trainer.estimated_stepping_batches))
        factor = functools.partial(
            lr_factor, total=total, warmup=self.hparams.warmup_fraction, shape=self.hparams.schedule
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def lr_factor(step: int, total: int, warmup: float, shape: str = "cosine") -> float:
    """The learning rate at `step` of `total`, as a fraction of the peak.

    cosine: linear warmup over the first `warmup` fraction, then cosine decay to zero.
    onecycle: cosine rise from 1/25 over the warmup, then cosine decay to 1/1e4 (OneCycleLR's shape).
    constant: linear warmup, then flat.
    """
    warmup_steps = int(total * warmup)
    if step < warmup_steps:
        if shape == "onecycle":
            start = 1 / 25
            return start + (1 - start) * 0.5 * (1 - math.cos(math.pi * (step + 1) / warmup_steps))
        return (step + 1) / warmup_steps
    if shape == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total - warmup_steps))
    end = 1e-4 if shape == "onecycle" else 0.0
    return end + (1 - end) * 0.5 * (1 + math.cos(math.pi * progress))
