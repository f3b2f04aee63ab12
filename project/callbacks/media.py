"""Pictures and texts (a batch as a grid, the confusion matrix) for whichever loggers a run has, each through
its own public API: TensorBoard's SummaryWriter, MLflow's client, W&B's logger. Lightning has no common
media API; a logger without one (CSVLogger, any other with a `log_dir`) gets the files in `<log_dir>/media/`.
Written from global rank zero only."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch.loggers import Logger, MLFlowLogger, TensorBoardLogger, WandbLogger
from PIL import Image


def _name(tag: str, step: int, suffix: str) -> str:
    """`train_first_batch-step000000.png` for tag `train/first_batch`: a file name for any tag."""
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', tag)}-step{step:06d}{suffix}"


def _folder(logger: Logger) -> Path | None:
    log_dir = getattr(logger, "log_dir", None) or getattr(logger, "save_dir", None)
    return Path(log_dir) / "media" if log_dir else None


def log_image(loggers: list[Logger], tag: str, image: torch.Tensor, step: int) -> None:
    """A CHW uint8 image, as `tag` at `step`, to every logger that can hold one."""
    array = image.detach().cpu().permute(1, 2, 0).numpy().astype(np.uint8)  # HWC, what all but TensorBoard take
    for logger in loggers:
        if isinstance(logger, TensorBoardLogger):
            logger.experiment.add_image(tag, image, step)
            logger.experiment.flush()
        elif isinstance(logger, MLFlowLogger):
            logger.experiment.log_image(logger.run_id, array, artifact_file=f"media/{_name(tag, step, '.png')}")
        elif isinstance(logger, WandbLogger):
            logger.log_image(key=tag, images=[array], step=step)
        elif (folder := _folder(logger)) is not None:  # CSVLogger and the rest: files beside the metrics
            folder.mkdir(parents=True, exist_ok=True)
            buffer = io.BytesIO()
            Image.fromarray(array).save(buffer, "PNG")
            (folder / _name(tag, step, ".png")).write_bytes(buffer.getvalue())


def log_text(loggers: list[Logger], tag: str, text: str, step: int) -> None:
    """A Markdown text, as `tag` at `step`, to every logger that can hold one."""
    for logger in loggers:
        if isinstance(logger, TensorBoardLogger):
            logger.experiment.add_text(tag, text, step)
        elif isinstance(logger, MLFlowLogger):
            logger.experiment.log_text(logger.run_id, text, f"media/{_name(tag, step, '.md')}")
        elif isinstance(logger, WandbLogger):
            logger.log_text(key=tag, columns=["text"], data=[[text]], step=step)
        elif (folder := _folder(logger)) is not None:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / _name(tag, step, ".md")).write_text(text)


def media_loggers(module: Any) -> list[Logger]:
    """A LightningModule's loggers on global rank zero (media is written once), else none."""
    trainer = getattr(module, "_trainer", None)
    if trainer is None or not trainer.is_global_zero:
        return []
    return list(trainer.loggers)
