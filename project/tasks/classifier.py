"""What every classification task's LightningModule shares: accuracy and loss metrics that are exact under
DDP, the test confusion matrix and per-class accuracy in TensorBoard, and the optimizer with its schedule.

A task's model subclasses `Classifier`, builds its network, and calls `self.score(stage, logits, labels)`
from its steps.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy, MulticlassCalibrationError, MulticlassConfusionMatrix

from project.callbacks.checkpoint_shape import check_state_names
from project.callbacks.checkpoint_stage import check_training_state
from project.callbacks.media import log_image, media_loggers
from project.errors import UserError
from project.shown import shown
from project.tasks.calibration import Temperature, upgrade_checkpoint
from project.tasks.confusion import CONFUSION_IMAGE_UP_TO, render_confusion_matrix
from project.tasks.loading import CheckedLoading
from project.tasks.weights import check_finite, same_kind

PER_CLASS_SCALARS_UP_TO = 100  # more classes than this: per-class accuracy only in the confusion matrix
STAGES = ("train", "val", "test")


@dataclass
class Prediction:
    """What `predict_step` returns for a batch: its keys, class probabilities, embeddings and known labels.

    Attributes:
        keys: the batch's sample keys, in row order.
        urls: the shard of each row.
        probs: float32 [B, C] softmax probabilities, of the logits divided by the val split's temperature
            (calibration.py).
        embeddings: float32 [B, F], the features the head maps to logits.
        labels: int64 [B], the samples' labels where they have one, else -1 (`labels.NO_LABEL`).
        log_probs: float32 [B, C], the log of `probs` computed from the logits (finite where a probability
            underflows), for adding several models' predictions (`python -m project.ensemble`).
    """

    keys: list[str]
    urls: list[str]
    probs: torch.Tensor
    embeddings: torch.Tensor
    labels: torch.Tensor | None
    log_probs: torch.Tensor | None = None


class Classifier(CheckedLoading, L.LightningModule):
    """The metrics, reports and optimization of a classifier. Its subclass's hyperparameters (saved with
    `save_hyperparameters`) must include num_classes, class_names, optimizer, lr, momentum, weight_decay,
    schedule, warmup_fraction and label_smoothing. It has a `head` that maps `features(batch)` to logits. Its
    `load_from_checkpoint` checks a stranger's checkpoint before Lightning rebuilds the model (loading.py). A subclass
    that overrides one of its hooks calls the hook of `super()`: train/acc is logged in `on_train_epoch_end`."""

    head: nn.Module

    def features(self, batch: Any) -> torch.Tensor:
        """The batch's feature vectors [B, F], before the head."""
        raise NotImplementedError(f"{type(self).__name__} must define features(batch)")

    def logits_and_features(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch's logits, and the feature vectors they come from (a subclass may add to the logits)."""
        features = self.features(batch)
        return self.head(features), features

    def predict_step(self, batch: Any, batch_idx: int) -> Prediction:
        """Probabilities and embeddings of a batch (`python -m project.predict`, active learning)."""
        logits, embeddings = self.logits_and_features(batch)
        probs, log_probs = self.calibration.probabilities(logits), self.calibration.log_probabilities(logits)
        labels = getattr(batch, "label", None)
        return Prediction(list(batch.keys), list(batch.urls), probs, embeddings.float(), labels, log_probs)

    def setup_metrics(self, num_classes: int) -> None:
        """Accuracy per stage, mean loss for val and test, the test confusion matrix and calibration error."""
        self.metrics = nn.ModuleDict(
            {f"{stage}_acc": MulticlassAccuracy(num_classes, average="micro") for stage in STAGES}
        )
        self.mean_loss = nn.ModuleDict({f"{stage}_loss": MeanMetric() for stage in ("val", "test")})
        self.confusion = MulticlassConfusionMatrix(num_classes)  # test only; synced across ranks
        self.calibration = Temperature()  # fitted on val: what predict's probabilities are divided by
        self.calibration_error = MulticlassCalibrationError(num_classes, n_bins=15, norm="l1")  # test only: ECE

    @contextlib.contextmanager
    def step_randomness(self) -> Iterator[None]:
        """The randomness of a training step (dropout, MixUp), drawn from (seed, batch, rank): a resumed run
        draws exactly what the uninterrupted one did, which the global generator's state would not give.
        The batch count (in the checkpoint's loop state) rather than the optimizer step: with gradient
        accumulation, each batch of a step draws its own."""
        batches = self.global_step
        if self._trainer is not None:
            batches = self.trainer.fit_loop.epoch_loop.batch_progress.total.ready
        seed = hash((int(os.environ.get("PL_GLOBAL_SEED", 0)), batches, self.global_rank)) % 2**63
        with torch.random.fork_rng(devices=[]):
            if self.device.type == "cpu":
                # torch.manual_seed also seeds CUDA's generators, lazily before CUDA starts: it formats the
                # whole call stack each time (1 ms a step under Lightning), for generators a CPU run never uses
                torch.default_generator.manual_seed(seed)
            else:
                torch.manual_seed(seed)
            yield

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.hparams.get("loss", "cross_entropy") == "squared_hinge":
            return squared_hinge(logits, targets)
        return F.cross_entropy(logits, targets, label_smoothing=self.hparams.label_smoothing)

    def score(self, stage: str, logits: torch.Tensor, labels: torch.Tensor, loss: torch.Tensor | None = None):
        """Log the stage's loss and accuracy (and count the test confusion matrix); returns the loss."""
        loss = self.loss(logits, labels) if loss is None else loss
        accuracy = self.metrics[f"{stage}_acc"]
        accuracy.update(logits, labels)  # logged per epoch: no batch value to compute (forward would)
        size = len(labels)
        if stage == "train":
            self.log("train/loss", loss, prog_bar=True, batch_size=size)
            return loss  # train/acc: logged once, at the epoch's end
        if stage == "test":
            self.confusion.update(logits, labels)
            self.calibration_error.update(self.calibration.probabilities(logits), labels)
            self.log("test/ece", self.calibration_error, batch_size=size)  # of the calibrated probabilities
        if stage == "val" and self._trainer is not None and not self._trainer.sanity_checking:
            self.calibration.update(logits, labels)
        # metric objects sync across ranks once per epoch, weighted by samples: exact under DDP
        self.mean_loss[f"{stage}_loss"].update(loss, weight=size)
        self.log(f"{stage}/loss", self.mean_loss[f"{stage}_loss"], prog_bar=True, batch_size=size)
        self.log(f"{stage}/acc", accuracy, prog_bar=True, batch_size=size)
        return loss

    def on_train_epoch_end(self) -> None:
        """The epoch's training accuracy, from every step's update (one log call an epoch rather than one a step,
        0.4 ms each on a CPU); Lightning computes it, synced over ranks, and resets it for the next epoch."""
        if (accuracy := self.metrics["train_acc"]).update_called:  # not after a resume into the epoch's end
            self.log("train/acc", accuracy, on_step=False, on_epoch=True)

    def on_validation_epoch_start(self) -> None:
        self.calibration.reset()

    def on_validation_epoch_end(self) -> None:
        """The temperature of this epoch's weights, from every rank's val samples (not the sanity check's)."""
        if self.trainer.sanity_checking:
            return
        temperature = self.calibration.fit(lambda sums: self.trainer.strategy.reduce(sums, reduce_op="sum"))
        if temperature is not None:
            self.log("val/temperature", temperature, rank_zero_only=True)

    def on_fit_start(self) -> None:
        check_training_state(self.trainer)  # a resumed fit's optimizer states fit this run's: one line, not torch's

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Refuse, in one line, a checkpoint whose tensors do not fit this model (a damaged or hostile file, or one
        of other settings): Lightning, evaluate, predict and export call this before loading the state dict, which
        would stop with torch's size-mismatch traceback. So is one whose weights hold NaN, which would load
        (project/tasks/weights.py)."""
        state, own = checkpoint.get("state_dict"), self.state_dict()
        if not isinstance(state, dict):
            return
        upgrade_checkpoint(state)  # a checkpoint from before calibration: T = 1
        known = {name: value for name, value in state.items() if name in own}
        for name, value in known.items():
            if isinstance(value, torch.Tensor) and value.shape != own[name].shape:
                raise UserError(
                    f"the checkpoint's {name} is {tuple(value.shape)} and this model's {tuple(own[name].shape)}: "
                    "it was trained with other settings, or the file is damaged"
                )
            if isinstance(value, torch.Tensor) and not same_kind(value, own[name]):
                raise UserError(
                    f"the checkpoint's {name} holds {value.dtype} values and this model's {own[name].dtype}: the "
                    "file is damaged"
                )
        if self.strict_loading:  # a tensor missing or extra: one line, where torch's strict load lists them all
            check_state_names(state, own)
        parameters = {name for name, _ in self.named_parameters()}
        check_finite(known.items(), parameters, "the checkpoint's ", "; use an earlier checkpoint")

    def on_test_epoch_end(self) -> None:
        """Per-class accuracy as scalars, and the confusion matrix as an image."""
        matrix = self.confusion.compute().cpu()  # identical on every rank
        self.confusion.reset()
        names = self.hparams.class_names or [str(i) for i in range(self.hparams.num_classes)]
        if self.hparams.num_classes <= PER_CLASS_SCALARS_UP_TO:
            per_class = matrix.diag() / matrix.sum(1).clamp(min=1)
            for name, value in zip(names, per_class.tolist(), strict=True):
                # a stranger's class name, in a metric name that Lightning's test table renders as rich markup:
                # shown, so `[/circle]` is no tag that stops the table and no escape code reaches the terminal
                self.log(f"test/acc_class/{shown(name, markup=True)}", value, sync_dist=False, rank_zero_only=True)
        loggers = media_loggers(self)
        if loggers and len(matrix) <= CONFUSION_IMAGE_UP_TO:
            log_image(loggers, "test/confusion_matrix", render_confusion_matrix(matrix, names), 0)

    # -- optimization --------------------------------------------------------------------------------

    def parameter_groups(self) -> list[dict[str, Any]]:
        """Decayed weights, and undecayed norms, biases and embeddings (a subclass may split further)."""
        return decay_groups("model", self, self.hparams.lr, self.hparams.weight_decay)

    def configure_optimizers(self):  # noqa: ANN201
        groups = self.parameter_groups()
        if (l2_c := self.hparams.get("l2_c")) is not None:
            # an L2 penalty ||w||^2 / (2 C N) on every parameter, as scikit-learn's C: coupled weight decay, which
            # Adam and SGD add to the gradient (AdamW's decoupled decay would not minimise the penalised loss)
            penalty = 1.0 / (l2_c * training_samples(self._trainer))
            groups = [{**group, "weight_decay": penalty} for group in groups]
        if self.hparams.optimizer == "sgd":
            optimizer = torch.optim.SGD(groups, lr=self.hparams.lr, momentum=self.hparams.momentum, nesterov=True)
        elif l2_c is not None:
            optimizer = torch.optim.Adam(groups, lr=self.hparams.lr, fused=fused_adam(groups, self._trainer))
        else:
            optimizer = torch.optim.AdamW(groups, lr=self.hparams.lr, fused=fused_adam(groups, self._trainer))
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


def squared_hinge(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """One-vs-rest squared hinge, summed over classes and averaged over the batch: the loss of scikit-learn's
    LinearSVC. Each class's score is pushed above 1 for its own samples and below -1 for the others."""
    signs = torch.full_like(logits, -1.0).scatter_(1, targets[:, None], 1.0)
    return (1 - signs * logits.float()).clamp(min=0).square().sum(1).mean()


def training_samples(trainer: Any) -> int:
    """The training split's samples (after data.fraction): N of an L2 penalty scaled as scikit-learn's C."""
    data = getattr(trainer, "datamodule", None)
    if data is None or not hasattr(data, "shards"):
        raise UserError("model.l2_c scales its penalty by the training split's size: fit with a ShardDataModule")
    return max(1, sum(shard.nsamples for shard in data.shards("train")))


NO_DECAY_NAMES = ("pos_embed", "class_token", "relative_position", "embedding", "embeddings")


def decay_groups(part: str, module: nn.Module, lr: float, weight_decay: float) -> list[dict[str, Any]]:
    """`module`'s parameters in two groups: decayed weights, and undecayed norms, biases and embeddings."""
    decay, no_decay = [], []
    for name, parameter in module.named_parameters():
        embedding = any(word in name for word in NO_DECAY_NAMES)
        (no_decay if parameter.ndim <= 1 or embedding else decay).append(parameter)
    # frozen parameters stay in their groups: they get no gradient, and so no update
    groups = [
        {"name": part, "params": decay, "lr": lr, "weight_decay": weight_decay},
        {"name": f"{part}_no_decay", "params": no_decay, "lr": lr, "weight_decay": 0.0},
    ]
    return [group for group in groups if group["params"]]


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


def fused_adam(groups: list[dict], trainer: Any) -> bool | None:
    """Whether AdamW can take its fused step: one kernel over all parameters, about 10x faster on a CPU for a
    large embedding table (benchmarks/README.md). Not under fp16's gradient scaler, which then could not unscale
    before clipping; not for parameters on another kind of device."""
    if trainer is not None and str(trainer.precision).startswith("16"):
        return None
    devices = {p.device.type for group in groups for p in group["params"]}
    floating = all(p.is_floating_point() for group in groups for p in group["params"])
    return True if floating and devices <= {"cpu", "cuda"} else None
