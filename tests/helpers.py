"""Callbacks for tests that run the CLI, and the flags that add them: the keys of every batch per rank,
step checkpoints, and a line after each step."""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from pathlib import Path

from lightning.pytorch import Callback


def recorder(folder: Path) -> str:
    """A train flag that adds `RecordBatches`, writing into `folder`."""
    callback = {"class_path": "tests.helpers.RecordBatches", "init_args": {"folder": str(folder)}}
    return f"--trainer.callbacks+={json.dumps(callback)}"


def step_checkpoints(folder: Path, every: int) -> str:
    """A train flag that adds a ModelCheckpoint saving `folder`/step=N.ckpt every `every` steps, all kept."""
    callback = {
        "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
        "init_args": {"dirpath": str(folder), "filename": "{step}", "every_n_train_steps": every, "save_top_k": -1},
    }
    return f"--trainer.callbacks+={json.dumps(callback)}"


class RecordBatches(Callback):
    """Writes {stage: {epoch: [[keys of batch 0], ...]}} to `folder`/rank<global rank>.json at teardown."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)
        self.seen: dict = defaultdict(lambda: defaultdict(list))

    def _record(self, trainer, stage: str, batch: dict) -> None:
        if not trainer.sanity_checking:
            self.seen[stage][trainer.current_epoch].append(list(batch.keys))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._record(trainer, "train", batch)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self._record(trainer, "val", batch)

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self._record(trainer, "test", batch)

    def teardown(self, trainer, pl_module, stage):
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"rank{trainer.global_rank}-pid{os.getpid()}.json"
        path.write_text(json.dumps(self.seen))


def load_records(folder: Path) -> dict[int, dict]:
    """{global rank: {stage: {epoch: [[keys], ...]}}}, merging the files a rank wrote."""
    merged: dict[int, dict] = {}
    for path in sorted(folder.glob("rank*.json")):
        rank = int(path.name[4:].split("-")[0])
        for stage, epochs in json.loads(path.read_text()).items():
            merged.setdefault(rank, {}).setdefault(stage, {}).update(epochs)
    return merged


class AnnounceSteps(Callback):
    """Prints `STEP n` after each training step (so a test can act mid-run), then waits `delay` seconds."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        print(f"STEP {trainer.global_step}", flush=True)
        time.sleep(self.delay)


class KillAtPredictBatch(Callback):
    """SIGKILLs its own process as predict batch `batch` starts (after the earlier ones were written)."""

    def __init__(self, batch: int) -> None:
        self.batch = batch

    def on_predict_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if batch_idx == self.batch:
            os.kill(os.getpid(), 9)
