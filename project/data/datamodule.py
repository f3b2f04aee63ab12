"""ShardDataModule: streams WebDataset shards into mini-batches for the Lightning Trainer, for any task.

A task's data module subclasses it with the task's settings and builds its `Task` (`make_task`): the small
object whose `decode` and `collate` run in the DataLoader workers (project/data/task.py). Everything else is
here and the same for every task: resolving each split's shards, planning epochs, loaders and workers; the
resume position (`ResumePosition`) and the skip count (`SkipCount`) are objects it holds, saved and counted
through its Lightning hooks.
"""

from __future__ import annotations

import os
from dataclasses import replace
from functools import cached_property
from typing import Any, ClassVar

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from project.data.batch import Batch, Skipped
from project.data.files import is_plain_folder, pack_folder
from project.data.health import SkipCount
from project.data.loader import EpochLoader
from project.data.plan import fraction_counts
from project.data.position import ResumePosition
from project.data.samples import MAX_MEMBER_BYTES
from project.data.shard_index import Shard, ShardIndex, shuffled_before_sharding
from project.data.split_indexes import SplitIndexes
from project.data.stream import ShardStream
from project.data.tarreader import MAX_COMPRESSION_RATIO
from project.data.task import Task
from project.data.workers import StartMethod, start_forkserver
from project.errors import UserError, check_not_negative, check_positive
from project.redact import redact_hparams, redact_value

DataSpec = str | list[str]
MIX_SHARDS = 32  # data.mix_shards for shards that may be sorted: 20 one-class shards mix fully (benchmarks/README.md)
SPLITS = ("train", "val", "test")  # the splits of `root`; `predict` is only ever given explicitly


class ShardDataModule(SplitIndexes, L.LightningDataModule):
    """Streams samples from WebDataset tar shards; the task its subclass builds decodes and collates them.

    Each split is read through a shard index, so every epoch is planned exactly: training batches are
    equal on every rank and no sample repeats within an epoch; validation and test read every sample
    exactly once. Memory is bounded by the shuffle buffer and the prefetched batches, whatever the
    dataset's size.

    Args:
        root: a folder with train/, val/ and test/ subfolders, each holding shards and a shardindex.json (local,
            a store's s3://bucket/ds, ...), or a folder of the Hub's WebDataset layout (an _info.json).
        train: the training split, overriding root/train: a folder, a shard index file, a glob, a brace
            pattern (``shard-{000000..000099}.tar``), a URL of a shard index, or a list of these.
        val: the validation split, overriding root/val (same forms as train).
        test: the test split, overriding root/test (same forms as train).
        predict: what `project.predict` reads (same forms as train, labels optional), or a plain folder of
            the files the task reads (`predict_files`), packed once into shards in a temporary folder.
        batch_size: samples per batch on each device (the global batch is this × devices × nodes).
        num_workers: DataLoader worker processes per device that read, decode and augment.
        decode_threads: threads of each loader process that decode and augment batches at once (the
            workers, or the training process itself when num_workers is 0): num_workers 0 with
            decode_threads 2 is one process, with no worker memory and no batch hand-over; the same
            batches as one thread's (project/data/decode_threads.py).
        shuffle_buffer: encoded training samples held in the shuffle buffer.
        mix_shards: training reads shards in groups of up to this many, interleaved sample by sample, each
            worker a slice of every shard of a group: batches mix up to this many shards, even shards of one
            class each (a file or a connection each). 1: one after another. None: 1 for shards whose index
            says they were shuffled before sharding (prepare's, the demos'), else 32.
        seed: seed of the shard order, the shuffle buffer and the augmentation.
        fraction: share of the training split to train on, in (0, 1]: exactly round(fraction × samples),
            the same ones for any seed, and nested (the 0.1 subset lies inside the 0.25 one). It is a
            prefix of every shard, so it reads only its own bytes (see `plan.fraction_counts`).
            Validation and test stay whole, so metrics compare across fractions.
        pin_memory: pin batches in page-locked memory (default: when CUDA is available).
        prefetch_factor: batches each worker prepares ahead.
        max_skipped_fraction: unreadable samples (a truncated shard, a bad image, a missing label) are
            skipped, counted and logged as <stage>/skipped; past this share of an epoch the run stops.
        cache_dir: keep local copies of remote (http, s3, ...) shards in this folder; None streams them.
        cache_gb: the most the cache folder may hold, in GB; the least recently used copies go first.
        read_ahead_mb: MB of remote shards each worker fetches ahead of its reading, in its plan's order, the
            next shard requested while one is read: hides a store's latency (memory: at most twice this); 0: none.
        worker_start: how DataLoader workers start: forkserver (a fork of a clean helper process: safe
            beside the trainer's threads), spawn (a fresh interpreter each: slow), or fork (of the trainer:
            can deadlock, see project/data/workers.py). Datasets must pickle for the first two.
        bucket_by_size: group training samples of similar size into batches, within the shuffle buffer
            (less padding for texts of varied length; batches stay random in order). Best with a
            shuffle_buffer of many batches.
        max_member_bytes: a tar member whose header declares more bytes is never read: its sample is
            skipped and counted (a hostile or broken shard cannot make a worker allocate gigabytes).
        max_compression_ratio: a compressed shard (gzip, bzip2, xz) whose bytes decompress to more than this many
            times the compressed bytes read is unreadable from there on: its samples are skipped and counted (a
            decompression bomb costs work in proportion to its size; real shards stay far below it).
    """

    # the class of the task `make_task` builds: its members and flags are known before it is built
    task_type: ClassVar[type[Task]] = Task

    def __init__(
        self,
        *,
        root: str | None = "data/demo",
        train: DataSpec | None = None,
        val: DataSpec | None = None,
        test: DataSpec | None = None,
        predict: DataSpec | None = None,
        batch_size: int = 128,
        num_workers: int = 2,
        shuffle_buffer: int = 1000,
        mix_shards: int | None = None,
        seed: int = 0,
        fraction: float = 1.0,
        pin_memory: bool | None = None,
        prefetch_factor: int = 2,
        max_skipped_fraction: float = 0.01,
        cache_dir: str | None = None,
        cache_gb: float = 50.0,
        read_ahead_mb: float = 32.0,
        worker_start: StartMethod = "forkserver",
        bucket_by_size: bool = False,
        max_member_bytes: int = MAX_MEMBER_BYTES,
        decode_threads: int = 1,
        max_compression_ratio: float = MAX_COMPRESSION_RATIO,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        redact_hparams(self)  # URLs' secrets stay out of hparams.yaml, TensorBoard and checkpoints
        check_positive(batch_size=batch_size, shuffle_buffer=shuffle_buffer, prefetch_factor=prefetch_factor)
        check_positive(decode_threads=decode_threads)
        if decode_threads > 1 and not self.task_type.thread_safe:
            task = self.task_type.__name__
            rank_zero_warn(f"data.decode_threads: {task} is not thread_safe, so its batches decode one at a time")
        check_positive(cache_gb=cache_gb, max_member_bytes=max_member_bytes, mix_shards=mix_shards)
        check_positive(max_compression_ratio=max_compression_ratio)
        check_not_negative(num_workers=num_workers, read_ahead_mb=read_ahead_mb)
        if not 0 < fraction <= 1:
            raise UserError(f"data.fraction must be in (0, 1], got {fraction}")
        if not 0 <= max_skipped_fraction <= 1:
            raise UserError(f"data.max_skipped_fraction must be in [0, 1], got {max_skipped_fraction}")
        self.root = root
        given = {"train": train, "val": val, "test": test}
        self.specs = {
            split: spec if spec is not None else (os.path.join(root, split) if root else None)
            for split, spec in given.items()
        } | {"predict": predict}
        self.batch_size, self.num_workers, self.decode_threads = batch_size, num_workers, decode_threads
        self.shuffle_buffer, self.seed, self.mix_shards = shuffle_buffer, seed, mix_shards
        self.fraction, self.prefetch_factor = fraction, prefetch_factor
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self.cache_dir, self.cache_bytes = cache_dir, int(cache_gb * 1e9)
        self.read_ahead_bytes = int(read_ahead_mb * 1e6)
        self.worker_start, self.bucket_by_size, self.max_member_bytes = worker_start, bucket_by_size, max_member_bytes
        self.max_compression_ratio = max_compression_ratio
        if num_workers > 0 and worker_start == "forkserver":
            # it imports the stream and this task while the trainer sets up; the first workers need it
            start_forkserver([self.task_type.__module__])
        self.position = ResumePosition()  # saved in checkpoints as train_position
        self.skips = SkipCount(max_skipped_fraction)
        self._loaders: dict[str, EpochLoader] = {}
        self._indexes: dict[str, ShardIndex] = {}
        self._prepared = False

    def make_task(self) -> Task:
        """The task the workers receive: a `task_type` built from this module's settings and what it resolved
        (class names, a tokenizer's hash). Called once, when the first stream is made."""
        raise NotImplementedError(f"{type(self).__name__} must define make_task()")

    @cached_property
    def task(self) -> Task:
        """The task the streams decode and collate with (`make_task`'s, built once)."""
        task = self.make_task()
        if not isinstance(task, self.task_type):
            raise TypeError(f"{type(self).__name__}.make_task must return a {self.task_type.__name__}")
        return task

    def prepare_missing(self) -> None:
        """Write this data module's data if it is missing (the image task builds its demo): called once,
        before the first shard index is read."""

    # -- shards ---------------------------------------------------------------------------------------

    def index(self, split: str) -> ShardIndex:
        """The resolved shards of a split (read once)."""
        if not self._prepared:
            self._prepared = True
            self.prepare_missing()
        if split not in self._indexes:
            spec = self.specs[split]
            if spec is None:
                raise UserError(f"no {split} data configured: set data.root or data.{split}")
            if split == "predict" and is_plain_folder(spec):
                spec = pack_folder(spec, self.task_type.predict_files)
            self._indexes[split] = self.resolve_split(split, spec)
        return self._indexes[split]

    def shards(self, split: str) -> list[Shard]:
        """The shards a split reads, with the counts it reads: training keeps `fraction` of each shard."""
        shards = self.index(split).shards
        if split != "train" or self.fraction == 1:
            return shards
        counts = fraction_counts([shard.nsamples for shard in shards], self.fraction)
        return [replace(shard, nsamples=count) for shard, count in zip(shards, counts, strict=True) if count]

    # -- loaders --------------------------------------------------------------------------------------

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

    def stream(self, split: str) -> ShardStream:
        """The ShardStream of a split, planned for this trainer's ranks."""
        stream = ShardStream(
            shards=self.shards(split),
            task=self.task,
            stage=split,
            batch_size=self.batch_size,
            seed=self.seed,
            shuffle_buffer=self.shuffle_buffer,
            num_workers=self.num_workers,
            skip_corrupt=True,
            cache_dir=self.cache_dir,
            cache_bytes=self.cache_bytes,
            read_ahead_bytes=self.read_ahead_bytes,
            bucket_by_size=self.bucket_by_size and split == "train",
            max_member_bytes=self.max_member_bytes,
            max_compression_ratio=self.max_compression_ratio,
            mix_shards=self.mix_shards or (1 if shuffled_before_sharding(self.index(split)) else MIX_SHARDS),
            decode_threads=self.decode_threads,
        )
        if self.trainer is not None:
            stream.set_topology(self.trainer.world_size, self.trainer.global_rank)
        return stream

    def loader(self, split: str) -> EpochLoader:
        """The DataLoader of a split (a fresh one each call: its workers pick up the new epoch)."""
        workers = self.num_workers
        self._loaders[split] = EpochLoader(
            self.stream(split),
            position=self.position,
            trainer=self.trainer,
            worker_start=self.worker_start,
            num_workers=workers,
            pin_memory=self.pin_memory,
            prefetch_factor=self.prefetch_factor if workers > 0 else None,
            persistent_workers=False,  # persistent workers would keep the old epoch's plan
        )
        return self._loaders[split]

    def train_dataloader(self) -> EpochLoader:
        return self.loader("train")

    def val_dataloader(self) -> EpochLoader:
        return self.loader("val")

    def test_dataloader(self) -> EpochLoader:
        return self.loader("test")

    def predict_dataloader(self) -> EpochLoader:
        return self.loader("predict")

    def state_dict(self) -> dict[str, Any]:
        loader = self._loaders.get("train")
        position = self.position.current(self.trainer, loader.dataset if loader is not None else None)
        return {"train_position": position} if position else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position.restore(state.get("train_position"))

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Count the samples the stream skipped, warn at a bounded rate, stop past the limit."""
        if isinstance(batch, Batch) and batch.skipped:  # not a Batch: the model summary's example input
            self.record_skipped(batch.skipped)
        return batch

    def record_skipped(self, skipped: list[Skipped]) -> None:
        """Count skipped samples in this pass's ledger (a task that drops samples later calls it too)."""
        if self.trainer is not None:
            self.skips.record(skipped, self.trainer, self.split_samples)

    def split_samples(self, split: str) -> int:
        """The samples a split reads in a pass, over all ranks."""
        return sum(shard.nsamples for shard in self.shards(split))

    def __repr__(self) -> str:
        """Its class and splits (redacted), and nothing more: Lightning's `__str__` builds every dataloader,
        which resolves every split (jsonargparse's links call it for a debug line)."""
        specs = ", ".join(f"{split}={redact_value(spec)!r}" for split, spec in self.specs.items() if spec is not None)
        return f"{type(self).__name__}({specs})"

    __str__ = __repr__
