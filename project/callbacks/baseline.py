"""The baseline beside every run: when `python -m project.baseline` has measured a simple model on the same
splits (its baseline.json beside the training shard index), each validation logs `val/acc_baseline` beside
`val/acc` (a flat reference line in TensorBoard), the test logs `test/acc_baseline`, and the end of the test
says in one line how the model compares.

A baseline.json is a stranger's file like any other: it is read bounded, as JSON, and used only when the
splits it names are the run's (the shards' names and counts, and the training fraction).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from project.data.remote import is_remote

FILE_NAME = "baseline.json"
MAX_BYTES = 1 << 20
SPLITS = ("train", "val", "test")


def baseline_path(data: Any) -> Path | None:
    """Where a data module's baseline.json lives: beside its local training shard index, else nowhere."""
    spec = getattr(data, "specs", {}).get("train")
    if not isinstance(spec, str) or is_remote(spec):
        return None
    if os.path.isdir(spec):
        return Path(spec) / FILE_NAME
    return Path(spec).parent / FILE_NAME if spec.endswith(".json") else None


def splits_fingerprint(data: Any) -> str:
    """A hash of what a data module reads: each split's shards (by file name) and sample counts, with the
    training fraction applied. A baseline measured on other shards, or on another fraction, differs."""
    shards = {split: [(os.path.basename(s.url), s.nsamples) for s in data.shards(split)] for split in SPLITS}
    return hashlib.sha256(json.dumps(shards, sort_keys=True).encode()).hexdigest()


def read_baseline(path: Path) -> dict | None:
    """The baseline.json at `path`, if it is one: a dict whose accuracies are numbers in [0, 1]."""
    try:
        with open(path, "rb") as stream:
            data = stream.read(MAX_BYTES + 1)
        found = json.loads(data) if len(data) <= MAX_BYTES else None
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(found, dict) or not isinstance(found.get("fingerprint"), str):
        return None
    for key in ("val_acc", "test_acc"):
        value = found.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1 or math.isnan(value):
            return None
    return found


class BaselineReference(L.Callback):
    """Logs the baseline's accuracy beside the model's (`val/acc_baseline`, `test/acc_baseline`) when the
    data has a baseline.json measured on the same splits; does nothing otherwise."""

    def __init__(self) -> None:
        self.baseline: dict | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        data = trainer.datamodule
        path = baseline_path(data) if data is not None else None
        self.baseline = read_baseline(path) if path is not None and path.is_file() else None
        if self.baseline is None:
            return
        try:
            same = self.baseline["fingerprint"] == splits_fingerprint(data)
        except Exception:  # noqa: BLE001 - a split this run does not configure: no comparison to make
            same = False
        if not same:
            rank_zero_info(f"{path} was measured on other splits: run python -m project.baseline again to compare")
            self.baseline = None

    def _log(self, trainer: L.Trainer, name: str, key: str) -> None:
        if self.baseline is not None and trainer.is_global_zero and not trainer.sanity_checking:
            for logger in trainer.loggers:
                logger.log_metrics({name: float(self.baseline[key])}, step=trainer.global_step)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit":
            self._log(trainer, "val/acc_baseline", "val_acc")

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log(trainer, "test/acc_baseline", "test_acc")

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        accuracy = trainer.callback_metrics.get("test/acc")
        if self.baseline is None or accuracy is None:
            return
        ours, theirs = float(accuracy), float(self.baseline["test_acc"])
        verdict = "above" if ours > theirs else "level with" if ours == theirs else "below"
        rank_zero_info(
            f"test/acc {ours:.4f}: {verdict} the linear baseline's {theirs:.4f} (python -m project.baseline)"
        )
