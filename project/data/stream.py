"""Run one DataLoader worker's epoch plan: read its parts into encoded samples (reading.py), shuffle them in a
bounded buffer, then hand them to the task to decode and collate.

The stream knows no task: what a member means (an image, a label, a text) is the task's `decode`, and how
examples become a batch its `collate`. The stream only guarantees that batch `n` of a worker's plan holds
exactly the samples the plan put there, in the same order and with the same augmentation on every run:
what exact resume, equal batches per rank and exactly-once evaluation rest on. The epoch plan replaces
webdataset's node and worker splitters, whose shard-level split cannot give equal batches per rank.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from project.data.batch import Batch, Skipped
from project.data.decode_threads import BatchRandom, ordered_map
from project.data.plan import (
    Part,
    WorkerPlan,
    eval_plan,
    resume_point,
    skip_samples,
    total_batches,
    train_plan,
)
from project.data.prefetch import READ_AHEAD_BYTES
from project.data.reading import Missing, PartReader
from project.data.samples import MAX_MEMBER_BYTES, REFUSED, Sample
from project.data.shard_index import Shard, ShardOpen
from project.data.tarreader import MAX_COMPRESSION_RATIO
from project.data.task import Task
from project.errors import DecodeError, ShardError, is_interrupt

STAGES = ("train", "val", "test", "predict")


def shuffled(
    samples: Iterator, buffer_size: int, seed: int, first_chunk: int = 0, bucket: int | None = None
) -> Iterator:
    """Shuffle encoded samples in chunks of `buffer_size`: memory is bounded by the buffer.

    Encoded bytes, not decoded examples: a decoded image is ~10x larger, so the buffer would hold 10x
    fewer samples. Each chunk's order depends only on (seed, chunk number), so a resumed epoch can skip
    whole chunks without reading them and still shuffle the next one as the uninterrupted run did.

    With `bucket` (the batch size), each shuffled chunk is then cut into groups of `bucket` samples of
    similar size (bytes, members together) and the groups come in a seeded random order: batches of
    texts or audio of similar length pad less. The order is still a function of the chunk and the seed.
    """
    chunk = first_chunk
    while buffer := list(itertools.islice(samples, buffer_size)):
        generator = np.random.default_rng([seed, chunk])
        order = generator.permutation(len(buffer))
        if bucket is not None and bucket > 1:
            order = order[np.argsort([sample_bytes(buffer[i]) for i in order], kind="stable")]
            groups = [order[start : start + bucket] for start in range(0, len(order), bucket)]
            order = np.concatenate([groups[g] for g in generator.permutation(len(groups))])
        for i in order.tolist():
            # let go of each sample as it leaves, and of the chunk before the next is read: the buffer's
            # memory is then reused, never held twice (a fresh worker's new pages cost it CPU to zero)
            sample, buffer[i] = buffer[i], None
            yield sample
        del buffer, sample
        chunk += 1


def batch_seed(shuffle_seed: int, number: int) -> int:
    """The seed of torch's generator for batch `number` of a plan whose shuffle seed is `shuffle_seed`."""
    return int(np.random.SeedSequence([shuffle_seed, number]).generate_state(1)[0])


def sample_bytes(sample: Sample | Missing) -> int:
    """About the encoded size of a sample's members (0 for a sample that could not be read)."""
    if isinstance(sample, Missing):
        return 0
    return sum(map(len, sample.values()))  # the key and url strings count too: the same few bytes for all


class ShardStream(IterableDataset):
    """An IterableDataset over shards that yields ready batches, planned per (epoch, rank, worker).

    Args:
        shards: the split's shards with their sample counts.
        task: decodes samples and collates examples (project/data/task.py): it is pickled into each DataLoader
            worker, the stream's one part that is the task's.
        stage: train (shuffle, and drop the last partial batches), or val, test or predict (every sample
            exactly once, in index order).
        batch_size: samples per batch on each device.
        seed: seed of the shard order, the shuffle buffer and the per-batch augmentation.
        shuffle_buffer: samples held (encoded) in the shuffle buffer.
        num_workers: the DataLoader's worker count (the plan is split across max(1, num_workers)).
        skip_corrupt: leave out unreadable samples (listed in each batch's `skipped`) instead of raising.
        cache_dir: keep local copies of remote shards here (None: stream them without a copy).
        cache_bytes: the most the cache folder may hold; least recently used copies go first.
        bucket_by_size: training batches of samples of similar encoded size, from within the shuffle
            buffer (see `shuffled`): less padding for texts of varied lengths.
        max_member_bytes: a sample with a member that declares more bytes is skipped, that member unread.
        max_compression_ratio: a compressed shard stops, as an unreadable shard, past this many bytes decompressed
            per compressed byte read (a decompression bomb).
        read_ahead_bytes: bytes of remote shards fetched ahead of the reader in the plan's order, the next
            shard requested while one is read (see prefetch.py); 0: each opened when it is read.
        mix_shards: training reads the epoch's shards in groups of up to this many, interleaved sample by
            sample (see `plan.Mix`), so batches mix them even when each shard holds one class; 1: one shard
            after another.
        decode_threads: batches decoded at once by threads of each loader process (decode_threads.py): the
            same batches as one thread's.
    """

    def __init__(
        self,
        *,
        shards: Sequence[Shard],
        task: Task,
        stage: str,
        batch_size: int,
        seed: int = 0,
        shuffle_buffer: int = 1000,
        num_workers: int = 0,
        skip_corrupt: bool = False,
        cache_dir: str | None = None,
        cache_bytes: int | None = None,
        bucket_by_size: bool = False,
        max_member_bytes: int | None = MAX_MEMBER_BYTES,
        read_ahead_bytes: int = READ_AHEAD_BYTES,
        mix_shards: int = 1,
        decode_threads: int = 1,
        max_compression_ratio: float | None = MAX_COMPRESSION_RATIO,
    ) -> None:
        if stage not in STAGES:
            raise ValueError(f"stage must be one of {', '.join(STAGES)}, got {stage!r}")
        self.shards = list(shards)
        self.task = task
        self.stage = stage
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle_buffer = shuffle_buffer
        self.num_workers = max(1, num_workers)
        self.skip_corrupt = skip_corrupt
        self.bucket_by_size = bucket_by_size
        self.max_member_bytes, self.read_ahead_bytes = max_member_bytes, read_ahead_bytes
        self.mix_shards, self.decode_threads = mix_shards, decode_threads
        self.max_compression_ratio = max_compression_ratio
        self.open_stream = ShardOpen(self.shards, cache_dir, cache_bytes)  # a remote shard stops past its filesize
        self.epoch = 0
        self.world_size, self.rank = 1, 0
        self.batches_done = 0

    @property
    def train(self) -> bool:
        return self.stage == "train"

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def set_topology(self, world_size: int, rank: int) -> None:
        self.world_size, self.rank = world_size, rank

    def plans(self) -> list[WorkerPlan]:
        """This rank's plan for the current epoch, one entry per DataLoader worker."""
        counts = [shard.nsamples for shard in self.shards]
        common = dict(world_size=self.world_size, rank=self.rank, num_workers=self.num_workers)
        if self.train:
            mixing = dict(seed=self.seed, mix_shards=self.mix_shards)
            return train_plan(counts, epoch=self.epoch, batch_size=self.batch_size, **mixing, **common)
        return eval_plan(counts, batch_size=self.batch_size, **common)

    def __len__(self) -> int:
        return total_batches(self.plans())

    def planned_samples(self) -> int:
        """Samples this rank reads in the current epoch (skipped ones included)."""
        return sum(plan.nsamples for plan in self.plans())

    def resume_after(self, batches_done: int) -> None:
        """Start the next pass at batch `batches_done` of the epoch, as if those had just been read."""
        self.batches_done = batches_done

    def __iter__(self) -> Iterator[Batch]:
        info = get_worker_info()
        worker = info.id if info is not None else 0
        if (info.num_workers if info is not None else 1) != self.num_workers:
            raise RuntimeError(f"ShardStream planned for {self.num_workers} workers, runs in a different count")
        plans = self.plans()
        index, done = resume_point(self.batches_done, len(plans), worker)
        plan = plans[index]
        batches = enumerate(self._sample_batches(plan, done), start=done)
        if self.decode_threads <= 1 or not self.task.thread_safe:
            for number, samples in batches:
                yield self._batch(samples, plan, number)
            return
        # decode in the threads; collate here, where torch's default generator is this thread's alone
        decode = functools.partial(self._threaded_examples, plan=plan)
        for random, decoded in ordered_map(decode, batches, self.decode_threads):
            with random.continued():
                batch = self._collated(*decoded)
            yield batch

    def _sample_batches(self, plan: WorkerPlan, done: int) -> Iterator[list]:
        """The plan's encoded samples, grouped into its batches, from batch `done` on."""
        start = plan.batch_sizes[:done].total
        if plan.shuffle_seed is None:
            samples = self._encoded(skip_samples(plan.parts, start))
        else:
            chunk, offset = divmod(start, self.shuffle_buffer)
            samples = self._encoded(skip_samples(plan.parts, chunk * self.shuffle_buffer))
            bucket = self.batch_size if self.bucket_by_size else None
            samples = shuffled(samples, self.shuffle_buffer, plan.shuffle_seed, first_chunk=chunk, bucket=bucket)
            samples = itertools.islice(samples, offset, None)
        for size in plan.batch_sizes[done:]:
            yield list(itertools.islice(samples, size))

    def _batch(self, samples: list, plan: WorkerPlan, number: int) -> Batch:
        """Decode and collate one batch through the task; samples it cannot use are left out and listed."""
        with torch.random.fork_rng(devices=[]):
            if plan.shuffle_seed is not None:
                # augmentation randomness from (seed, epoch, rank, worker, batch): the same on resume
                # the CPU generator only: torch.manual_seed also queues CUDA seeding, with a Python stack
                # formatted each call (about 100 us, a tenth of a short-text batch's time)
                torch.default_generator.manual_seed(batch_seed(plan.shuffle_seed, number))
            return self._collated(*self._examples(samples))

    def _threaded_examples(self, job: tuple[int, list], plan: WorkerPlan) -> tuple[BatchRandom, tuple]:
        """In a decode thread: a batch's examples, its draws from a generator of its own (decode_threads.py)."""
        number, samples = job
        random = BatchRandom(0 if plan.shuffle_seed is None else batch_seed(plan.shuffle_seed, number))
        with random.current():
            return random, self._examples(samples)

    def _examples(self, samples: list) -> tuple[list, list[str], list[str], list[Skipped]]:
        """The task's examples of the samples it can use, their keys and urls, and the others listed as skipped."""
        examples, keys, urls, skipped = [], [], [], []
        for sample in samples:
            if isinstance(sample, Missing):
                skipped.append(Skipped(sample.url, f"sample {sample.position}", sample.reason))
                continue
            try:
                if REFUSED in sample:
                    raise DecodeError.of(sample, sample[REFUSED])
                examples.append(self.task.decode(sample, self.stage))
            except BaseException as error:  # noqa: BLE001 - a stranger's sample may break decode in any way
                if is_interrupt(error):  # a Rust panic (a BaseException) is the sample's; Ctrl-C is not
                    raise
                if not isinstance(error, DecodeError):  # a TypeError of a .json, a MemoryError of a .npy
                    error = DecodeError.of(sample, f"{type(error).__name__}: {error}")
                if not self.skip_corrupt:
                    raise error from None
                skipped.append(Skipped(sample["__url__"], sample["__key__"], str(error)))
                continue
            keys.append(sample["__key__"])
            urls.append(sample["__url__"])
        if not examples:
            first = skipped[0]  # a stale index's reason does not name the shard
            where = "" if first.url in first.reason else f" (in {first.url})"
            raise ShardError(f"every sample of a batch was unreadable; the first{where}: {first.reason}")
        return examples, keys, urls, skipped

    def _collated(self, examples: list, keys: list[str], urls: list[str], skipped: list[Skipped]) -> Batch:
        """The task's batch of the examples, with their keys and urls and the samples skipped."""
        batch = self.task.collate(examples, self.stage)
        if not isinstance(batch, Batch):
            raise TypeError(f"{type(self.task).__name__}.collate must return a Batch, not {type(batch).__name__}")
        batch.keys, batch.urls, batch.skipped = keys, urls, skipped
        return batch

    def _encoded(self, parts: Sequence[Part]) -> Iterator[Sample | Missing]:
        """Each part's samples in order (see `PartReader`)."""
        limits = dict(
            max_member_bytes=self.max_member_bytes, skip_corrupt=self.skip_corrupt, max_ratio=self.max_compression_ratio
        )
        reader = PartReader(
            self.shards, self.task.extensions, self.open_stream, read_ahead_bytes=self.read_ahead_bytes, **limits
        )
        return reader.read(parts)
