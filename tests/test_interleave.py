"""Training reads shards in interleaved groups (`data.mix_shards`): batches as mixed as a full shuffle's on
shards of one class each, for any number of workers and ranks, with the epoch plan still exact."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from types import SimpleNamespace
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from project.bench.shuffle import entropy_ratio
from project.data.batch import Batch
from project.data.loader import EpochLoader
from project.data.plan import Mix, Segment, skip_samples, train_plan
from project.data.position import resumed_start
from project.data.specs import resolve_shards
from project.data.stream import ShardStream
from project.data.task import Task

from .conftest import image_task


@dataclass
class KeysOnly(Task):
    """A task that reads no member: a batch is its keys (fast, in process)."""

    def decode(self, sample, stage):
        return sample["__key__"]

    def collate(self, examples, stage):
        return Batch()


def shard_of(key: str) -> int:
    """The shard a conftest key `train{shard}_{i}` came from: its class, on shards of one class each."""
    return int(key.removeprefix("train").split("_")[0])


def keys_stream(folder, *, workers: int, mix_shards: int, task=None, **kwargs) -> ShardStream:
    return ShardStream(
        shards=resolve_shards(str(folder)).shards,
        task=task or KeysOnly(),
        stage="train",
        batch_size=kwargs.pop("batch_size", 16),
        shuffle_buffer=kwargs.pop("shuffle_buffer", 64),
        num_workers=workers,
        mix_shards=mix_shards,
        **kwargs,
    )


def run_workers(stream: ShardStream) -> list[list[str]]:
    """The stream's batches of keys in a DataLoader's order (batch j from worker j % workers), its workers
    run one after another in this process."""
    per_worker = []
    for worker in range(stream.num_workers):
        info = SimpleNamespace(id=worker, num_workers=stream.num_workers)
        with mock.patch("project.data.stream.get_worker_info", return_value=info):
            per_worker.append([batch.keys for batch in stream])
    return [batch for round_ in itertools.zip_longest(*per_worker) for batch in round_ if batch is not None]


def rank_batches(folder, *, workers: int, world_size: int = 1, rank: int = 0, mix_shards: int, **kwargs) -> list:
    """One rank's training batches of keys."""
    stream = keys_stream(folder, workers=workers, mix_shards=mix_shards, **kwargs)
    stream.set_topology(world_size, rank)
    return run_workers(stream)


def batch_entropy_ratio(batches: list[list[str]]) -> float:
    return entropy_ratio([shard_of(key) for batch in batches for key in batch], len(batches[0]))


@pytest.fixture
def sorted_shards(shard_folder):
    """20 shards of 60 samples, each shard one class (the label is the shard), as many tools write them."""
    folder, keys = shard_folder([60] * 20)
    return folder, keys


@pytest.mark.parametrize(("workers", "world_size"), [(1, 1), (2, 1), (4, 1), (2, 2)])
def test_batches_from_sorted_shards_are_as_mixed_as_a_full_shuffle(sorted_shards, workers, world_size):
    folder, keys = sorted_shards
    for rank in range(world_size):
        mixed = rank_batches(folder, workers=workers, world_size=world_size, rank=rank, mix_shards=32)
        plain = rank_batches(folder, workers=workers, world_size=world_size, rank=rank, mix_shards=1)
        assert batch_entropy_ratio(mixed) >= 0.98
        assert batch_entropy_ratio(plain) < 0.6  # the same buffer without interleaving: few classes a batch


def test_each_rank_and_worker_reads_disjoint_samples_and_the_epoch_covers_all_but_a_remainder(sorted_shards):
    folder, keys = sorted_shards
    seen = [
        key
        for rank in range(2)
        for batch in rank_batches(folder, workers=3, world_size=2, rank=rank, mix_shards=8)
        for key in batch
    ]
    assert len(seen) == len(set(seen)) and set(seen) <= set(keys)
    assert len(keys) - len(seen) < 2 * 16


def test_mixed_epochs_reproduce_from_the_seed_and_change_with_it(sorted_shards):
    folder, _ = sorted_shards
    first = rank_batches(folder, workers=2, mix_shards=32, seed=3)
    assert rank_batches(folder, workers=2, mix_shards=32, seed=3) == first
    assert rank_batches(folder, workers=2, mix_shards=32, seed=4) != first


@pytest.mark.parametrize("done", [0, 1, 5, 9, 17])
def test_a_resumed_mixed_epoch_continues_with_the_same_batches(sorted_shards, done):
    folder, _ = sorted_shards
    full = rank_batches(folder, workers=3, mix_shards=7, shuffle_buffer=40)
    assert len(full) == 1200 // 16
    stream = keys_stream(folder, workers=3, mix_shards=7, shuffle_buffer=40)
    stream.resume_after(done)  # as a restored checkpoint sets it
    assert run_workers(stream) == full[done:]


def test_a_mixed_epoch_through_dataloader_workers_matches_the_in_process_plan(shard_folder):
    folder, _ = shard_folder([12] * 6)
    stream = keys_stream(folder, workers=2, mix_shards=32, task=image_task(), batch_size=4, shuffle_buffer=8)
    batches = [batch.keys for batch in EpochLoader(stream, num_workers=2)]
    expected = rank_batches(folder, workers=2, mix_shards=32, batch_size=4, shuffle_buffer=8)
    assert batches == expected
    # every batch of 4 holds 4 different shards: a plain read would give one or two
    assert all(len({shard_of(key) for key in batch}) >= 3 for batch in batches)


@given(st.lists(st.integers(0, 40), min_size=2, max_size=8), st.integers(0, 2**31), st.data())
@settings(max_examples=200, deadline=None)
def test_any_run_of_a_group_holds_a_slice_of_each_shard_in_proportion(counts, seed, data):
    total = sum(counts)
    begin = data.draw(st.integers(0, total))
    end = data.draw(st.integers(begin, total))
    part = Mix(tuple(range(len(counts))), tuple(counts), seed, begin, end)
    segments = part.segments()
    lanes = part.lanes()
    assert len(lanes) == end - begin == sum(len(s) for s in segments)
    assert np.bincount(lanes, minlength=len(counts)).tolist() == [len(s) for s in segments]
    for segment, count in zip(segments, counts, strict=True):
        assert 0 <= segment.start <= segment.stop <= count
        if total:
            assert abs(len(segment) - (end - begin) * count / total) <= 2  # ± a sample, and the window's edges
    # a run skipped into continues the order: what a resumed worker reads
    cut = data.draw(st.integers(0, end - begin))
    later = part.skip(cut)
    assert later.lanes().tolist() == lanes[cut:].tolist()
    assert all(
        s.start == a.start + b
        for s, a, b in zip(later.segments(), segments, np.bincount(lanes[:cut], minlength=len(counts)), strict=True)
    )


def test_skip_samples_moves_into_a_mixed_group_without_opening_what_it_skips():
    group = Mix((3, 1), (10, 10), seed=0, begin=0, end=20)
    parts = (Segment(0, 0, 5), group, Segment(2, 0, 4))
    assert skip_samples(parts, 5) == (group, Segment(2, 0, 4))
    assert skip_samples(parts, 12) == (group.skip(7), Segment(2, 0, 4))
    assert skip_samples(parts, 25) == (Segment(2, 0, 4),)


def test_twenty_shards_at_sixteen_make_two_groups_of_ten():
    plans = train_plan([50] * 20, epoch=0, seed=0, world_size=1, rank=0, num_workers=1, batch_size=10, mix_shards=16)
    groups = [part for part in plans[0].parts if isinstance(part, Mix)]
    assert [len(group.shards) for group in groups] == [10, 10]
    one = train_plan([50] * 20, epoch=0, seed=0, world_size=1, rank=0, num_workers=1, batch_size=10)
    assert all(isinstance(part, Segment) for part in one[0].parts) and len(one[0].parts) == 20


def test_resuming_a_position_planned_without_mixing_warns_and_continues(recwarn):
    class Stream:
        world_size, num_workers, mix_shards = 1, 2, 32

    old = {"epoch": 2, "batches": 5, "epoch_batches": 40, "world_size": 1, "num_workers": 2}  # before mix_shards
    with pytest.warns(UserWarning, match=r"mix_shards 1 → 32.*may repeat or miss samples"):
        assert resumed_start(old, Stream()) == (2, 5)
    assert resumed_start({**old, "mix_shards": 32}, Stream()) == (2, 5)
    assert resumed_start({**old, "batches": 40}, Stream()) == (3, 0)  # saved at its epoch's end


def test_mix_shards_below_one_is_refused_in_one_line():
    from project.errors import UserError
    from project.tasks.image.data import ImageShards

    with pytest.raises(UserError, match=r"^data.mix_shards must be positive, got 0$"):
        ImageShards(root=None, mix_shards=0, num_workers=0)


def test_mix_shards_defaults_to_one_only_for_shards_their_index_says_were_shuffled(shard_folder, tmp_path):
    from project.data.shard_index import SHUFFLED_KEY, merged_extra, read_index, write_index
    from project.tasks.image.data import ImageShards

    folder, _ = shard_folder([8] * 4)
    index = read_index(str(folder / "shardindex.json"))
    shuffled = write_index(
        tmp_path / "shuffled.json", index.shards, name="train", extra={**index.extra, SHUFFLED_KEY: True}
    )

    def effective(train, **kwargs) -> int:
        return ImageShards(root=None, train=str(train), num_workers=0, **kwargs).stream("train").mix_shards

    assert effective(folder) == 32  # shards made elsewhere may be sorted
    assert effective(shuffled) == 1  # prepare's and the demos': nothing to mix
    assert effective(shuffled, mix_shards=4) == 4 and effective(folder, mix_shards=1) == 1
    # several indexes: shuffled only when every one says so
    assert merged_extra([read_index(str(shuffled)), index]) == {"classes": index.extra["classes"]}
    assert merged_extra([read_index(str(shuffled)), read_index(str(shuffled))])[SHUFFLED_KEY] is True
