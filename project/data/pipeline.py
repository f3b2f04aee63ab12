"""Run one worker's epoch plan: open shards, skip to offsets, group tar members by key, shuffle encoded
samples in a bounded buffer, decode safely, transform and batch.

Tar members are grouped into samples by webdataset's key rule (`base_plus_ext`); urls open through
`project.data.remote` (no shell for plain urls). The epoch plan replaces webdataset's node and worker
splitters, whose shard-level split cannot give equal batches per rank.
"""

from __future__ import annotations

import functools
import itertools
import re
import tarfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Literal

import numpy as np
import torch
from PIL import Image
from torch.utils.data import IterableDataset, get_worker_info
from torchvision.transforms import v2
from webdataset.tariterators import base_plus_ext

from project.data.decode import WANTED_EXTENSIONS, DecodeError, decode_sample
from project.data.device_decode import collate_deferred, deferred_jpeg
from project.data.plan import (
    Segment,
    WorkerPlan,
    eval_plan,
    resume_point,
    skip_samples,
    total_batches,
    train_plan,
)
from project.data.remote import open_url
from project.data.shards import Shard
from project.data.tarreader import tar_members
from project.data.transforms import to_uint8_tensor
from project.errors import ShardError

READ_ERRORS = (tarfile.TarError, EOFError, zlib.error, OSError)
META_MEMBER = re.compile(r"__[^/]*__($|/)")  # webdataset's rule for metadata members
# {"image": uint8 [B, 3, H, W], "label": int64 [B], "key": [str], "skipped": [(shard url, key, reason)]}
Batch = dict


def read_samples(
    url: str,
    start: int = 0,
    stop: int | None = None,
    extensions: frozenset[str] = WANTED_EXTENSIONS,
    open_stream: Callable[[str], IO[bytes]] = open_url,
) -> Iterator[dict]:
    """Samples [start, stop) of one shard, as {"__key__", "__url__", ext: bytes} for wanted extensions.

    Members of skipped samples and of unwanted extensions are never read into memory, and reading
    stops once sample `stop - 1` is complete. (webdataset's `tar_file_iterator` hides the members it
    does not select, so keys could not be counted past them without reading them.)
    """
    try:
        stream = open_stream(url)
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
                try:
                    current[extension.lower()] = read()
                except READ_ERRORS as error:
                    raise ShardError(f"cannot read shard {url}: {error}") from None
        if current is not None:
            yield current
    finally:
        stream.close()


def _members(stream: IO[bytes], url: str) -> Iterator[tuple[str, Callable[[], bytes]]]:
    """(name, read) for each regular member, in tar order; `read` must be called before moving on."""
    try:
        for name, read in tar_members(stream):
            if not META_MEMBER.match(name):
                yield name, read
    except READ_ERRORS as error:
        raise ShardError(f"cannot read shard {url}: {error}") from None


@dataclass(frozen=True)
class Missing:
    """A placeholder for a sample that could not be read (a truncated or unreadable shard).

    It keeps its place in the stream, so batches, ranks and resumed epochs stay aligned with the plan.
    """

    url: str
    position: int
    reason: str


def shuffled(samples: Iterator, buffer_size: int, seed: int, first_chunk: int = 0) -> Iterator:
    """Shuffle encoded samples in chunks of `buffer_size`: memory is bounded by the buffer.

    Encoded bytes, not decoded images: decoded images are ~10x larger, so the buffer would hold 10x
    fewer samples. Each chunk's order depends only on (seed, chunk number), so a resumed epoch can skip
    whole chunks without reading them and still shuffle the next one as the uninterrupted run did.
    """
    chunk = first_chunk
    while buffer := list(itertools.islice(samples, buffer_size)):
        order = np.random.default_rng([seed, chunk]).permutation(len(buffer))
        yield from (buffer[i] for i in order)
        chunk += 1


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
        decode_on: "cpu" decodes every image here; "device" passes JPEGs on encoded, for
            `project.data.device_decode.DeviceDecoder` to decode on the training device.
        num_workers: the DataLoader's worker count (the plan is split across max(1, num_workers)).
        skip_corrupt: leave out unreadable samples (reported in each batch's "skipped") instead of
            raising a `ShardError`.
        cache_dir: keep local copies of remote shards here (None: stream them without a copy).
        cache_bytes: the most the cache folder may hold; least recently used copies go first.
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
        decode_on: Literal["cpu", "device"] = "cpu",
        num_workers: int = 0,
        skip_corrupt: bool = False,
        cache_dir: str | None = None,
        cache_bytes: int | None = None,
    ) -> None:
        self.shards = list(shards)
        self.train = train
        self.batch_size = batch_size
        self.transform = transform
        self.classes = list(classes) if classes is not None else None
        self.seed = seed
        self.shuffle_buffer = shuffle_buffer
        self.decode_size = decode_size
        self.decode_on = decode_on
        self.num_workers = max(1, num_workers)
        self.skip_corrupt = skip_corrupt
        self.open_stream = functools.partial(open_url, cache_dir=cache_dir, cache_bytes=cache_bytes)
        self.epoch = 0
        self.world_size, self.rank = 1, 0
        self.batches_done = 0

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
        for number, samples in enumerate(self._sample_batches(plan, done), start=done):
            yield self._batch(samples, plan, number)

    def _sample_batches(self, plan: WorkerPlan, done: int) -> Iterator[list]:
        """The plan's encoded samples, grouped into its batches, from batch `done` on."""
        start = sum(plan.batch_sizes[:done])
        if plan.shuffle_seed is None:
            samples = self._encoded(skip_samples(plan.segments, start))
        else:
            chunk, offset = divmod(start, self.shuffle_buffer)
            samples = self._encoded(skip_samples(plan.segments, chunk * self.shuffle_buffer))
            samples = shuffled(samples, self.shuffle_buffer, plan.shuffle_seed, first_chunk=chunk)
            samples = itertools.islice(samples, offset, None)
        for size in plan.batch_sizes[done:]:
            yield list(itertools.islice(samples, size))

    def _batch(self, samples: list, plan: WorkerPlan, number: int) -> Batch:
        """Decode and transform one batch; unreadable samples are left out and reported in the batch."""
        items, deferred, skipped = [], [], []
        augment_seed = None
        if plan.shuffle_seed is not None:
            # augmentation randomness from (seed, epoch, rank, worker, batch): the same on resume
            augment_seed = int(np.random.SeedSequence([plan.shuffle_seed, number]).generate_state(1)[0])
        with torch.random.fork_rng(devices=[]):
            if augment_seed is not None:
                torch.manual_seed(augment_seed)
            for sample in samples:
                if isinstance(sample, Missing):
                    skipped.append((sample.url, f"sample {sample.position}", sample.reason))
                    continue
                try:
                    jpeg = deferred_jpeg(sample, self.classes) if self.decode_on == "device" else None
                    if jpeg is not None:
                        deferred.append(jpeg)
                        continue
                    image, label = decode_sample(sample, self.decode_size, self.classes)
                except DecodeError as error:
                    if not self.skip_corrupt:
                        raise
                    skipped.append((sample["__url__"], sample["__key__"], str(error)))
                    continue
                items.append((pixels(image), label, sample["__key__"]))
            images = transform_all(self.transform, [image for image, _, _ in items]) if items else None
        labels, keys = [label for _, label, _ in items], [key for _, _, key in items]
        if deferred:
            return collate_deferred(images, labels, keys, deferred, skipped, augment_seed)
        if not items:
            raise ShardError(f"every sample of a batch was unreadable; the first: {skipped[0][2]}")
        return collate(images, labels, keys, skipped)

    def _encoded(self, segments: Sequence[Segment]) -> Iterator[dict | Missing]:
        """Each segment's samples in order: exactly len(segment) items, `Missing` for unreadable ones."""
        for segment in segments:
            shard = self.shards[segment.shard]
            seen, reason = 0, ""
            try:
                for sample in read_samples(shard.url, segment.start, segment.stop, open_stream=self.open_stream):
                    seen += 1
                    yield sample
            except ShardError as error:
                if not self.skip_corrupt:
                    raise
                reason = str(error)
            if seen != len(segment) and not reason:
                reason = f"holds {segment.start + seen} samples, but its shard index says {shard.nsamples}"
                if not self.skip_corrupt:
                    raise ShardError(f"shard {shard.url} {reason}: the index is stale, rebuild it")
            for position in range(segment.start + seen, segment.stop):
                yield Missing(shard.url, position, reason)


def pixels(image: Image.Image | np.ndarray | torch.Tensor) -> torch.Tensor:
    """A decoded image as a uint8 CHW tensor (a view of an HWC array: the batch copy makes it contiguous)."""
    if isinstance(image, torch.Tensor):
        return image  # already CHW uint8 (decode_jpeg_pixels)
    if isinstance(image, Image.Image) and image.mode == "RGB":
        return torch.from_numpy(np.array(image)).permute(2, 0, 1)  # 3x less than pil_to_tensor for small images
    return to_uint8_tensor(image)


def transform_all(transform: Callable[[torch.Tensor], torch.Tensor], images: list[torch.Tensor]) -> torch.Tensor:
    """The batch of transformed images: `transform` applied to each image, or once to the stacked batch
    when it is deterministic (resize and center crop) and the images share a size."""
    steps = transform.transforms if isinstance(transform, v2.Compose) else [transform]
    deterministic = all(isinstance(step, (v2.Resize, v2.CenterCrop)) for step in steps)
    if len(images) > 1 and deterministic and len({image.shape for image in images}) == 1:
        return transform(torch.stack(images)).contiguous()
    return torch.stack([transform(image) for image in images])


def collate(
    images: torch.Tensor, labels: list[int], keys: list[str], skipped: Sequence[tuple[str, str, str]] = ()
) -> Batch:
    """A batch; `skipped` lists (shard url, key, reason) of the samples left out of it."""
    return {
        "image": images,
        "label": torch.tensor(labels, dtype=torch.long),
        "key": list(keys),
        "skipped": list(skipped),
    }
