"""The near-image search: index pairs of 64-bit pHashes within d differing bits, without comparing all pairs.

Two searches, by the number n of hashes:
- below LSH_FROM, exact: a multi-index over 4 blocks of 16 bits (two hashes within d bits agree within d // 4 bits
  on at least one block, so each block is looked up with every mask of at most d // 4 bits). It finds every pair,
  but each block value holds n / 65,536 hashes, so its candidates grow as about 0.04 n² at d = 12 (697 masks).
  Exact search cannot do much better at that radius: with blocks of any width, a hash at 1,000,000 has about 10,000
  block values or candidates to look at.
- from LSH_FROM, bit sampling (locality-sensitive hashing for the Hamming distance): `tables` tables, each keyed by
  `bits` of the 64 bits, drawn from a fixed seed. Hashes that agree on a table's bits share its bucket, and every
  pair of a bucket is checked on the whole hash. A pair d bits apart agrees on `bits` bits drawn at random with
  probability p = C(64 - d, bits) / C(64, bits), so `tables` >= log(1 - LSH_RECALL) / log(1 - p) tables make it a
  candidate with probability at least LSH_RECALL, 0.99 and a margin (a closer pair, more). `bits` is about log2(n)
  (`lsh_plan`: the cheapest of sorting more tables and checking more pairs a bucket), so a table's buckets hold a few
  random hashes, and the search costs about n log n a table.
Either way the pairs found depend on the hashes alone, never on their order in the input: the bits come from a
fixed seed, and hashes are ordered by their value, then by a key of their thumbnail (`tie_keys`), never by index.

Huge runs (thousands of frames of one video) stay linear: in the exact search, a block value shared by more than
BUCKET_CAP hashes is compared with the BUCKET_CAP after each hash in the order of the whole hash, and, from a
neighbouring block value, with the first HUGE_RUN_SAMPLE of it; in the bit sampling, a bucket of more than
LSH_BUCKET_CAP hashes is compared with the next HUGE_RUN_SAMPLE of each in the order of the hash rotated by a
number of bits of the table's own (another order in each table). Near copies still join through chains.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from itertools import combinations
from math import comb, log, log1p

import numpy as np

CHUNK = 1 << 16  # candidate pairs checked at a time
BLOCKS = 4  # exact multi-index: 64 bits in 4 blocks of 16
BUCKET_CAP = 256  # exact: a block value shared by more hashes is a huge run
HUGE_RUN_SAMPLE = 4
LSH_FROM = 50_000  # from this many hashes, bit sampling (measured: 20x faster at 100,000; docs/DESIGN.md)
LSH_RECALL = 0.995  # the chance a pair at the distance is a candidate: 0.99 and a margin (a set's share varies)
LSH_BUCKET_CAP = 64  # bit sampling: a bucket of more hashes is a huge run
LSH_SEED = 0x5EED
TIE_CHUNK = 1 << 12  # thumbnails keyed at a time
MATRIX_PAIRS = 1 << 20  # bucket pairs compared at a time
TABLE_COST = 3  # what a table costs a hash (its sort, gather and passes) in pair checks: measured at 1M
Pairs = Iterator[tuple[np.ndarray, np.ndarray]]


def popcount(values: np.ndarray) -> np.ndarray:
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(values)
    return np.unpackbits(values.view(np.uint8).reshape(-1, 8), axis=1).sum(axis=1)


def tie_keys(values: np.ndarray, thumbs: np.ndarray | None = None, rows: np.ndarray | None = None) -> np.ndarray:
    """A 64-bit key of each hash's thumbnail (value i's at thumbs[rows[i]]) where another hash has the same value,
    0 elsewhere: equal hashes are ordered by it, not by their place in the input (hashes that tie on both are alike
    in every check)."""
    tie = np.zeros(len(values), dtype=np.uint64)
    if thumbs is None or len(values) < 2:
        return tie
    order = np.argsort(values)
    equal = values[order[1:]] == values[order[:-1]]
    shared = order[np.r_[equal, False] | np.r_[False, equal]]
    del order, equal
    words = -(-thumbs[0].nbytes // 8)
    draw = random.Random(LSH_SEED).random
    weights = np.array([int(draw() * 2**32) << 32 | int(draw() * 2**32) | 1 for _ in range(words)], dtype=np.uint64)
    for start in range(0, len(shared), TIE_CHUNK):
        chunk = shared[start : start + TIE_CHUNK]
        pixels = np.zeros((len(chunk), words * 8), dtype=np.uint8)
        pixels[:, : thumbs[0].nbytes] = thumbs[chunk if rows is None else rows[chunk]].reshape(len(chunk), -1)
        tie[chunk] = pixels.view("<u8") @ weights  # modulo 2**64
    return tie


def close_pairs(
    values: np.ndarray, max_distance: int, tie: np.ndarray | None = None, lsh_from: int = LSH_FROM
) -> Pairs:
    """Index pairs (i < j) of `values` within `max_distance` bits, in chunks (a pair may come more than once): by
    the exact multi-index below `lsh_from` hashes, by bit sampling from there (see the module's docstring)."""
    if tie is None:
        tie = np.zeros(len(values), dtype=np.uint64)
    search = multi_index_pairs if len(values) < lsh_from else sampled_bit_pairs
    return search(values, max_distance, tie)


def multi_index_pairs(values: np.ndarray, max_distance: int, tie: np.ndarray) -> Pairs:
    """Every pair within `max_distance` bits while no block value is shared by more than BUCKET_CAP hashes."""
    width = 64 // BLOCKS
    masks = _masks(width, max_distance // BLOCKS)
    for block in range(BLOCKS):
        keys = ((values >> np.uint64(block * width)) & np.uint64((1 << width) - 1)).astype(np.int64)
        order = np.lexsort((tie, values, keys))  # by block value, then by the whole hash
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        starts = np.zeros((1 << width) + 1, dtype=np.int64)  # where each block value's run begins in `order`
        np.cumsum(np.bincount(keys, minlength=1 << width), out=starts[1:])
        for mask in masks.astype(np.int64):
            wanted = keys ^ mask
            if mask == 0:  # the own run: those after this hash, at most BUCKET_CAP
                lo = rank + 1
                counts = np.minimum(starts[keys + 1] - lo, BUCKET_CAP)
            else:  # another run: all of it, or where it is huge, its first few (one link joins two runs)
                lo = starts[wanted]
                counts = starts[wanted + 1] - lo
                counts = np.where(counts > BUCKET_CAP, np.minimum(counts, HUGE_RUN_SAMPLE), counts)
            for query, position in expand(counts, lo):
                other = order[position]
                query, other = np.minimum(query, other), np.maximum(query, other)
                close = popcount(values[query] ^ values[other]) <= max_distance
                yield query[close], other[close]


def _masks(bits: int, weight: int) -> np.ndarray:
    """All `bits`-bit masks with at most `weight` bits set."""
    masks = [0]
    for w in range(1, weight + 1):
        masks += [sum(1 << i for i in chosen) for chosen in combinations(range(bits), w)]
    return np.asarray(masks, dtype=np.uint64)


def expand(counts: np.ndarray, lo: np.ndarray) -> Pairs:
    """(query, position) for each query i and each position in lo[i]:lo[i]+counts[i], in chunks of about CHUNK."""
    queries = np.flatnonzero(counts)
    if len(queries) == 0:
        return
    cumulative = np.cumsum(counts[queries])
    start = 0
    while start < len(queries):
        base = cumulative[start - 1] if start else 0
        stop = max(start + 1, int(np.searchsorted(cumulative, base + CHUNK, side="right")))
        chunk = queries[start:stop]
        repeats = counts[chunk]
        query = np.repeat(chunk, repeats)
        offsets = np.arange(len(query)) - np.repeat(np.cumsum(repeats) - repeats, repeats)
        yield query, lo[query] + offsets
        start = stop


def lsh_plan(n: int, max_distance: int) -> tuple[int, int]:
    """(bits, tables) for bit sampling over n hashes: the cheapest whose tables make a pair at `max_distance` a
    candidate with probability LSH_RECALL or more. A table costs about TABLE_COST + n / 2**(bits + 1) checks a
    hash (its sort, and the pairs of its buckets where the hashes are random)."""
    best = (float("inf"), 64, 1)
    for bits in range(1, 65 - max_distance):
        p = comb(64 - max_distance, bits) / comb(64, bits)
        tables = 1 if p == 1 else int(np.ceil(log(1 - LSH_RECALL) / log1p(-p)))
        cost = tables * (TABLE_COST + n / 2 ** (bits + 1))
        best = min(best, (cost, bits, tables))
    return best[1], best[2]


def sampled_bit_pairs(values: np.ndarray, max_distance: int, tie: np.ndarray) -> Pairs:
    """Pairs within `max_distance` bits that share a bucket of a table (every one of a bucket of at most
    LSH_BUCKET_CAP hashes): one at exactly `max_distance` with probability LSH_RECALL or more."""
    n = len(values)
    if n < 2:
        return
    bits, tables = lsh_plan(n, max_distance)
    shift = np.uint64(max(1, (n - 1).bit_length()))  # the low bits of a sorted entry hold its index
    low = np.uint64((1 << int(shift)) - 1)
    index = np.arange(n, dtype=np.uint64)
    entry, bucket, order, ordered = (np.empty(n, dtype=np.uint64) for _ in range(4))  # reused: no page faults
    found = _Batches()
    for mask, turn in _draws(tables, bits):
        # the bucket: the sampled bits, hashed into the bits above the index (a rare collision is one more candidate)
        np.bitwise_and(values, mask, out=entry)
        entry *= np.uint64(0x9E3779B97F4A7C15)
        entry &= ~low
        entry |= index
        entry.sort()
        np.bitwise_and(entry, low, out=order)
        np.right_shift(entry, shift, out=bucket)
        np.take(values, order.view(np.int64), out=ordered)
        starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
        sizes = np.diff(np.r_[starts, n])
        yield from found.add(_bucket_pairs(ordered, starts, sizes, max_distance), order.view(np.int64))
        group, members = _huge_members(values, order.view(np.int64), starts, sizes, (turn, tie))
        yield from found.add(_window_pairs(values[members], group, max_distance), members)
    yield from found.flush()


def _draws(tables: int, bits: int) -> Iterator[tuple[np.uint64, int]]:
    """Each table's mask of `bits` bits, and the turn that orders its huge buckets: from LSH_SEED through
    random.random(), whose sequence Python keeps from version to version (numpy's generators may change theirs)."""
    draw = random.Random(LSH_SEED).random
    for _ in range(tables):
        chosen = sorted(range(64), key=lambda _: draw())[:bits]
        yield np.uint64(sum(1 << b for b in chosen)), 1 + int(draw() * 63)


class _Batches:
    """Pairs of positions gathered into chunks of CHUNK index pairs or more: each chunk the caller takes costs it a
    pass over all the hashes (the union-find's roots), so a table's few pairs wait for the next table's."""

    def __init__(self):
        self.pairs: list[tuple[np.ndarray, np.ndarray]] = []
        self.size = 0

    def add(self, pairs: Pairs, order: np.ndarray) -> Pairs:
        for first, second in pairs:
            a, b = order[first], order[second]
            self.pairs.append((np.minimum(a, b), np.maximum(a, b)))
            self.size += len(a)
            if self.size >= CHUNK:
                yield from self.flush()

    def flush(self) -> Pairs:
        if self.size:
            a, b = np.concatenate([a for a, _ in self.pairs]), np.concatenate([b for _, b in self.pairs])
            for start in range(0, len(a), CHUNK):
                yield a[start : start + CHUNK], b[start : start + CHUNK]
        self.pairs, self.size = [], 0


def _bucket_pairs(ordered: np.ndarray, starts: np.ndarray, sizes: np.ndarray, max_distance: int) -> Pairs:
    """(i, j) positions within `max_distance` bits of every pair of every bucket of 2 to LSH_BUCKET_CAP hashes
    (`ordered`: the hashes by bucket; each bucket at starts[k], of sizes[k]). The buckets of one size at a time,
    as a matrix of a row a bucket: a few passes over contiguous memory for every pair."""
    kept = (sizes >= 2) & (sizes <= LSH_BUCKET_CAP)
    starts, sizes = starts[kept], sizes[kept].astype(np.uint16)
    by_size = np.argsort(sizes, kind="stable")
    starts, bounds = starts[by_size], np.searchsorted(sizes[by_size], np.arange(2, LSH_BUCKET_CAP + 2))
    for size in range(2, LSH_BUCKET_CAP + 1):
        first = starts[bounds[size - 2] : bounds[size - 1]]
        i, j = np.triu_indices(size, 1)
        rows = max(1, MATRIX_PAIRS // len(i))
        for start in range(0, len(first), rows):
            base = first[start : start + rows, None]
            block = ordered[base + np.arange(size)]
            row, pair = np.nonzero(popcount(block[:, i] ^ block[:, j]) <= max_distance)
            yield base[row, 0] + i[pair], base[row, 0] + j[pair]


def _huge_members(
    values: np.ndarray, order: np.ndarray, starts: np.ndarray, sizes: np.ndarray, turn_tie: tuple[int, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """(bucket, index) of the members of the buckets of more than LSH_BUCKET_CAP hashes, each bucket's in the
    order of the hash rotated by `turn` bits, then of its `tie` key: an order of their content, other in each
    table."""
    huge = sizes > LSH_BUCKET_CAP
    lo, sizes = starts[huge], sizes[huge]
    group = np.repeat(np.arange(len(lo)), sizes)
    members = order[np.repeat(lo - np.cumsum(sizes) + sizes, sizes) + np.arange(len(group))]
    value, (turn, tie) = values[members], turn_tie
    turned = (value << np.uint64(turn)) | (value >> np.uint64(64 - turn))
    ranked = np.lexsort((tie[members], turned, group))
    return group[ranked], members[ranked]


def _window_pairs(ordered: np.ndarray, group: np.ndarray, max_distance: int) -> Pairs:
    """(i, j) positions within `max_distance` bits of each position i and the next HUGE_RUN_SAMPLE of its group
    (`group` sorted)."""
    live = np.flatnonzero(group[1:] == group[:-1])  # positions whose next shares their group
    step = 1
    while len(live) and step <= HUGE_RUN_SAMPLE:
        close = popcount(ordered[live] ^ ordered[live + step]) <= max_distance
        yield live[close], live[close] + step
        step += 1
        live = live[live + step < len(group)]
        live = live[group[live + step] == group[live]]
