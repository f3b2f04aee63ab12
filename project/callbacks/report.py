"""Hyperparameters in TensorBoard's HPARAMS tab, next to the metrics they led to."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger


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
        flat[f"{prefix}.class"] = type(pl_module if prefix == "model" else trainer.datamodule).__name__
        for key, value in hparams.items():
            if key in ("class_names", "classes") or key.startswith("_"):  # long lists; the CLI's own keys
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


def monitored(trainer: L.Trainer) -> str | None:
    """The metric the best checkpoint is chosen by (val/acc in the default config), if any."""
    callback = trainer.checkpoint_callback
    return callback.monitor if isinstance(callback, ModelCheckpoint) else None


def best_tag(metric: str) -> str:
    """The tag of the best value of a monitored metric: hp/best_val_acc for val/acc."""
    return "hp/best_" + metric.replace("/", "_")


class TensorBoardReport(Callback):
    """Hyperparameters with their final metrics in the HPARAMS tab: the best value of the monitored metric
    (hp/best_val_acc when the best checkpoint is chosen by val/acc), that metric and its test twin, and
    the validation and test losses."""

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        logger = _tensorboard(trainer)
        if logger is None:
            return
        from torch.utils.tensorboard.summary import hparams

        metric = monitored(trainer)
        tags = ["val/loss", "test/loss"]
        if metric:
            tags = [best_tag(metric), metric, metric.replace("val/", "test/", 1), *tags]
        # the HPARAMS tab reads each metric as the last value of the scalar with that tag
        experiment, start, end = hparams(flat_hparams(trainer, pl_module), dict.fromkeys(tags, 0.0))
        writer = logger.experiment._get_file_writer()
        for summary in (experiment, start, end):
            writer.add_summary(summary)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        logger = _tensorboard(trainer)
        metric = monitored(trainer)
        best = trainer.checkpoint_callback.best_model_score if metric else None
        if logger is not None and best is not None:
            logger.experiment.add_scalar(best_tag(metric), float(best), trainer.global_step)
