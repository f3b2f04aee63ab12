"""config.yaml written whole, without secrets: LightningCLI's `SaveConfigCallback` opens config.yaml for
writing, which empties it, then writes it (a kill in between leaves a file that evaluate, export and predict
would read without the keys it lost), and it writes the URLs as given, tokens included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch.cli import LightningArgumentParser, SaveConfigCallback

from project.callbacks.checkpoint_io import is_local
from project.data.atomic import write_atomically
from project.data.redact import redact_value


class AtomicSaveConfigCallback(SaveConfigCallback):
    """LightningCLI's `SaveConfigCallback`, writing config.yaml to a temporary file that is then renamed over
    it: evaluate, export and predict rebuild the model from it, and a config.yaml cut at a line boundary
    would still parse, without the keys it lost."""

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self.already_saved or not self.save_to_log_dir or not self.overwrite or self.multifile:
            super().setup(trainer, pl_module, stage)
            return
        log_dir = trainer.log_dir  # every rank: a collective call
        if log_dir is None or not is_local(log_dir):
            super().setup(trainer, pl_module, stage)
            return
        final = self.config_filename
        if trainer.is_global_zero:
            config = self.parser.dump(self.config, skip_none=False)
            write_atomically(Path(log_dir) / final, lambda stream: stream.write(config.encode("utf-8")))
            self.save_config(trainer, pl_module, stage)
            self.already_saved = True
        self.already_saved = trainer.strategy.broadcast(self.already_saved)


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
