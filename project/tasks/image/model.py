"""ImageClassifier: normalizes uint8 batches on the device, runs a backbone's features and head, logs torchmetrics."""

from __future__ import annotations

from typing import Any, Literal

import torch
from torchvision.transforms import v2

from project.callbacks.media import log_image, media_loggers
from project.tasks.classifier import Classifier, decay_groups, lr_factor
from project.tasks.factories import LOADER, described
from project.tasks.image.backbones import BackboneClass, SmallCNN
from project.tasks.image.batch import ImageBatch
from project.tasks.image.pictures import batch_grid

__all__ = ["ImageClassifier", "lr_factor"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class ImageClassifier(Classifier):
    """An image classifier: a backbone (features and a linear head, `backbones.py`), trained with cross-entropy.

    Args:
        num_classes: number of classes (linked from the data's shard index; never set it by hand).
        class_names: names of the classes (linked from the data), kept in checkpoints for reports.
        image_size: input size (linked from the data), given to the backbone.
        backbone: the backbone's class and its own settings, as `class_path` and `init_args`:
            project.tasks.image.backbones.SmallCNN (width), TorchvisionBackbone (name, weights), TimmBackbone
            (name, weights), or your own `Backbone`. The classifier calls it with num_classes and image_size.
        backbone_lr_factor: the backbone's learning rate relative to the head's (discriminative rates).
            Freezing is a callback: project.callbacks.finetune.BackboneFreeze.
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
        *,
        num_classes: int = 10,
        class_names: list[str] | None = None,
        image_size: int = 224,
        backbone: BackboneClass = SmallCNN,
        backbone_lr_factor: float = 1.0,
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
        # what checkpoints and loggers keep: the backbone as a config names it (plain data, which a checkpoint's
        # weights-only load reads), rebuilt by load_from_checkpoint
        described_backbone = described(backbone, "model.backbone")
        for hyperparameters in (self.hparams, self._hparams_initial):
            hyperparameters.update(
                backbone=described_backbone, _instantiator=hyperparameters.get("_instantiator", LOADER)
            )
        built = backbone(num_classes=num_classes, image_size=image_size)
        self.backbone, self.head = built.features, built.head
        # uint8 images cross to the device; scaling and normalizing there is one fused, cheap op
        std_tensor, mean_tensor = torch.tensor(std).view(1, -1, 1, 1), torch.tensor(mean).view(1, -1, 1, 1)
        self.register_buffer("scale", 1 / (255 * std_tensor), persistent=False)
        self.register_buffer("shift", mean_tensor / std_tensor, persistent=False)
        self.setup_metrics(num_classes)
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

    def features(self, batch: ImageBatch) -> torch.Tensor:
        return self.backbone(self.normalize(batch.image))

    def configure_model(self) -> None:
        if self.hparams.channels_last:
            self.to(memory_format=torch.channels_last)
        if self.hparams.compile:
            self.backbone.compile()  # in place: state_dict keys stay those of the plain module

    # -- steps ---------------------------------------------------------------------------------------

    def inputs_and_targets(self, batch: ImageBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """What `forward` takes from a batch, and what its output is scored against (export, bench)."""
        return batch.image, batch.label

    def training_step(self, batch: ImageBatch, batch_idx: int) -> torch.Tensor:
        images, labels = self.normalize(batch.image), batch.label
        targets = labels
        with self.step_randomness():  # MixUp, CutMix and dropout: the same when a run resumes
            if self.mix is not None:
                images, targets = self.mix(images, labels)
            logits = self.head(self.backbone(images))
        return self.score("train", logits, labels, self.loss(logits, targets))

    def validation_step(self, batch: ImageBatch, batch_idx: int) -> None:
        self.score("val", self(batch.image), batch.label)

    def test_step(self, batch: ImageBatch, batch_idx: int) -> None:
        self.score("test", self(batch.image), batch.label)

    def on_train_batch_start(self, batch: ImageBatch, batch_idx: int) -> None:
        """The first training batch of a fit, as the model sees it, as an image grid for the loggers."""
        if not self._batch_logged and (loggers := media_loggers(self)):
            log_image(loggers, "train/first_batch", batch_grid(batch.image), self.global_step)
        self._batch_logged = True

    def parameter_groups(self) -> list[dict[str, Any]]:
        """Head and backbone, each split into decayed weights and undecayed norms, biases and embeddings."""
        parts = (("head", self.head, 1.0), ("backbone", self.backbone, self.hparams.backbone_lr_factor))
        groups = []
        for part, module, factor in parts:
            groups += decay_groups(part, module, self.hparams.lr * factor, self.hparams.weight_decay)
        return groups
