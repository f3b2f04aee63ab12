"""ShardDataModule: streams WebDataset shards into mini-batches for the Lightning Trainer."""

from __future__ import annotations

import os
from dataclasses import replace
from functools import cached_property
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader

from project.data.device_decode import DeviceDecoder
from project.data.health import SkipLedger
from project.data.pipeline import ShardStream
from project.data.plan import fraction_counts
from project.data.shards import Shard, ShardIndex, resolve_shards
from project.data.transforms import Preset, build_transform
from project.data.workers import StartMethod, WorkerInit, as_is, start_forkserver, worker_context
from project.errors import UserError

DataSpec = str | list[str]


class EpochLoader(DataLoader):
    """A DataLoader that sets its ShardStream's epoch before each pass, and resumes mid-epoch.

    Lightning calls `set_epoch` only on samplers, and an IterableDataset has none. The resume position
    is kept by the data module's `state_dict`: Lightning restores it before anything iterates the loader
    (its loops' loader states arrive only after `configure_optimizers` has already iterated it, when
    the model asks for `estimated_stepping_batches`).
    """

    def __init__(
        self,
        dataset: ShardStream,
        datamodule: ShardDataModule | None = None,
        worker_start: StartMethod = "forkserver",
        **kwargs: Any,
    ) -> None:
        workers = kwargs.get("num_workers", 0)
        dataset.num_workers = max(1, workers)  # the plan splits over these workers
        # batches leave the stream complete: DataLoader's default_convert would only walk every key
        kwargs.setdefault("collate_fn", as_is)
        if workers > 0:
            kwargs["multiprocessing_context"] = worker_context(worker_start)  # see project/data/workers.py
        super().__init__(dataset, batch_size=None, worker_init_fn=WorkerInit(), **kwargs)
        self.datamodule = datamodule

    def __iter__(self):  # noqa: ANN204
        stream = self.dataset
        trainer = self.datamodule.trainer if self.datamodule is not None else None
        epoch, done = (trainer.current_epoch if trainer is not None else stream.epoch), 0
        position = self.datamodule.take_resume_position() if self.datamodule and stream.train else None
        if position is not None:
            epoch, done = position["epoch"], position["batches"]
            if done >= position["epoch_batches"]:  # saved at the end of its epoch: start the next one
                epoch, done = epoch + 1, 0
            elif (position["world_size"], position["num_workers"]) != (stream.world_size, stream.num_workers):
                now = f"{stream.world_size} rank(s) x {stream.num_workers} worker(s)"
                saved = f"{position['world_size']} x {position['num_workers']}"
                rank_zero_warn(
                    f"resuming mid-epoch with {now} instead of {saved}: this epoch continues on the new "
                    "split and may repeat or miss samples; later epochs are exact"
                )
        stream.set_epoch(epoch)
        stream.resume_after(done)
        return super().__iter__()

    def state_dict(self) -> dict[str, int]:
        """The training position (also in the data module's state): marks this loader as resumable."""
        return self.datamodule.train_position() if self.datamodule is not None else {}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Nothing to do: the data module's state, restored first, carries the position."""


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
        fraction: share of the training split to train on, in (0, 1]: exactly round(fraction × samples),
            the same ones for any seed, and nested (the 0.1 subset lies inside the 0.25 one). It is a
            prefix of every shard, so it reads only its own bytes (see `plan.fraction_counts`).
            Validation and test stay whole, so metrics compare across fractions.
        classes: class names, when the shard index does not record them.
        pin_memory: pin batches in page-locked memory (default: when CUDA is available).
        prefetch_factor: batches each worker prepares ahead.
        max_skipped_fraction: unreadable samples (a truncated shard, a bad image, a missing label) are
            skipped, counted and logged as <stage>/skipped; past this share of an epoch the run stops.
        cache_dir: keep local copies of remote (http, s3, ...) shards in this folder; None streams them.
        cache_gb: the most the cache folder may hold, in GB; the least recently used copies go first.
        decode_on: where JPEGs are decoded: cpu (in the DataLoader workers) or device (on the training
            device after the batch reaches it, with torchvision's decode_jpeg: nvJPEG on CUDA); see
            project/data/device_decode.py for when it helps.
        worker_start: how DataLoader workers start: forkserver (a fork of a clean helper process: safe
            beside the trainer's threads), spawn (a fresh interpreter each: slow), or fork (of the trainer:
            can deadlock, see project/data/workers.py). Datasets must pickle for the first two.
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
        fraction: float = 1.0,
        classes: list[str] | None = None,
        pin_memory: bool | None = None,
        prefetch_factor: int = 2,
        max_skipped_fraction: float = 0.01,
        cache_dir: str | None = None,
        cache_gb: float = 50.0,
        decode_on: Literal["cpu", "device"] = "cpu",
        worker_start: StartMethod = "forkserver",
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
        if not 0 < fraction <= 1:
            raise UserError(f"data.fraction must be in (0, 1], got {fraction}")
        self.fraction = fraction
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self.prefetch_factor = prefetch_factor
        self.max_skipped_fraction = max_skipped_fraction
        self.cache_dir, self.cache_bytes = cache_dir, int(cache_gb * 1e9)
        self.decode_on = decode_on
        self.worker_start = worker_start
        if num_workers > 0 and worker_start == "forkserver":
            start_forkserver()  # it imports the pipeline while the trainer sets up; the first workers need it
        self.device_decoder = DeviceDecoder(augment, image_size) if decode_on == "device" else None
        self._ledgers: dict[tuple, SkipLedger] = {}  # the current pass's
        self._resume_position: dict | None = None
        self._loaders: dict[str, EpochLoader] = {}
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

    def shards(self, split: str) -> list[Shard]:
        """The shards a split reads, with the counts it reads: training keeps `fraction` of each shard."""
        shards = self.index(split).shards
        if split != "train" or self.fraction == 1:
            return shards
        counts = fraction_counts([shard.nsamples for shard in shards], self.fraction)
        return [replace(shard, nsamples=count) for shard, count in zip(shards, counts, strict=True) if count]

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
            self.shards(split),
            train=train,
            batch_size=self.batch_size,
            transform=build_transform(self.augment, self.image_size, train=train),
            classes=self.classes,
            seed=self.seed,
            shuffle_buffer=self.shuffle_buffer,
            decode_size=self.image_size,
            decode_on=self.decode_on,
            num_workers=self.num_workers,
            skip_corrupt=True,
            cache_dir=self.cache_dir,
            cache_bytes=self.cache_bytes,
        )
        trainer = self.trainer
        if trainer is not None:
            stream.set_topology(trainer.world_size, trainer.global_rank)
        return stream

    def _loader(self, split: str) -> EpochLoader:
        workers = self.num_workers
        self._loaders[split] = EpochLoader(
            self._stream(split),
            self,
            worker_start=self.worker_start,
            num_workers=workers,
            pin_memory=self.pin_memory,
            prefetch_factor=self.prefetch_factor if workers > 0 else None,
            # a fresh worker copy each epoch picks up the new epoch; persistent workers would keep the old
            persistent_workers=False,
        )
        return self._loaders[split]

    def train_position(self) -> dict[str, int]:
        """Where training stands: epoch, batches done in it, and the topology that planned it."""
        trainer, loader = self.trainer, self._loaders.get("train")
        if trainer is None or loader is None:
            return {}
        # batches whose training step ran; Lightning's fetcher has already pulled one more (prefetch),
        # so what the loader yielded would overcount by one
        done = trainer.fit_loop.epoch_loop.batch_progress.current.processed
        stream = loader.dataset
        return {"epoch": trainer.current_epoch, "batches": done, "epoch_batches": len(stream),
                "world_size": stream.world_size, "num_workers": stream.num_workers}  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        position = self.train_position()
        return {"train_position": position} if position else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resume_position = state.get("train_position")

    def take_resume_position(self) -> dict | None:
        """The restored training position, once: only the first pass after a restore resumes."""
        position, self._resume_position = self._resume_position, None
        return position

    def on_before_batch_transfer(self, batch: dict, dataloader_idx: int) -> dict:
        """Count the samples the stream skipped, warn at a bounded rate, stop past the limit."""
        if isinstance(batch, dict) and batch.get("skipped"):  # not a dict: the model summary's example input
            self._record_skipped(batch["skipped"])
        return batch

    def on_after_batch_transfer(self, batch: dict, dataloader_idx: int) -> dict:
        """With decode_on=device: decode the batch's JPEGs on its device, then crop and resize them there."""
        if self.device_decoder is None or not isinstance(batch, dict) or "jpeg" not in batch:
            return batch
        batch, skipped = self.device_decoder(batch)
        if skipped:
            self._record_skipped(skipped)
        return batch

    def _record_skipped(self, skipped: list[tuple[str, str, str]]) -> None:
        trainer = self.trainer
        if trainer is None:
            return
        stage = "train" if trainer.training else "val" if (trainer.validating or trainer.sanity_checking) else "test"
        epoch = trainer.current_epoch
        ledger = self._ledgers.get(stage)
        if ledger is None or ledger.epoch != epoch:
            planned = sum(shard.nsamples for shard in self.shards(stage)) // trainer.world_size
            ledger = self._ledgers[stage] = SkipLedger(stage, planned, self.max_skipped_fraction)
            ledger.epoch = epoch
        ledger.record(skipped)

    def train_dataloader(self) -> EpochLoader:
        return self._loader("train")

    def val_dataloader(self) -> EpochLoader:
        return self._loader("val")

    def test_dataloader(self) -> EpochLoader:
        return self._loader("test")
