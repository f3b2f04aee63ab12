"""Which samples match: groups of exact and near copies from their hashes (project/shards/dedup.py).

Never all pairs: near images through project/shards/phash_search.py (an exact multi-index over blocks of the
pHash while the images are few, bit sampling past that), near texts through LSH banding of the MinHash
signatures. Candidates are checked on the whole hash, phash_search.CHUNK at a time, which bounds the memory of the
search.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from project.shards.dedup import DEFAULT_NEAR_DISTANCE, DEFAULT_NEAR_JACCARD, NUM_PERM, THUMB_DIFFERENCE, Hashes
from project.shards.phash_search import LSH_FROM, close_pairs, expand, popcount, tie_keys


class Forest:
    """Union-find over n samples, in numpy: every parent is at most its child, so a root is its group's
    smallest member, and unions go a batch of pairs at a time (hooking roots, then compressing paths)."""

    def __init__(self, parent: np.ndarray):
        self.parent = np.asarray(parent, dtype=np.int64)  # parent[i] <= i

    def roots(self) -> np.ndarray:
        """Each sample's root (and the paths compressed to it)."""
        while True:
            grand = self.parent[self.parent]
            if np.array_equal(grand, self.parent):
                return self.parent
            self.parent = grand

    def joined(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Whether each pair (a[k], b[k]) is in one group already."""
        roots = self.roots()
        return roots[a] == roots[b]

    def union_arrays(self, a: np.ndarray, b: np.ndarray) -> None:
        while len(a):
            roots = self.roots()
            ra, rb = roots[a], roots[b]
            apart = ra != rb
            a, b, ra, rb = a[apart], b[apart], ra[apart], rb[apart]
            np.minimum.at(self.parent, np.maximum(ra, rb), np.minimum(ra, rb))  # a root may take one of several

    def labels(self) -> np.ndarray:
        return self.roots().copy()


def first_of_equal(values: np.ndarray) -> np.ndarray:
    """For each row, the index of the first row equal to it (rows of a 2-D array, or values of a 1-D one)."""
    if len(values) == 0:
        return np.zeros(0, dtype=np.int64)
    keys = values if values.ndim == 1 else np.ascontiguousarray(values).view(f"V{values.shape[1] * values.itemsize}")
    _, first, inverse = np.unique(keys.ravel(), return_index=True, return_inverse=True)
    return first[inverse.ravel()]


def thumb_difference(thumbs: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The mean absolute difference between the thumbnails of each pair (a[k], b[k])."""
    return np.abs(thumbs[a].astype(np.int16) - thumbs[b]).mean(axis=(1, 2, 3))


def phash_pairs(
    values: np.ndarray,
    max_distance: int,
    thumbs: np.ndarray | None = None,
    rows: np.ndarray | None = None,
    joined: Callable | None = None,
    *,
    lsh_from: int = LSH_FROM,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Index pairs (i < j) of 64-bit `values` within `max_distance` differing bits, in chunks (a pair may come
    more than once); with `thumbs`, only those whose thumbnails (value i's at thumbs[rows[i]]) differ by at
    most THUMB_DIFFERENCE. `joined(i, j)`, if given, says which pairs are known to match already: they are
    neither checked nor yielded.

    project/shards/phash_search.py finds the pairs within `max_distance`: below `lsh_from` hashes all of them (an
    exact multi-index), from there each pair at `max_distance` with probability 0.99 or more, a closer one with
    more (bit sampling, in about n log n a table). Either way the pairs found depend on the hashes alone, never on
    their order, and a huge run (thousands of frames of one video) is compared in time linear in its size: each
    hash with a few neighbours in the order of the hash; near copies still join through chains of neighbours."""
    for query, other in close_pairs(values, max_distance, tie_keys(values, thumbs, rows), lsh_from):
        if joined is not None and len(query):
            new = ~joined(query, other)
            query, other = query[new], other[new]
        if thumbs is not None and len(query):
            pair = (query, other) if rows is None else (rows[query], rows[other])
            alike = thumb_difference(thumbs, *pair) <= THUMB_DIFFERENCE
            query, other = query[alike], other[alike]
        yield query, other


def lsh_bands(threshold: float) -> tuple[int, int]:
    """(bands, rows): the most rows per band (fewest candidates) that still make a pair at the threshold a
    candidate with probability 0.99 or more."""
    best = (NUM_PERM, 1)
    for rows in range(1, NUM_PERM + 1):
        bands = NUM_PERM // rows
        if 1 - (1 - threshold**rows) ** bands >= 0.99:
            best = (bands, rows)
    return best


def minhash_pairs(
    signatures: np.ndarray, threshold: float, content: np.ndarray, rows: np.ndarray | None = None
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Index pairs (i < j) of signatures with an estimated Jaccard similarity of at least `threshold`: the
    candidates share a band; each is checked on the whole signature. Signature i is `signatures[rows[i]]` (all of
    them, without `rows`: no copy of the signatures is made), and `content[i]` its sample's rank in an order of
    the samples' content alone (`content_ranks`)."""
    bands, width = lsh_bands(threshold)
    if rows is None:
        rows = np.arange(len(signatures))
    # a bucket's first member is the one of least content rank, not of least index: which pairs are found then
    # depends on the texts alone, never on the records' order (parts list them in another order than one machine)
    for band in range(bands):
        part = np.ascontiguousarray(signatures[rows, band * width : (band + 1) * width])
        _, bucket = np.unique(part.view(f"V{width * 4}").ravel(), return_inverse=True)
        del part
        order = np.lexsort((content, bucket.ravel()))
        ordered = bucket.ravel()[order]
        del bucket
        starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
        sizes = np.diff(np.r_[starts, len(ordered)])
        # each member of a bucket against the bucket's first: enough to join the bucket's matches into one group
        counts = np.zeros(len(ordered), dtype=np.int64)
        counts[starts[sizes > 1]] = sizes[sizes > 1] - 1
        for query, position in expand(counts, np.arange(len(ordered)) + 1):
            a, b = order[query], order[position]
            similar = (signatures[rows[a]] == signatures[rows[b]]).mean(axis=1) >= threshold
            yield np.minimum(a, b)[similar], np.maximum(a, b)[similar]


def content_ranks(digests: np.ndarray) -> np.ndarray:
    """Each sample's rank in the order of its content digest (SHA-256, as uint64 words): an order that depends on
    the samples alone, whatever order they are listed in (equal digests are one sample's exact copies)."""
    words = np.ascontiguousarray(digests).view(np.uint64).reshape(len(digests), -1)
    order = np.lexsort(words.T[::-1])  # by the first word, then the next, ...
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return rank


def groups(
    hashes: Hashes, near_distance: int = DEFAULT_NEAR_DISTANCE, near_jaccard: float = DEFAULT_NEAR_JACCARD
) -> np.ndarray:
    """Each sample's group: the index of the group's first sample. Exact copies always join; with near
    hashes, so do near copies (and their near copies: a group is a connected component)."""
    n = len(hashes)
    first = first_of_equal(hashes.digest)
    forest = Forest(first)  # each exact copy points at the first; only the first is searched
    distinct = np.flatnonzero(first == np.arange(n))
    if hashes.phash is not None:
        distinct = distinct[hashes.phash_ok[distinct]]

        def joined(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            return forest.joined(distinct[a], distinct[b])

        for a, b in phash_pairs(hashes.phash[distinct], near_distance, hashes.thumb, distinct, joined):
            forest.union_arrays(distinct[a], distinct[b])
    if hashes.minhash is not None:
        content = content_ranks(hashes.digest[distinct])
        for a, b in minhash_pairs(hashes.minhash, near_jaccard, content, rows=distinct):
            forest.union_arrays(distinct[a], distinct[b])
    return forest.labels()


def match(hashes: Hashes, a: int, b: int) -> str:
    """How sample b matches sample a, for the report: "exact", "N bits" (pHash) or "jaccard J"."""
    if (hashes.digest[a] == hashes.digest[b]).all():
        return "exact"
    if hashes.phash is not None:
        bits = int(popcount(hashes.phash[[a]] ^ hashes.phash[[b]])[0])
        return f"{bits} bits, {float(thumb_difference(hashes.thumb, np.array([a]), np.array([b]))[0]):.1f}"
    if hashes.minhash is not None:
        return f"jaccard {(hashes.minhash[a] == hashes.minhash[b]).mean():.2f}"
    return "near"
