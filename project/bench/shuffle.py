"""Shuffle quality: the per-batch label entropy of a training order against a full random permutation's
(used by the bench's `shuffle_entropy` and by benchmarks/shuffle_quality.py)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

TRIALS = 5  # random permutations averaged for the reference


def batch_entropy(labels: Sequence[int], batch_size: int) -> float:
    """Mean over the full batches of consecutive `labels` of the entropy (bits) of a batch's label histogram."""
    labels = np.asarray(labels, dtype=np.int64)
    full = len(labels) // batch_size * batch_size
    if full == 0:
        return 0.0
    entropies = []
    for batch in labels[:full].reshape(-1, batch_size):
        shares = np.bincount(batch) / batch_size
        shares = shares[shares > 0]
        entropies.append(float(-(shares * np.log2(shares)).sum()))
    return float(np.mean(entropies))


def entropy_ratio(labels: Sequence[int], batch_size: int, seed: int = 0) -> float:
    """`batch_entropy` of the order over that of a full random permutation of the same labels."""
    rng = np.random.default_rng(seed)
    reference = np.mean([batch_entropy(rng.permutation(labels), batch_size) for _ in range(TRIALS)])
    return batch_entropy(labels, batch_size) / reference if reference > 0 else 1.0
