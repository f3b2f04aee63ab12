"""Read a worker's plan, part by part, into encoded samples: a shard's slice in order, or a mixed group's shards
side by side, a sample at a time from the one the group's order names. Each lane (the first, second ... shard of
each group) has its own read-ahead opener: a remote shard's bytes come while the worker decodes. An unreadable
sample keeps its place as `Missing`, so batches stay aligned with the plan."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from project.data.parts import Mix, Part, Segment
from project.data.prefetch import Opener, ShardOpener
from project.data.samples import Sample, read_samples
from project.data.shard_index import Shard
from project.data.tarreader import MAX_COMPRESSION_RATIO
from project.errors import ShardError


@dataclass(frozen=True)
class Missing:
    """A placeholder for a sample that could not be read (a truncated or unreadable shard).

    It keeps its place in the stream, so batches, ranks and resumed epochs stay aligned with the plan.
    """

    url: str
    position: int
    reason: str


class PartReader:
    """Reads parts of a worker's plan over `shards`: only the `extensions` a task decodes, through `open_stream`,
    with `read_ahead_bytes` of remote shards fetched ahead (shared by the lanes); a member over `max_member_bytes`
    unread; a compressed shard stopped past `max_ratio` bytes out per byte in; an unreadable shard's samples
    `Missing` with `skip_corrupt`, else its `ShardError` raised."""

    def __init__(
        self,
        shards: Sequence[Shard],
        extensions: frozenset[str],
        open_stream: Opener,
        *,
        read_ahead_bytes: int,
        max_member_bytes: int | None,
        skip_corrupt: bool,
        max_ratio: float | None = MAX_COMPRESSION_RATIO,
    ) -> None:
        self.shards, self.extensions, self.open_stream = shards, extensions, open_stream
        self.read_ahead_bytes, self.max_member_bytes, self.skip_corrupt = (
            read_ahead_bytes,
            max_member_bytes,
            skip_corrupt,
        )
        self.max_ratio = max_ratio

    def read(self, parts: Sequence[Part]) -> Iterator[Sample | Missing]:
        """Each part's samples in order, the next remote shard of each lane fetched while one is read.

        A lane is a place in a mixed group (the first, second ... shard of each group): its shards are read one
        after another, so each lane gets its own opener and a share of the read-ahead budget."""
        lanes: list[list[str]] = []
        for part in parts:
            segments = part.segments()
            lanes += [[] for _ in range(len(segments) - len(lanes))]
            for lane, segment in enumerate(segments):
                if len(segment):
                    lanes[lane].append(self.shards[segment.shard].url)
        budget = self.read_ahead_bytes // max(1, len(lanes))
        openers = [ShardOpener(urls, self.open_stream, budget) for urls in lanes]
        if len(openers) > 1:  # lanes read side by side: every lane's first shard is requested now
            for opener in openers:
                opener.start()
        try:
            for part in parts:
                if isinstance(part, Mix):
                    yield from self._mixed(part, openers)
                else:
                    yield from self._segment(part, openers[0])
        finally:
            for opener in openers:
                opener.close()

    def _mixed(self, part: Mix, openers: Sequence[ShardOpener]) -> Iterator[Sample | Missing]:
        """A mixed group's run: its shards read side by side, a sample at a time from the one its order names
        (there may be more openers than shards: a larger group of the plan has more lanes)."""
        segments, lanes = part.window()
        readers = [self._segment(segment, opener) for segment, opener in zip(segments, openers, strict=False)]
        try:
            for lane in lanes.tolist():
                yield next(readers[lane])
        finally:
            for reader in readers:  # closes the shards whose last sample was read without reaching their end
                reader.close()

    def _segment(self, segment: Segment, opener: ShardOpener) -> Iterator[Sample | Missing]:
        """One segment's samples: exactly len(segment) items, `Missing` for unreadable ones."""
        shard, extensions = self.shards[segment.shard], self.extensions
        seen, reason = 0, ""
        try:
            for sample in read_samples(
                shard.url,
                segment.start,
                segment.stop,
                extensions=extensions,
                open_stream=opener,
                max_member_bytes=self.max_member_bytes,
                max_ratio=self.max_ratio,
            ):
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
