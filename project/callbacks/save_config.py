"""config.yaml written whole, without secrets: LightningCLI's `SaveConfigCallback` opens config.yaml for
writing, which empties it, then writes it (a kill in between leaves a file that evaluate, export and predict
would read without the keys it lost), and it writes the URLs as given, tokens included."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from lightning.pytorch.cli import LightningArgumentParser, SaveConfigCallback

from project.callbacks.checkpoint_io import is_local
from project.data.atomic import write_atomically
from project.redact import redact, redact_value
from project.run_folder import RUN_CONFIG_KEY


class AtomicSaveConfigCallback(SaveConfigCallback):
    """LightningCLI's `SaveConfigCallback`, writing config.yaml to a temporary file that is then renamed over
    it: evaluate, export and predict rebuild the model from it, and a config.yaml cut at a line boundary
    would still parse, without the keys it lost. Every checkpoint records the file's SHA-256
    (`run_folder.RUN_CONFIG_KEY`), so that only this run's config.yaml is read for it, never another run's
    left in the same folder."""

    config_sha256: str | None = None

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        if self.config_sha256 is not None:
            checkpoint[RUN_CONFIG_KEY] = self.config_sha256

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self.already_saved or not self.save_to_log_dir or not self.overwrite or self.multifile:
            super().setup(trainer, pl_module, stage)
            return
        folder = trainer.strategy.broadcast(str(run_folder(trainer)) if trainer.is_global_zero else None)
        if not is_local(folder):
            super().setup(trainer, pl_module, stage)
            return
        if trainer.is_global_zero:
            config = self.parser.dump(self.config, skip_none=False).encode("utf-8")
            write_atomically(Path(folder) / self.config_filename, lambda stream: stream.write(config))
            self.config_sha256 = hashlib.sha256(config).hexdigest()
            self.save_config(trainer, pl_module, stage)
            self.already_saved = True
        self.already_saved = trainer.strategy.broadcast(self.already_saved)
        self.config_sha256 = trainer.strategy.broadcast(self.config_sha256)


def run_folder(trainer: Any) -> Path:
    """A run's own folder, where its checkpoints/ (Lightning's ModelCheckpoint rule) and config.yaml go:
    `<save_dir>/<name>/<version>` of the first logger (<default_root_dir> for a logger without a local save_dir,
    such as MLflow's with a database or server), `<default_root_dir>` without a logger. `trainer.log_dir` is
    the root of every run for MLflow, or None."""
    if not trainer.loggers:
        return Path(trainer.default_root_dir)
    logger = trainer.loggers[0]
    log_dir = getattr(logger, "log_dir", None)
    if log_dir:
        return Path(log_dir)
    version = logger.version if isinstance(logger.version, str) else f"version_{logger.version}"
    return Path(logger.save_dir or trainer.default_root_dir) / str(logger.name) / version


class RedactedSaveConfig(AtomicSaveConfigCallback):
    """Saves config.yaml with secrets in URLs (`user:token@`, presigned query values) shown as ***: the run
    read the real URLs, a rerun from this file needs them given again (`--data.train URL`)."""

    def __init__(self, parser: LightningArgumentParser, config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(parser, redacted_config(config), *args, **kwargs)


def redacted_config(config: Any) -> Any:
    """A copy of a parsed configuration (a jsonargparse Namespace) with the secrets of its URLs shown as ***:
    what config.yaml, Optuna's study and best.yaml hold."""
    config = config.clone()
    for key, value in config.items():
        config[key] = redact_value(value)
    return config


def print_run_folder(trainer: Any) -> None:
    """Tell the user where the run went and how to watch it (once, from rank zero)."""
    if not trainer.is_global_zero or trainer.logger is None:
        return
    from lightning.pytorch.loggers import CSVLogger, MLFlowLogger, TensorBoardLogger

    run, logger = run_folder(trainer), trainer.logger
    if isinstance(logger, TensorBoardLogger):
        watch = f"tensorboard --logdir {run.parents[1]}"
    elif isinstance(logger, CSVLogger):
        watch = f"the metrics are in {run / 'metrics.csv'}"
    elif isinstance(logger, MLFlowLogger):
        watch = f"mlflow ui --backend-store-uri {redact(logger.experiment.tracking_uri)}"
    else:
        watch = f"your {type(logger).__name__}'s own viewer"
    print(f"\nrun folder: {run}\nwatch it:   {watch}")
