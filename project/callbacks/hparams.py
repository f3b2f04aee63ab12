"""Hyperparameters next to the metrics they led to, for every logger of a run, through Lightning's public logger
API (`log_hyperparams`, `log_metrics`): TensorBoard's HPARAMS tab, MLflow's params and metrics, W&B's config
and summary, CSVLogger's hparams.yaml and metrics.csv."""

from __future__ import annotations

import math
from typing import Any

import lightning as L
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger


def flat_hparams(trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
    """Model and data hyperparameters as every logger takes them: scalars and strings, `model.` and `data.` keys."""
    flat: dict[str, Any] = {}
    sources = [("model", pl_module.hparams)]
    if trainer.datamodule is not None:
        sources.append(("data", trainer.datamodule.hparams))
    for prefix, hparams in sources:
        flat[f"{prefix}.class"] = type(pl_module if prefix == "model" else trainer.datamodule).__name__
        for key, value in hparams.items():
            if key in ("class_names", "classes") or key.startswith("_"):  # long lists; the CLI's own keys
                continue
            if isinstance(value, dict) and isinstance(value.get("class_path"), str):  # a part given by class_path
                flat.update(part_hparams(f"{prefix}.{key}", value))
                continue
            flat[f"{prefix}.{key}"] = loggable(value)
    flat.update(
        {
            "trainer.precision": str(trainer.precision),
            "trainer.max_epochs": trainer.max_epochs if trainer.max_epochs is not None else -1,
            "trainer.world_size": trainer.world_size,
        }
    )
    return flat


def part_hparams(name: str, spec: dict) -> dict[str, Any]:
    """A part of the model given by class_path (`model.backbone`): its class's name, and each of its settings."""
    flat = {name: spec["class_path"].rpartition(".")[2]}
    init_args = spec.get("init_args")
    for key, value in (init_args if isinstance(init_args, dict) else {}).items():
        flat[f"{name}.{key}"] = loggable(value)
    return flat


def loggable(value: Any) -> Any:
    """A scalar or string as it is, anything else as its text."""
    return str(value) if value is None or isinstance(value, (list, tuple, dict)) else value


def monitored(trainer: L.Trainer) -> str | None:
    """The metric the best checkpoint is chosen by (val/acc in the default config), if any."""
    callback = trainer.checkpoint_callback
    return callback.monitor if isinstance(callback, ModelCheckpoint) else None


def best_tag(metric: str) -> str:
    """The tag of the best value of a monitored metric: hp/best_val_acc for val/acc."""
    return "hp/best_" + metric.replace("/", "_")


def final_tag(metric: str) -> str:
    """hp/test_acc for test/acc: a run's final value of a metric, beside its hyperparameters."""
    return "hp/" + metric.replace("/", "_")


class HyperparameterReport(Callback):
    """At fit start, the model's and data's hyperparameters (flat `model.lr`, `data.batch_size` keys) to every
    logger; at fit end the best value of the monitored metric (`hp/best_val_acc`) and the last validation
    metrics (`hp/val_acc`, `hp/val_loss`), after testing the test metrics (`hp/test_acc`, `hp/test_loss`).
    TensorBoard's HPARAMS tab lists those `hp/` metrics in a column each."""

    def __init__(self, metrics: tuple[str, ...] = ("acc", "loss")) -> None:
        """Args:
        metrics: the metric names reported per stage (`val/<name>`, `test/<name>`), when logged.
        """
        self.metrics = tuple(metrics)

    def tags(self, trainer: L.Trainer) -> list[str]:
        metric = monitored(trainer)
        stages = [final_tag(f"{stage}/{name}") for stage in ("val", "test") for name in self.metrics]
        return [best_tag(metric), *stages] if metric else stages

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        params = flat_hparams(trainer, pl_module)
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):  # declares the columns of HPARAMS; filled in at the end
                logger.log_hyperparams(params, metrics=dict.fromkeys(self.tags(trainer), math.nan))
            else:
                logger.log_hyperparams(params)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        metric = monitored(trainer)
        best = trainer.checkpoint_callback.best_model_score if metric else None
        values = {final_tag(f"val/{name}"): trainer.callback_metrics.get(f"val/{name}") for name in self.metrics}
        if best is not None:
            values[best_tag(metric)] = best
        self._log(trainer, values)

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log(
            trainer, {final_tag(f"test/{name}"): trainer.callback_metrics.get(f"test/{name}") for name in self.metrics}
        )

    @staticmethod
    def _log(trainer: L.Trainer, values: dict[str, Any]) -> None:
        found = {tag: float(value) for tag, value in values.items() if value is not None}
        if trainer.is_global_zero and found:
            for logger in trainer.loggers:
                logger.log_metrics(found, step=trainer.global_step)
                logger.save()
