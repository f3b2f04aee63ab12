"""A task the core has never heard of, written the way a user adds one: regression on `.npy` feature
vectors with a tiny MLP. It touches no file of project/: a task with `decode` and `collate` (what the
DataLoader workers receive), a data module that adds the task's flags and builds it, a batch type, a
LightningModule, and a config file (tests/regression.yaml) that picks them by class path."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import MeanMetric
from webdataset import TarWriter

from project.data.batch import Batch
from project.data.datamodule import ShardDataModule
from project.data.samples import Sample
from project.data.shard_index import INDEX_NAME, Shard, write_index
from project.data.task import Task
from project.errors import DecodeError

FEATURES = 8


@dataclass(kw_only=True)
class VectorBatch(Batch):
    """Feature vectors and their targets."""

    features: torch.Tensor  # float32 [B, F]
    target: torch.Tensor  # float32 [B]


class VectorTask(Task):
    """Samples of a `.npy` float vector and a `.value` target (a number as text), in the DataLoader workers.

    Args:
        noise: standard deviation of the Gaussian noise added to training features (an augmentation
            drawn from torch's generator, which the stream seeds per batch).
    """

    extensions = frozenset({"npy", "value"})

    def __init__(self, noise: float = 0.0) -> None:
        self.noise = noise

    def decode(self, sample: Sample, stage: str) -> tuple[torch.Tensor, float]:
        try:
            features = np.load(io.BytesIO(sample["npy"]), allow_pickle=False).astype(np.float32)
            target = float(sample["value"])
        except (KeyError, ValueError) as error:
            raise DecodeError(f"cannot decode sample {sample['__key__']!r}: {error!r}") from None
        vector = torch.from_numpy(features)
        if stage == "train" and self.noise:
            vector = vector + self.noise * torch.randn_like(vector)
        return vector, target

    def collate(self, examples: list[tuple[torch.Tensor, float]], stage: str) -> VectorBatch:
        features = torch.stack([vector for vector, _ in examples])
        return VectorBatch(features=features, target=torch.tensor([target for _, target in examples]))


class VectorShards(ShardDataModule):
    """The vector task's data module: its flag (`--data.noise`) beside the shard, loader and resume settings.

    Args:
        noise: standard deviation of the Gaussian noise added to training features.
        **kwargs: the shard, loader and resume settings of `ShardDataModule`.
    """

    task_type = VectorTask

    def __init__(self, *, noise: float = 0.0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.noise = noise

    def make_task(self) -> VectorTask:
        return VectorTask(noise=self.noise)


class MLPRegressor(L.LightningModule):
    """A two-layer perceptron trained with mean squared error.

    Args:
        num_features: length of the feature vectors.
        hidden: width of the hidden layer.
        lr: Adam's learning rate.
    """

    def __init__(self, num_features: int = FEATURES, hidden: int = 16, lr: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(num_features, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        self.mean_loss = nn.ModuleDict({stage: MeanMetric() for stage in ("val", "test")})

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features).squeeze(-1)

    def training_step(self, batch: VectorBatch, batch_idx: int) -> torch.Tensor:
        loss = F.mse_loss(self(batch.features), batch.target)
        self.log("train/loss", loss, batch_size=len(batch))
        return loss

    def _evaluate(self, stage: str, batch: VectorBatch) -> None:
        loss = F.mse_loss(self(batch.features), batch.target)
        self.mean_loss[stage].update(loss, weight=len(batch))  # exact under DDP: weighted, synced once
        self.log(f"{stage}/loss", self.mean_loss[stage], batch_size=len(batch))

    def validation_step(self, batch: VectorBatch, batch_idx: int) -> None:
        self._evaluate("val", batch)

    def test_step(self, batch: VectorBatch, batch_idx: int) -> None:
        self._evaluate("test", batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def write_vector_shards(root: Path, sizes: dict[str, list[int]], seed: int = 0) -> dict[str, list[str]]:
    """Shards of {key}.npy and {key}.value in root/<split>/ with a shard index each; the target is a fixed
    linear function of the features plus a little noise. Returns every split's keys."""
    rng = np.random.default_rng(seed)
    weights = rng.normal(size=FEATURES)
    keys: dict[str, list[str]] = {}
    for split, shard_sizes in sizes.items():
        folder = root / split
        folder.mkdir(parents=True)
        shards, keys[split] = [], []
        for number, size in enumerate(shard_sizes):
            path = folder / f"{split}-{number:06d}.tar"
            with TarWriter(str(path), encoder=False) as writer:
                for i in range(size):
                    features = rng.normal(size=FEATURES).astype(np.float32)
                    buffer = io.BytesIO()
                    np.save(buffer, features)
                    target = float(features @ weights + rng.normal(scale=0.05))
                    key = f"{split}{number}_{i:04d}"
                    writer.write({"__key__": key, "npy": buffer.getvalue(), "value": f"{target:.6f}".encode()})
                    keys[split].append(key)
            shards.append(Shard(str(path), size, path.stat().st_size))
        write_index(folder / INDEX_NAME, shards, name=split)
    return keys
