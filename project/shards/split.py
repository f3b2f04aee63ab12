"""How `prepare` splits the samples and groups them into shards."""

from __future__ import annotations

import numpy as np

from project.shards.records import Record

SPLITS = ("train", "val", "test")
MEMBER_OVERHEAD = 1536  # tar headers and padding of one sample's two members, for --shard_size


def split_records(records: list[Record], val: float, test: float, seed: int) -> dict[str, list[Record]]:
    """Stratified, deterministic split: within each class, a seeded permutation of the sorted keys."""
    splits: dict[str, list[Record]] = {split: [] for split in SPLITS}
    fixed = [r for r in records if r.split is not None]
    for record in fixed:
        splits[record.split].append(record)
    free = [r for r in records if r.split is None]
    has_fixed_test = any(r.split == "test" for r in fixed)
    by_class: dict[int, list[Record]] = {}
    for record in free:
        by_class.setdefault(record.label, []).append(record)
    for label, members in sorted(by_class.items()):
        members.sort(key=lambda r: r.key)
        order = np.random.default_rng([seed, label]).permutation(len(members))
        n_test = 0 if has_fixed_test else round(len(members) * test)
        n_val = round(len(members) * val)
        for rank, index in enumerate(order):
            split = "test" if rank < n_test else "val" if rank < n_test + n_val else "train"
            splits[split].append(members[index])
    for number, split in enumerate(SPLITS):  # shards should mix classes: shuffle before sharding
        ordered = sorted(splits[split], key=lambda r: r.key)
        order = np.random.default_rng([seed, 1000 + number]).permutation(len(ordered))
        splits[split] = [ordered[i] for i in order]
    return splits


def plan_shards(records: list[Record], samples_per_shard: int, shard_bytes: int | None) -> list[list[Record]]:
    """Consecutive groups of at most `samples_per_shard` samples (and about `shard_bytes` bytes)."""
    shards, current, size = [], [], 0
    for record in records:
        grow = record.size + MEMBER_OVERHEAD
        if current and (len(current) >= samples_per_shard or (shard_bytes and size + grow > shard_bytes)):
            shards.append(current)
            current, size = [], 0
        current.append(record)
        size += grow
    if current:
        shards.append(current)
    return shards
