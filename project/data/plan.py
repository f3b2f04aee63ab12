"""The epoch plan: which samples each rank and DataLoader worker reads this epoch, and from where.

A pure function of (shard sizes, epoch, seed, world size, rank, workers, batch size): no torch, no I/O.
Every guarantee of the data path is decided here, so each is testable without processes:

- training: the shard order is shuffled anew each epoch (from seed and epoch) and cut into groups of up to
  `mix_shards` shards; a group's samples are interleaved (see `Mix`), and the groups laid end to end make
  one stream of samples. Each rank takes an equal, contiguous run of whole batches from it, and each worker
  an equal (±1 batch) run of the rank's: a run of a group reads a slice of each of its shards, so every
  worker's batches mix the group's shards even when each shard holds one class. Ranks and workers may start
  and stop mid-shard. Fewer than world_size × batch_size samples are dropped, and no sample is read twice.
- evaluation: the shards in index order, split so that every sample is read exactly once in total and
  every rank runs the same number of batches (of up to batch_size samples). Equal counts matter: under
  DDP, each validation forward during fit broadcasts module buffers, so a rank with one batch more
  would wait forever for the others.
- data fractions: a training subset with an exact sample count, the same for any seed and nested across
  fractions (see `fraction_counts`); the plans above then run on the subset's counts.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from project.data.parts import Mix, Part, Segment
from project.errors import UserError


@dataclass(frozen=True)
class BatchSizes(Sequence):
    """The sizes of `number` batches, the first `larger` of them holding `size + 1` samples and the rest `size`,
    without a list of them: memory stays the same whatever the number an index declares."""

    number: int
    size: int
    larger: int = 0

    def __len__(self) -> int:
        return self.number

    def __getitem__(self, item: int | slice) -> int | BatchSizes:
        if isinstance(item, slice):
            start, stop, step = item.indices(self.number)
            if step != 1:
                raise ValueError("batch sizes are sliced with step 1 only")
            stop = max(start, stop)
            return BatchSizes(stop - start, self.size, max(0, min(stop, self.larger) - start))
        index = item + self.number if item < 0 else item
        if not 0 <= index < self.number:
            raise IndexError(item)
        return self.size + (index < self.larger)

    def __iter__(self) -> Iterator[int]:
        rest = self.number - self.larger
        return itertools.chain(itertools.repeat(self.size + 1, self.larger), itertools.repeat(self.size, rest))

    @property
    def total(self) -> int:
        return self.number * self.size + self.larger


@dataclass(frozen=True)
class WorkerPlan:
    """What one DataLoader worker of one rank reads this epoch, in order, and how it batches it."""

    parts: tuple[Part, ...]
    batch_sizes: BatchSizes  # the worker's batches, in order; they add up to its samples
    shuffle_seed: int | None  # None: keep the stored order (evaluation)

    @property
    def segments(self) -> tuple[Segment, ...]:
        """Every shard slice the plan reads (a mixed group's as one per shard), without empty ones."""
        return tuple(segment for part in self.parts for segment in part.segments() if len(segment))

    @property
    def nsamples(self) -> int:
        return sum(len(part) for part in self.parts)

    @property
    def nbatches(self) -> int:
        return len(self.batch_sizes)


def split_evenly(total: int, parts: int) -> list[tuple[int, int]]:
    """Split range(total) into `parts` contiguous ranges whose sizes differ by at most one."""
    size, extra = divmod(total, parts)
    bounds, start = [], 0
    for part in range(parts):
        stop = start + size + (1 if part < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def shard_order(nshards: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The order shards are read in: a fresh permutation each epoch, reproducible from (seed, epoch)."""
    if not shuffle:
        return list(range(nshards))
    return np.random.default_rng([seed, epoch]).permutation(nshards).tolist()


def slice_stream(counts: Sequence[int], order: Sequence[int], begin: int, end: int) -> tuple[Segment, ...]:
    """Segments covering positions [begin, end) of the stream made by reading shards in `order`, one by one."""
    return slice_groups(counts, [(shard,) for shard in order], [0] * len(order), begin, end)


def slice_groups(
    counts: Sequence[int], groups: Sequence[Sequence[int]], seeds: Sequence[int], begin: int, end: int
) -> tuple[Part, ...]:
    """The parts covering positions [begin, end) of the stream made by the groups' merged orders end to end
    (a group of one shard is a plain `Segment`: its merged order is the shard's own)."""
    parts, position = [], 0
    for group, seed in zip(groups, seeds, strict=True):
        size = sum(counts[shard] for shard in group)
        low, high = max(begin, position), min(end, position + size)
        if low < high:
            if len(group) == 1:
                parts.append(Segment(group[0], low - position, high - position))
            else:
                group_counts = tuple(counts[shard] for shard in group)
                parts.append(Mix(tuple(group), group_counts, seed, low - position, high - position))
        position += size
        if position >= end:
            break
    return tuple(parts)


def _check(counts: Sequence[int], world_size: int, rank: int, num_workers: int, batch_size: int) -> int:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world size {world_size}")
    if num_workers < 1 or batch_size < 1:
        raise ValueError(f"num_workers ({num_workers}) and batch_size ({batch_size}) must be at least 1")
    if any(count < 0 for count in counts):
        raise ValueError("shard sizes must not be negative")
    return sum(counts)


def train_plan(
    counts: Sequence[int],
    *,
    epoch: int,
    seed: int,
    world_size: int,
    rank: int,
    num_workers: int,
    batch_size: int,
    mix_shards: int = 1,
) -> list[WorkerPlan]:
    """One plan per worker of `rank` for a training epoch; every rank gets the same number of batches.
    `mix_shards`: the most shards interleaved in one group (1: one shard after another)."""
    total = _check(counts, world_size, rank, num_workers, batch_size)
    if mix_shards < 1:
        raise ValueError(f"mix_shards must be at least 1, got {mix_shards}")
    batches_per_rank = total // (world_size * batch_size)
    if batches_per_rank == 0:
        raise UserError(
            f"the training split has {total} samples, fewer than one global batch "
            f"(world size {world_size} × batch_size {batch_size}); lower data.batch_size"
        )
    order = shard_order(len(counts), seed, epoch, shuffle=True)
    # groups of near-equal shard counts: 20 shards at mix_shards 16 are two groups of 10, not 16 and 4
    groups = [order[low:high] for low, high in split_evenly(len(order), -(-len(order) // mix_shards))]
    group_seeds = [int(np.random.default_rng([seed, epoch, g]).integers(2**63)) for g in range(len(groups))]
    rank_start = rank * batches_per_rank * batch_size
    plans = []
    for worker, (first, last) in enumerate(split_evenly(batches_per_rank, num_workers)):
        begin, end = rank_start + first * batch_size, rank_start + last * batch_size
        # one seed per (epoch, rank, worker): buffers shuffle differently but reproducibly everywhere
        shuffle_seed = int(np.random.default_rng([seed, epoch, rank, worker]).integers(2**63))
        parts = slice_groups(counts, groups, group_seeds, begin, end)
        plans.append(WorkerPlan(parts, BatchSizes(last - first, batch_size), shuffle_seed))
    return plans


def eval_plan(
    counts: Sequence[int], *, world_size: int, rank: int, num_workers: int, batch_size: int
) -> list[WorkerPlan]:
    """One plan per worker of `rank` for validation or test: every sample exactly once in total, and
    the same number of batches on every rank (batch sizes then differ by at most one sample)."""
    total = _check(counts, world_size, rank, num_workers, batch_size)
    rank_sizes = [stop - start for start, stop in split_evenly(total, world_size)]
    nbatches = -(-max(rank_sizes) // batch_size)
    if min(rank_sizes) < nbatches:
        raise UserError(
            f"an evaluation split of {total} samples cannot give {world_size} ranks equal batch counts at "
            f"batch_size {batch_size}: raise data.batch_size or add samples"
        )
    begin = sum(rank_sizes[:rank])
    # split_evenly(rank_sizes[rank], nbatches), as sizes: the first `remainder` batches hold one more
    size, remainder = divmod(rank_sizes[rank], nbatches) if nbatches else (0, 0)
    batch_sizes = BatchSizes(nbatches, size, remainder)
    order = shard_order(len(counts), 0, 0, shuffle=False)
    plans = []
    for first, last in split_evenly(nbatches, num_workers):
        sizes = batch_sizes[first:last]
        end = begin + sizes.total
        plans.append(WorkerPlan(slice_stream(counts, order, begin, end), sizes, None))
        begin = end
    return plans


def fraction_counts(counts: Sequence[int], fraction: float) -> list[int]:
    """How many samples of each shard a `fraction` of the split keeps: always a prefix of each shard.

    The kept samples are the round(fraction × total) first of one fixed order of all samples: sample j of
    a shard of n is ranked by its place in that shard, (j + ½) / n, ties by shard. So the count is exact,
    every shard gives its share (± about one sample), and a smaller fraction's subset lies inside a
    larger one's. The subset does not depend on the seed, only on the shard index.

    Why per-shard prefixes: a tar shard is read as a stream, so a prefix costs only its own bytes (a
    fraction F reads about F of the data) while a scattered subset would read whole shards. `prepare` and
    the demo shuffle samples before sharding, so a prefix is a random sample of its shard; and taking the
    same share of every shard keeps classes balanced even when each shard holds a single class. Shards
    whose samples are sorted by class *inside* the shard would bias a small fraction: re-shard them with
    `python -m project.shards.prepare`.
    """
    if not 0 < fraction <= 1:
        raise UserError(f"data.fraction must be in (0, 1], got {fraction}")
    if any(count < 0 for count in counts):
        raise ValueError("shard sizes must not be negative")
    share = Fraction(fraction)  # exact ranks: the same float always gives the same subset
    target = round(fraction * sum(counts))  # as Python computes it: 18 for 0.7 of 25, not 17 (0.69999...)
    # the samples ranked below `share`; then add the next ones (or drop the last ones) in rank order
    kept = [min(n, max(0, math.ceil(n * share - Fraction(1, 2)))) for n in counts]
    adding = target > sum(kept)

    def movable(shard: int) -> bool:
        return kept[shard] < counts[shard] if adding else kept[shard] > 0

    def next_rank(shard: int) -> tuple[Fraction, int]:
        j = kept[shard] if adding else kept[shard] - 1
        rank = Fraction(2 * j + 1, 2 * counts[shard])
        return (rank, shard) if adding else (-rank, -shard)  # a min-heap: negate to pop the last kept

    heap = [(next_rank(shard), shard) for shard in range(len(counts)) if movable(shard)]
    heapq.heapify(heap)
    for _ in range(abs(target - sum(kept))):
        _, shard = heapq.heappop(heap)
        kept[shard] += 1 if adding else -1
        if movable(shard):
            heapq.heappush(heap, (next_rank(shard), shard))
    return kept


def skip_samples(parts: Sequence[Part], count: int) -> tuple[Part, ...]:
    """The parts without their first `count` samples: wholly skipped shards are never opened."""
    kept = []
    for part in parts:
        if count >= len(part):
            count -= len(part)
            continue
        kept.append(part.skip(count))
        count = 0
    return tuple(kept)


def resume_point(batches_done: int, num_workers: int, worker: int) -> tuple[int, int]:
    """(which worker plan DataLoader worker `worker` runs, how many of that plan's batches are done)
    when a rank resumes after `batches_done` batches of its epoch.

    A DataLoader hands batch j to worker j % num_workers, and a new iterator starts again at worker 0,
    so the plans rotate: the first batch of the resumed iterator is batch `batches_done` of the epoch.
    """
    plan = (worker + batches_done) % num_workers
    return plan, max(0, -(-(batches_done - plan) // num_workers))


def total_batches(plans: Sequence[WorkerPlan]) -> int:
    """Batches one rank yields in an epoch: what `len(dataloader)` reports."""
    return sum(plan.nbatches for plan in plans)
