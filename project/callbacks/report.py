"""What TensorBoard shows beyond the scalars: hyperparameters next to final metrics, the first training
batch as the model sees it, and the test confusion matrix."""

from __future__ import annotations

from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from PIL import Image, ImageDraw, ImageFont
from torchvision.utils import make_grid

# metrics shown in TensorBoard's HPARAMS tab: scalars logged under these tags (last value per run)
HPARAM_METRICS = ("hp/best_val_acc", "val/acc", "val/loss", "test/acc", "test/loss")
CONFUSION_IMAGE_UP_TO = 60  # classes; a larger matrix is unreadable as an image
GRID_IMAGES = 64


def _tensorboard(trainer: L.Trainer) -> TensorBoardLogger | None:
    if not trainer.is_global_zero:
        return None
    return next((lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)), None)


def flat_hparams(trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
    """Model and data hyperparameters as TensorBoard's HPARAMS tab takes them: scalars and strings."""
    flat: dict[str, Any] = {}
    sources = [("model", pl_module.hparams)]
    if trainer.datamodule is not None:
        sources.append(("data", trainer.datamodule.hparams))
    for prefix, hparams in sources:
        for key, value in hparams.items():
            if key in ("class_names", "classes"):
                continue
            if value is None or isinstance(value, (list, tuple, dict)):
                value = str(value)
            flat[f"{prefix}.{key}"] = value
    flat.update(
        {
            "trainer.precision": str(trainer.precision),
            "trainer.max_epochs": trainer.max_epochs if trainer.max_epochs is not None else -1,
            "trainer.world_size": trainer.world_size,
        }
    )
    return flat


class TensorBoardReport(Callback):
    """Hyperparameters with their final metrics, the first augmented training batch, and at test end a
    confusion-matrix image (per-class accuracies are scalars logged by the model).

    Args:
        log_batch: log the first training batch of each fit as an image grid.
    """

    def __init__(self, log_batch: bool = True) -> None:
        self.log_batch = log_batch
        self._batch_logged = False

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        logger = _tensorboard(trainer)
        if logger is None:
            return
        from torch.utils.tensorboard.summary import hparams

        # the HPARAMS tab reads each metric as the last value of the scalar with that tag
        experiment, start, end = hparams(flat_hparams(trainer, pl_module), dict.fromkeys(HPARAM_METRICS, 0.0))
        writer = logger.experiment._get_file_writer()
        for summary in (experiment, start, end):
            writer.add_summary(summary)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._batch_logged or not self.log_batch:
            return
        self._batch_logged = True
        logger = _tensorboard(trainer)
        if logger is None or not isinstance(batch, dict) or "image" not in batch:
            return
        images = batch["image"][:GRID_IMAGES].detach().cpu()
        if images.dtype != torch.uint8:  # float batches are normalized: stretch each to [0, 1] to show it
            images = images.float()
            low = images.amin(dim=(1, 2, 3), keepdim=True)
            high = images.amax(dim=(1, 2, 3), keepdim=True)
            images = (images - low) / (high - low).clamp(min=1e-6)
        grid = make_grid(images, nrow=8, padding=2)
        logger.experiment.add_image("train/first_batch", grid, trainer.global_step)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        logger = _tensorboard(trainer)
        best = trainer.checkpoint_callback.best_model_score if trainer.checkpoint_callback else None
        if logger is not None and best is not None:
            logger.experiment.add_scalar("hp/best_val_acc", float(best), trainer.global_step)

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        logger = _tensorboard(trainer)
        matrix = getattr(pl_module, "test_confusion", None)
        if logger is None or matrix is None or len(matrix) > CONFUSION_IMAGE_UP_TO:
            return
        names = pl_module.hparams.get("class_names") or [str(i) for i in range(len(matrix))]
        logger.experiment.add_image("test/confusion_matrix", render_confusion_matrix(matrix, names), 0)
        logger.experiment.flush()


def render_confusion_matrix(matrix: torch.Tensor, names: list[str], cell: int = 30) -> torch.Tensor:
    """A CHW uint8 image of `matrix` (rows: true class, columns: predicted), shaded by row share, with
    counts in the cells and the class names and per-class accuracy on the axes.

    PIL rather than matplotlib: training does not need a plotting library.
    """
    matrix = matrix.to(torch.int64)
    n = len(matrix)
    rows = matrix.sum(1).clamp(min=1)
    share = matrix.float() / rows[:, None]
    font = ImageFont.load_default()
    labels = [f"{name[:14]} {100 * share[i, i]:.0f}%" for i, name in enumerate(names)]
    left = 8 + max(int(font.getlength(label)) for label in labels)
    top = 8 + max(int(font.getlength(name[:14])) for name in names)
    image = Image.new("RGB", (left + n * cell + 8, top + n * cell + 24), "white")
    draw = ImageDraw.Draw(image)
    for i in range(n):
        draw.text((4, top + i * cell + cell // 3), labels[i], fill="black", font=font)
        column = Image.new("RGB", (top, cell), "white")  # the predicted-class names, rotated
        ImageDraw.Draw(column).text((4, cell // 3), names[i][:14], fill="black", font=font)
        image.paste(column.rotate(90, expand=True), (left + i * cell, 0))
        for j in range(n):
            s = float(share[i, j])
            if i == j:  # green for right, blue for wrong
                color = (int(255 - 200 * s), 255, int(255 - 200 * s))
            else:
                color = (int(255 - 205 * s), int(255 - 155 * s), 255)
            box = (left + j * cell, top + i * cell, left + (j + 1) * cell - 1, top + (i + 1) * cell - 1)
            draw.rectangle(box, fill=color, outline=(220, 220, 220))
            count = int(matrix[i, j])
            if count:
                draw.text((box[0] + 3, box[1] + cell // 3), str(count), fill="black" if s < 0.6 else "white", font=font)
    draw.text((left, top + n * cell + 6), "rows: true class   columns: predicted", fill="black", font=font)
    return torch.from_numpy(np.array(image)).permute(2, 0, 1).contiguous()
