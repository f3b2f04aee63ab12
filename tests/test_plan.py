"""The epoch plan: exactly-once evaluation, equal and duplicate-free training epochs, for any topology."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from project.data.plan import (
    Segment,
    eval_plan,
    resume_point,
    skip_samples,
    split_evenly,
    total_batches,
    train_plan,
)
from project.errors import UserError

topologies = st.fixed_dictionaries(
    {
        "counts": st.lists(st.integers(0, 60), min_size=1, max_size=12),
        "world_size": st.integers(1, 8),
        "num_workers": st.integers(1, 6),
        "batch_size": st.integers(1, 16),
    }
)


def samples_of(plans) -> list[tuple[int, int]]:
    """Every (shard, sample) the plans read, in reading order."""
    return [(s.shard, i) for plan in plans for s in plan.segments for i in range(s.start, s.stop)]


def all_ranks(planner, world_size, **kwargs):
    return [planner(world_size=world_size, rank=rank, **kwargs) for rank in range(world_size)]


@given(topologies, st.integers(0, 5), st.integers(0, 2**31), st.sampled_from([1, 2, 3, 32]))
@settings(max_examples=300, deadline=None)
def test_train_epoch_is_equal_per_rank_and_never_repeats(topology, epoch, seed, mix_shards):
    counts, world_size, batch_size = topology["counts"], topology["world_size"], topology["batch_size"]
    total = sum(counts)
    if total < world_size * batch_size:
        with pytest.raises(UserError, match="fewer than one global batch"):
            train_plan(
                counts,
                epoch=epoch,
                seed=seed,
                rank=0,
                world_size=world_size,
                num_workers=topology["num_workers"],
                batch_size=batch_size,
            )
        return
    ranks = all_ranks(
        train_plan,
        world_size,
        counts=counts,
        epoch=epoch,
        seed=seed,
        num_workers=topology["num_workers"],
        batch_size=batch_size,
        mix_shards=mix_shards,
    )
    batches = {total_batches(plans) for plans in ranks}
    assert len(batches) == 1, f"ranks disagree on the number of batches: {batches}"
    seen = [sample for plans in ranks for sample in samples_of(plans)]
    assert len(seen) == len(set(seen)), "a sample is read twice in one epoch"
    assert total - len(seen) < world_size * batch_size, "too many samples dropped"
    assert all(set(plan.batch_sizes) <= {batch_size} for plans in ranks for plan in plans), "partial batch"
    assert all(plan.nsamples == sum(plan.batch_sizes) for plans in ranks for plan in plans)
    assert all(0 <= i < counts[shard] for shard, i in seen)


@given(topologies)
@settings(max_examples=300, deadline=None)
def test_evaluation_reads_every_sample_exactly_once(topology):
    counts, world_size = topology["counts"], topology["world_size"]
    kwargs = dict(counts=counts, num_workers=topology["num_workers"], batch_size=topology["batch_size"])
    total, batch_size = sum(counts), topology["batch_size"]
    nbatches = math.ceil(math.ceil(total / world_size) / batch_size)
    if total // world_size < nbatches:  # too few samples to give every rank equal batch counts
        with pytest.raises(UserError, match="cannot give .* equal batch counts"):
            eval_plan(world_size=world_size, rank=0, **kwargs)
        return
    ranks = all_ranks(eval_plan, world_size, **kwargs)
    seen = Counter(sample for plans in ranks for sample in samples_of(plans))
    expected = {(shard, i) for shard, count in enumerate(counts) for i in range(count)}
    assert set(seen) == expected and all(n == 1 for n in seen.values())
    assert len({total_batches(plans) for plans in ranks}) == 1, "ranks disagree on the number of batches"
    for plans in ranks:
        assert all(1 <= size <= batch_size for plan in plans for size in plan.batch_sizes)
        assert all(plan.nsamples == sum(plan.batch_sizes) for plan in plans)


def test_shard_split_across_simulated_ranks_and_workers_covers_every_shard_without_overlap():
    counts = [7, 3, 11, 5, 9]  # uneven, and fewer shards than 2 ranks x 3 workers
    ranks = all_ranks(eval_plan, 2, counts=counts, num_workers=3, batch_size=2)
    owners: dict[tuple[int, int], tuple[int, int]] = {}
    for rank, plans in enumerate(ranks):
        for worker, plan in enumerate(plans):
            for sample in samples_of([plan]):
                assert sample not in owners, f"{sample} read by {owners[sample]} and {(rank, worker)}"
                owners[sample] = (rank, worker)
    assert {shard for shard, _ in owners} == set(range(len(counts)))
    assert len(owners) == sum(counts)


def test_training_order_is_new_each_epoch_and_reproducible_from_the_seed():
    counts = [10] * 20

    def order(epoch, seed):
        return samples_of(train_plan(counts, epoch=epoch, seed=seed, world_size=1, rank=0, num_workers=2, batch_size=4))

    assert order(0, 7) == order(0, 7)
    assert order(0, 7) != order(1, 7)
    assert order(0, 7) != order(0, 8)


def test_workers_get_equal_batches_give_or_take_one():
    plans = train_plan([100] * 3, epoch=0, seed=0, world_size=2, rank=1, num_workers=4, batch_size=8)
    # 300 samples // (2 ranks x 8) = 18 batches per rank, split 5, 5, 4, 4 over the workers
    assert [p.nbatches for p in plans] == [5, 5, 4, 4]


def test_split_evenly():
    assert split_evenly(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert split_evenly(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]


def round_robin(nbatches: Sequence[int]) -> list[tuple[int, int]]:
    """(worker, batch of that worker) in the order a DataLoader yields them, skipping exhausted workers."""
    order, taken = [], [0] * len(nbatches)
    while any(taken[w] < nbatches[w] for w in range(len(nbatches))):
        for w in range(len(nbatches)):
            if taken[w] < nbatches[w]:
                order.append((w, taken[w]))
                taken[w] += 1
    return order


@given(st.integers(1, 40), st.integers(1, 6), st.data())
@settings(max_examples=200, deadline=None)
def test_resumed_workers_continue_the_interrupted_batch_order(nbatches, num_workers, data):
    per_worker = [stop - start for start, stop in split_evenly(nbatches, num_workers)]
    full = round_robin(per_worker)
    done = data.draw(st.integers(0, nbatches))
    # the resumed iterator: worker w runs plan p from batch c on
    points = [resume_point(done, num_workers, w) for w in range(num_workers)]
    remaining = [per_worker[p] - c for p, c in points]
    resumed = [(points[w][0], points[w][1] + i) for w, i in round_robin(remaining)]
    assert resumed == full[done:]


def test_skip_samples_drops_whole_segments_first():
    segments = (Segment(4, 0, 10), Segment(1, 5, 8), Segment(2, 0, 6))
    assert skip_samples(segments, 0) == segments
    assert skip_samples(segments, 12) == (Segment(1, 7, 8), Segment(2, 0, 6))
    assert skip_samples(segments, 13) == (Segment(2, 0, 6),)
    assert skip_samples(segments, 19) == ()
