"""ShardDataModule: streams WebDataset shards into mini-batches for the Lightning Trainer."""

from __future__ import annotations

import os
from functools import cached_property
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

from project.data.pipeline import ShardStream
from project.data.shards import ShardIndex, resolve_shards
from project.data.transforms import Preset, build_transform
from project.errors import UserError

DataSpec = str | list[str]


class EpochLoader(DataLoader):
    """A DataLoader that tells its ShardStream the trainer's epoch before each pass.

    Lightning calls `set_epoch` only on samplers, and an IterableDataset has none.
    """

    def __init__(self, dataset: ShardStream, epoch_source: Any, **kwargs: Any) -> None:
        dataset.num_workers = max(1, kwargs.get("num_workers", 0))  # the plan splits over these workers
        super().__init__(dataset, batch_size=None, **kwargs)
        self.epoch_source = epoch_source

    def __iter__(self):  # noqa: ANN204
        trainer = getattr(self.epoch_source, "trainer", None)
        if trainer is not None:
            self.dataset.set_epoch(trainer.current_epoch)
        return super().__iter__()


class ShardDataModule(L.LightningDataModule):
    """Streams image classification samples from WebDataset tar shards.

    Each split is read through a shard index, so every epoch is planned exactly: training batches are
    equal on every rank and no sample repeats within an epoch; validation and test read every sample
    exactly once. Memory is bounded by the shuffle buffer and the prefetched batches, whatever the
    dataset's size.

    Args:
        root: a folder with train/, val/ and test/ subfolders, each holding shards and a shardindex.json.
        train: the training split, overriding root/train: a folder, a shard index file, a glob, a brace
            pattern (``shard-{000000..000099}.tar``), a URL of a shard index, or a list of these.
        val: the validation split, overriding root/val (same forms as train).
        test: the test split, overriding root/test (same forms as train).
        batch_size: samples per batch on each device (the global batch is this × devices × nodes).
        num_workers: DataLoader worker processes per device that read, decode and augment.
        shuffle_buffer: encoded training samples held in the shuffle buffer.
        image_size: side of the square images the model sees.
        augment: training augmentation preset: none, light, standard or strong.
        seed: seed of the shard order, the shuffle buffer and the augmentation.
        classes: class names, when the shard index does not record them.
        pin_memory: pin batches in page-locked memory (default: when CUDA is available).
        prefetch_factor: batches each worker prepares ahead.
    """

    def __init__(
        self,
        root: str | None = "data/demo",
        train: DataSpec | None = None,
        val: DataSpec | None = None,
        test: DataSpec | None = None,
        batch_size: int = 128,
        num_workers: int = 2,
        shuffle_buffer: int = 1000,
        image_size: int = 32,
        augment: Preset = "light",
        seed: int = 0,
        classes: list[str] | None = None,
        pin_memory: bool | None = None,
        prefetch_factor: int = 2,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        if batch_size < 1 or num_workers < 0 or shuffle_buffer < 1 or image_size < 1:
            raise UserError("data.batch_size, data.shuffle_buffer and data.image_size must be positive")
        self.specs = {
            split: spec if spec is not None else (os.path.join(root, split) if root else None)
            for split, spec in (("train", train), ("val", val), ("test", test))
        }
        self.batch_size, self.num_workers = batch_size, num_workers
        self.shuffle_buffer, self.image_size, self.augment, self.seed = (
            shuffle_buffer,
            image_size,
            augment,
            seed,
        )
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self.prefetch_factor = prefetch_factor
        self._classes = classes
        self._indexes: dict[str, ShardIndex] = {}

    def index(self, split: str) -> ShardIndex:
        """The resolved shards of a split (read once)."""
        if split not in self._indexes:
            spec = self.specs[split]
            if spec is None:
                raise UserError(f"no {split} data configured: set data.root or data.{split}")
            self._indexes[split] = resolve_shards(spec)
        return self._indexes[split]

    @cached_property
    def classes(self) -> list[str]:
        """Class names, from the configuration or else from the first split whose index records them."""
        if self._classes:
            return list(self._classes)
        for split in ("train", "val", "test"):
            if self.specs[split] is not None and self.index(split).classes:
                return list(self.index(split).classes)
        raise UserError("no class names in the shard indexes: set data.classes (or rebuild the index)")

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def setup(self, stage: str) -> None:
        trainer = self.trainer
        if stage != "fit" or trainer is None:
            return
        accumulate = trainer.accumulate_grad_batches
        global_batch = self.batch_size * trainer.num_devices * trainer.num_nodes * accumulate
        rank_zero_info(
            f"global batch: {self.batch_size} per device × {trainer.num_devices} device(s) × "
            f"{trainer.num_nodes} node(s) × {accumulate} accumulation step(s) = {global_batch} samples"
        )
        # logged with the other hyperparameters (save_hyperparameters fixes what the logger sees)
        self.save_hyperparameters({**self.hparams, "global_batch_size": global_batch})

    def _stream(self, split: str) -> ShardStream:
        train = split == "train"
        stream = ShardStream(
            self.index(split).shards,
            train=train,
            batch_size=self.batch_size,
            transform=build_transform(self.augment, self.image_size, train=train),
            classes=self.classes,
            seed=self.seed,
            shuffle_buffer=self.shuffle_buffer,
            decode_size=self.image_size,
            num_workers=self.num_workers,
        )
        trainer = self.trainer
        if trainer is not None:
            stream.set_topology(trainer.world_size, trainer.global_rank)
        return stream

    def _loader(self, split: str) -> EpochLoader:
        workers = self.num_workers
        return EpochLoader(
            self._stream(split),
            self,
            num_workers=workers,
            pin_memory=self.pin_memory,
            prefetch_factor=self.prefetch_factor if workers > 0 else None,
            # a fresh worker copy each epoch picks up the new epoch; persistent workers would keep the old
            persistent_workers=False,
        )

    def train_dataloader(self) -> EpochLoader:
        return self._loader("train")

    def val_dataloader(self) -> EpochLoader:
        return self._loader("val")

    def test_dataloader(self) -> EpochLoader:
        return self._loader("test")
