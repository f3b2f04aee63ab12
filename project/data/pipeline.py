"""Run one worker's epoch plan: open shards, skip to offsets, group tar members by key, shuffle encoded
samples in a bounded buffer, decode safely, transform and batch.

webdataset supplies the tar reading (`tar_file_iterator`) and URL opening (`gopen`); the epoch plan
replaces its node and worker splitters, whose shard-level split cannot give equal batches per rank.
"""

from __future__ import annotations

import random
import re
import tarfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import IO

import torch
from torch.utils.data import IterableDataset, get_worker_info
from webdataset.gopen import gopen
from webdataset.tariterators import base_plus_ext

from project.data.decode import WANTED_EXTENSIONS, decode_sample
from project.data.plan import WorkerPlan, eval_plan, total_batches, train_plan
from project.data.shards import Shard, local_path
from project.data.transforms import to_uint8_tensor
from project.errors import ShardError

META_MEMBER = re.compile(r"__[^/]*__($|/)")  # webdataset's rule for metadata members
Batch = dict  # {"image": uint8 [B, 3, H, W], "label": int64 [B], "key": list[str]}


def read_samples(
    url: str, start: int = 0, stop: int | None = None, extensions: frozenset[str] = WANTED_EXTENSIONS
) -> Iterator[dict]:
    """Samples [start, stop) of one shard, as {"__key__", "__url__", ext: bytes} for wanted extensions.

    Members of skipped samples and of unwanted extensions are never read into memory, and reading
    stops once sample `stop - 1` is complete. (webdataset's `tar_file_iterator` hides the members it
    does not select, so keys could not be counted past them without reading them.)
    """
    try:
        stream = gopen(local_path(url), "rb")
    except OSError as error:
        raise ShardError(f"cannot open shard {url}: {error.strerror or error}") from None
    last_key, position, current = None, -1, None
    try:
        for name, read in _members(stream, url):
            key, extension = base_plus_ext(name)
            if key is None:
                continue
            if key != last_key:
                if current is not None:
                    yield current
                last_key, position, current = key, position + 1, None
                if stop is not None and position >= stop:
                    return
                if position >= start:
                    current = {"__key__": key, "__url__": url}
            if current is not None and extension.lower() in extensions:
                current[extension.lower()] = read()
        if current is not None:
            yield current
    finally:
        stream.close()


def _members(stream: IO[bytes], url: str) -> Iterator[tuple[str, Callable[[], bytes]]]:
    """(name, read) for each regular member, in tar order; `read` must be called before moving on."""
    try:
        with tarfile.open(fileobj=stream, mode="r|*") as tar:
            for info in tar:
                if info.isreg() and not META_MEMBER.match(info.name):
                    yield info.name, lambda info=info: tar.extractfile(info).read()
                tar.members = []  # streaming mode keeps every TarInfo otherwise: memory grows with the shard
    except (tarfile.TarError, EOFError, zlib.error, OSError) as error:
        raise ShardError(f"cannot read shard {url}: {error}") from None


def shuffled(samples: Iterator[dict], buffer_size: int, rng: random.Random) -> Iterator[dict]:
    """Shuffle encoded samples in chunks of `buffer_size`: memory is bounded by the buffer.

    Encoded bytes, not decoded images: decoded images are ~10x larger, so the buffer would hold 10x
    fewer samples. Whole chunks (not a reservoir) keep the order a pure function of the chunk, which
    lets a resumed epoch skip whole chunks.
    """
    buffer: list[dict] = []
    for sample in samples:
        buffer.append(sample)
        if len(buffer) >= buffer_size:
            rng.shuffle(buffer)
            yield from buffer
            buffer = []
    rng.shuffle(buffer)
    yield from buffer


class ShardStream(IterableDataset):
    """An IterableDataset over shards that yields ready batches, planned per (epoch, rank, worker).

    Args:
        shards: the split's shards with their sample counts.
        train: shuffle and drop the last partial batches (training) or read every sample once, in order.
        batch_size: samples per batch on each device.
        transform: per-sample transform on a uint8 CHW tensor.
        classes: class names, to map `.txt`/`.json` labels that are names.
        seed: seed of the shard order and the shuffle buffer.
        shuffle_buffer: samples held (encoded) in the shuffle buffer.
        decode_size: decode JPEGs at reduced scale down to about this size.
        num_workers: the DataLoader's worker count (the plan is split across max(1, num_workers)).
    """

    def __init__(
        self,
        shards: Sequence[Shard],
        *,
        train: bool,
        batch_size: int,
        transform: Callable[[torch.Tensor], torch.Tensor],
        classes: Sequence[str] | None = None,
        seed: int = 0,
        shuffle_buffer: int = 1000,
        decode_size: int | None = None,
        num_workers: int = 0,
    ) -> None:
        self.shards = list(shards)
        self.train = train
        self.batch_size = batch_size
        self.transform = transform
        self.classes = list(classes) if classes is not None else None
        self.seed = seed
        self.shuffle_buffer = shuffle_buffer
        self.decode_size = decode_size
        self.num_workers = max(1, num_workers)
        self.epoch = 0
        self.world_size, self.rank = 1, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def set_topology(self, world_size: int, rank: int) -> None:
        self.world_size, self.rank = world_size, rank

    def plans(self) -> list[WorkerPlan]:
        """This rank's plan for the current epoch, one entry per DataLoader worker."""
        counts = [shard.nsamples for shard in self.shards]
        common = dict(world_size=self.world_size, rank=self.rank, num_workers=self.num_workers)
        if self.train:
            return train_plan(counts, epoch=self.epoch, seed=self.seed, batch_size=self.batch_size, **common)
        return eval_plan(counts, batch_size=self.batch_size, **common)

    def __len__(self) -> int:
        return total_batches(self.plans())

    def __iter__(self) -> Iterator[Batch]:
        info = get_worker_info()
        worker = info.id if info is not None else 0
        if (info.num_workers if info is not None else 1) != self.num_workers:
            raise RuntimeError(
                f"ShardStream planned for {self.num_workers} workers, runs in a different count"
            )
        plan = self.plans()[worker]
        if info is not None and plan.shuffle_seed is not None:
            # augmentation randomness from the plan, not the process: reproducible per (epoch, rank, worker)
            torch.manual_seed(plan.shuffle_seed)
        samples = self._encoded(plan)
        if plan.shuffle_seed is not None:
            samples = shuffled(samples, self.shuffle_buffer, random.Random(plan.shuffle_seed))
        sizes = iter(plan.batch_sizes)
        size, batch = next(sizes, 0), []
        for sample in samples:
            image, label = decode_sample(sample, self.decode_size, self.classes)
            batch.append((self.transform(to_uint8_tensor(image)), label, sample["__key__"]))
            if len(batch) == size:
                yield collate(batch)
                size, batch = next(sizes, 0), []

    def _encoded(self, plan: WorkerPlan) -> Iterator[dict]:
        for segment in plan.segments:
            shard = self.shards[segment.shard]
            seen = 0
            for sample in read_samples(shard.url, segment.start, segment.stop):
                seen += 1
                yield sample
            if seen != len(segment):
                raise ShardError(
                    f"shard {shard.url} holds {segment.start + seen} samples, but its shard index says "
                    f"{shard.nsamples}: the index is stale, rebuild it with python -m project.data.index"
                )


def collate(batch: list[tuple[torch.Tensor, int, str]]) -> Batch:
    images, labels, keys = zip(*batch, strict=True)
    return {"image": torch.stack(images), "label": torch.tensor(labels, dtype=torch.long), "key": list(keys)}
