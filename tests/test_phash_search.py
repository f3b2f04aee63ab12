"""The near-image search (project/shards/phash_search.py): the exact multi-index below the switch finds every pair,
bit sampling past it finds a pair at the distance with probability 0.99 or more, the pairs found do not depend on
the order of the hashes, and huge runs and the memory stay linear."""

from __future__ import annotations

import tracemalloc
from collections import defaultdict
from math import comb

import numpy as np
import pytest

from project.shards import phash_search
from project.shards.matching import Forest, phash_pairs
from project.shards.phash_search import HUGE_RUN_SAMPLE, LSH_BUCKET_CAP, LSH_RECALL, lsh_plan, popcount, tie_keys


def flipped(value: np.uint64, bits: int, rng: np.random.Generator) -> np.uint64:
    """`value` with `bits` of its 64 bits, drawn at random, flipped."""
    return value ^ np.uint64(sum(1 << int(b) for b in rng.choice(64, bits, replace=False)))


def planted(n: int, distances: list[int], seed: int) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """n random hashes, then for each distance a copy of one of them that many bits away: (hashes, the pairs)."""
    rng = np.random.default_rng(seed)
    values = list(rng.integers(0, 2**64, n, dtype=np.uint64, endpoint=False))
    pairs = []
    for distance in distances:
        source = int(rng.integers(n))
        values.append(flipped(values[source], distance, rng))
        pairs.append((source, len(values) - 1))
    return np.array(values, dtype=np.uint64), pairs


def found(values: np.ndarray, distance: int, **options) -> set[tuple[int, int]]:
    return {
        pair for a, b in phash_pairs(values, distance, **options) for pair in zip(a.tolist(), b.tolist(), strict=True)
    }


def brute_force(values: np.ndarray, distance: int) -> set[tuple[int, int]]:
    near = np.triu(popcount(values[:, None] ^ values[None, :]) <= distance, 1)
    return set(zip(*(axis.tolist() for axis in np.nonzero(near)), strict=True))


@pytest.mark.parametrize("distance", [0, 5, 12, 16])
def test_below_the_switch_every_pair_within_the_distance_is_found(distance):
    values, pairs = planted(2_000, [d for d in range(distance + 1) for _ in range(10)], seed=distance)
    result = found(values, distance)
    assert result == brute_force(values, distance)
    assert set(pairs) <= result


@pytest.mark.parametrize("distance", [6, 12])
def test_past_the_switch_a_pair_at_the_distance_is_found_with_probability_0_99(distance):
    """4,000 pairs exactly `distance` bits apart among 20,000 hashes, by bit sampling (the switch lowered to 0):
    at least 99% of them found (the tables are planned for LSH_RECALL, a margin above 0.99), and every pair found
    is within the distance (none missed when closer than 4)."""
    values, pairs = planted(20_000, [distance] * 4_000 + [3] * 200, seed=distance)
    result = found(values, distance, lsh_from=0)
    recall = np.mean([pair in result for pair in pairs[:4_000]])
    assert recall >= 0.99, recall
    assert set(pairs[4_000:]) <= result
    a, b = np.array(sorted(result)).T
    assert (popcount(values[a] ^ values[b]) <= distance).all() and (a < b).all()


def test_the_plan_makes_a_pair_at_the_distance_a_candidate_with_probability_0_99():
    for n in (50_000, 1_000_000, 10_000_000):
        for distance in (0, 4, 12, 16):
            bits, tables = lsh_plan(n, distance)
            p = comb(64 - distance, bits) / comb(64, bits)
            assert 1 - (1 - p) ** tables >= LSH_RECALL
            assert 1 - (1 - p) ** (tables - 1) < LSH_RECALL or tables == 1  # no table more than it needs
    assert lsh_plan(10_000_000, 0) == (64, 1)  # exact copies: one table keyed by the whole hash
    assert 18 <= lsh_plan(1_000_000, 12)[0] <= 22  # about log2(n) bits: buckets of a few random hashes


def partition(values: np.ndarray, thumbs: np.ndarray, order: np.ndarray, lsh_from: int) -> set[frozenset[int]]:
    """The groups that phash_pairs joins when the hashes come in `order`, as sets of their original positions."""
    forest = Forest(np.arange(len(values)))
    for a, b in phash_pairs(values[order], 12, thumbs, order, forest.joined, lsh_from=lsh_from):
        forest.union_arrays(a, b)
    groups = defaultdict(set)
    for position, label in enumerate(forest.labels().tolist()):
        groups[label].add(int(order[position]))
    return {frozenset(members) for members in groups.values()}


@pytest.mark.parametrize("lsh_from", [0, phash_search.LSH_FROM])
def test_the_groups_are_the_same_in_any_order_of_the_hashes(lsh_from):
    """Random hashes with near copies, and a huge run: 600 hashes within 2 bits of one (200 of them equal) with
    three kinds of thumbnail, so that which neighbours a hash is compared with decides the groups. The parts of a
    job array list the records in another order than one machine, and must find the same groups."""
    rng = np.random.default_rng(3)
    values, _ = planted(3_000, [int(d) for d in rng.integers(0, 14, 300)], seed=3)
    centre = np.uint64(0x0123456789ABCDEF)
    run = [centre] * 200 + [flipped(centre, int(rng.integers(1, 3)), rng) for _ in range(400)]
    values = np.concatenate([values, np.array(run, dtype=np.uint64)])
    kinds = rng.integers(0, 256, (3, 8, 8, 3), dtype=np.uint8)
    thumbs = kinds[rng.integers(0, 3, len(values))]
    thumbs[:3_300] = np.where(rng.random(3_300) < 0.5, 0, 1)[:, None, None, None] * 200  # near copies match or not
    expected = partition(values, thumbs, np.arange(len(values)), lsh_from)
    assert len(expected) < len(values) - 100  # groups were found
    for seed in range(2):
        order = np.random.default_rng(seed).permutation(len(values))
        assert partition(values, thumbs, order, lsh_from) == expected


def test_equal_hashes_are_ordered_by_their_thumbnails():
    values = np.array([5, 7, 5, 5, 9], dtype=np.uint64)
    thumbs = np.zeros((5, 8, 8, 3), dtype=np.uint8)
    thumbs[3, 0, 0, 0] = 1
    tie = tie_keys(values, thumbs)
    assert tie[1] == tie[4] == 0  # not shared: no key needed
    assert tie[0] == tie[2] != tie[3]
    assert (tie_keys(values, thumbs[[4, 3, 2, 1, 0]], np.array([4, 3, 2, 1, 0])) == tie).all()  # through `rows`


def test_a_huge_run_past_the_switch_stays_linear(monkeypatch):
    """Hashes within 2 bits of one another (frames of one video) fill buckets far past LSH_BUCKET_CAP in most
    tables: each hash is checked against at most LSH_BUCKET_CAP / 2 + HUGE_RUN_SAMPLE others a table, whatever
    the number of frames, and the frames still form one group."""
    checked = []

    def counting(values: np.ndarray) -> np.ndarray:
        checked[-1] += len(values)
        return popcount(values)

    monkeypatch.setattr(phash_search, "popcount", counting)
    for n in (5_000, 20_000):
        rng = np.random.default_rng(n)
        frames = np.uint64(0x0123456789ABCDEF) ^ np.array([flipped(0, 2, rng) for _ in range(n)], dtype=np.uint64)
        thumbs = np.zeros((n, 8, 8, 3), dtype=np.uint8)
        forest = Forest(np.arange(n))
        checked.append(0)
        for a, b in phash_pairs(frames, 12, thumbs, None, forest.joined, lsh_from=0):
            forest.union_arrays(a, b)
        assert len(np.unique(forest.labels())) == 1
        tables = lsh_plan(n, 12)[1]
        assert checked[-1] <= n * tables * (LSH_BUCKET_CAP / 2 + HUGE_RUN_SAMPLE), (checked[-1], n * tables)


def test_bit_sampling_needs_a_few_bytes_a_hash_and_no_pair_array():
    """What the search allocates past the switch grows by under 150 bytes a hash from 10,000 to 40,000 random
    hashes (its 4 reused arrays of the hashes, the buckets' starts and sizes): linear, where all pairs would take
    gigabytes."""

    def peak(n: int) -> int:
        values = np.random.default_rng(n).integers(0, 2**64, n, dtype=np.uint64, endpoint=False)
        tracemalloc.start()
        for _ in phash_pairs(values, 12, lsh_from=0):
            pass
        used = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return used

    small, large = peak(10_000), peak(40_000)
    assert (large - small) / 30_000 < 150, (large - small) / 30_000
