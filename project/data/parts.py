"""What a DataLoader worker's plan reads, part by part: one shard's samples in their stored order (`Segment`),
or a run of a group of shards interleaved sample by sample (`Mix`). Pure: no torch, no I/O."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Segment:
    """Samples [start, stop) of shard number `shard` (its position in the shard list)."""

    shard: int
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start

    def segments(self) -> tuple[Segment, ...]:
        """The shard slices it reads: itself (as a `Mix` gives one per shard of its group)."""
        return (self,)

    def skip(self, count: int) -> Segment:
        """Without its first `count` samples."""
        return Segment(self.shard, self.start + count, self.stop)


@dataclass(frozen=True)
class Mix:
    """Positions [begin, end) of a group of shards read interleaved: its shards' samples in one merged order.

    Sample j of the group's shard i (of n_i samples) sits at (j + u_i) / n_i, with u_i in [0, 1) drawn from
    `seed`, and the merged order sorts those places (ties by shard). So each shard's samples keep their stored
    order (a tar is read as a stream), any run of the merged order holds a slice of every shard in proportion
    to its size (± 1 sample), and the run [begin, end) is a function of the group and the seed alone: a
    resumed reader skips to a position without reading what comes before it.
    """

    shards: tuple[int, ...]  # the group's shards, by their position in the shard list
    counts: tuple[int, ...]  # their sizes: the whole shards', not this run's
    seed: int
    begin: int
    end: int

    def __len__(self) -> int:
        return self.end - self.begin

    def _merged(self) -> np.ndarray:
        """The lane (index into `shards`) of each position of the group's merged order: computed when asked,
        not kept, so a worker holds one group's order at a time (4 bytes a sample), whatever its plan's size."""
        places = np.random.default_rng(self.seed).random(len(self.counts))
        keys = np.concatenate(
            [(np.arange(n) + place) / n for n, place in zip(self.counts, places, strict=True)] or [[]]
        )
        lanes = np.repeat(np.arange(len(self.counts), dtype=np.int32), self.counts)
        return lanes[np.lexsort((lanes, keys))]

    def window(self) -> tuple[tuple[Segment, ...], np.ndarray]:
        """(what each of the group's shards gives to [begin, end), one per lane, some maybe empty; the lane of
        each position of [begin, end), in order)."""
        merged = self._merged()
        starts = np.bincount(merged[: self.begin], minlength=len(self.counts))
        lanes = merged[self.begin : self.end]
        sizes = np.bincount(lanes, minlength=len(self.counts))
        segments = tuple(
            Segment(shard, int(start), int(start + size))
            for shard, start, size in zip(self.shards, starts, sizes, strict=True)
        )
        return segments, lanes

    def lanes(self) -> np.ndarray:
        return self.window()[1]

    def segments(self) -> tuple[Segment, ...]:
        """`window`'s segments; a run of the whole group gives every shard whole, without sorting anything."""
        if self.begin == 0 and self.end == sum(self.counts):
            return tuple(Segment(shard, 0, count) for shard, count in zip(self.shards, self.counts, strict=True))
        return self.window()[0]

    def skip(self, count: int) -> Mix:
        """Without its first `count` samples: the run starts later in the same merged order."""
        return Mix(self.shards, self.counts, self.seed, self.begin + count, self.end)


Part = Segment | Mix  # what a worker reads: one shard's samples in order, or a group's interleaved
