"""Whether shards look sorted by label: each shard's label entropy against the whole set's.

Many tools write shards in class order (a folder per class, read in turn). Read one after another, shards of one
class each would give batches of one or two classes; the training loader reads up to `data.mix_shards` shards
side by side, so its batches mix as many classes (benchmarks/README.md, "Shuffle quality"). `index` and `inspect`
say so in one line; `prepare` shuffles samples before sharding, so re-sharding with it mixes them fully.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

SORTED_BELOW = 0.5  # a shard's labels less than half as mixed as they could be: sorted, or nearly
ADVICE = (
    "the training loader reads up to data.mix_shards (32) shards side by side, so batches still mix their "
    "classes; past that many classes, raise data.mix_shards or re-shard with "
    "python -m project.shards.prepare SHARDS --out DIR, which shuffles first"
)


def entropy(counts: Counter) -> float:
    total = sum(counts.values())
    return -sum(n / total * math.log(n / total) for n in counts.values() if n) if total else 0.0


def label_mixing(shards: Sequence[Counter]) -> float | None:
    """How mixed the shards' labels are: the sample-weighted mean, over shards, of a shard's label entropy over
    the most it could be (the whole set's entropy, or log of the shard's size when that is smaller). About 1 for
    shuffled shards, 0 for shards of one class each; None when it cannot tell (one shard, or one class)."""
    labelled = [counts for counts in shards if sum(counts.values())]
    whole = Counter()
    for counts in labelled:
        whole.update(counts)
    overall = entropy(whole)
    if len(labelled) < 2 or overall <= 0:
        return None
    total = sum(whole.values())
    mixing = 0.0
    for counts in labelled:
        size = sum(counts.values())
        most = min(overall, math.log(size)) if size > 1 else 0.0
        mixing += size / total * (entropy(counts) / most if most > 0 else 1.0)
    return mixing


def sorted_warning(shards: Sequence[Counter]) -> str | None:
    """One line when the shards look sorted by label, else None."""
    mixing = label_mixing(shards)
    if mixing is None or mixing >= SORTED_BELOW:
        return None
    return f"warning: the shards look sorted by label (their labels are {mixing:.0%} as mixed as a shuffle's): {ADVICE}"
