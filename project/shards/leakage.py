"""Train/test leakage in finished shards: how many val and test samples duplicate a train sample.

    python -m project.shards.inspect DIR --leakage true [--fail_on_leakage true] [--near_distance BITS]
        [--near_jaccard J]

For shards made by any tool, as long as each split has a shard index (DIR/train, DIR/val and/or DIR/test).
Every sample is hashed as `prepare --dedup near` hashes it (project/shards/dedup.py), in worker processes, a
shard per job; a val or test sample leaks when a train sample is its exact copy (the same bytes), or else
when it shares a duplicate group with one, grouped as prepare groups (near copies, and their near copies).
With --fail_on_leakage true the command exits with code 1 when any sample leaks, for CI.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from project.data.parallel import imap_unordered
from project.data.samples import read_samples
from project.data.shard_index import ShardIndex
from project.errors import UserError
from project.shards.dedup import Hasher, Hashes, require_near_text
from project.shards.matching import first_of_equal, groups, match
from project.tasks.image.decode import IMAGE_EXTENSIONS

EXAMPLES = 5  # leaked samples named per split


@dataclass(frozen=True)
class ShardJob:
    url: str
    near: bool


@dataclass
class Hashed:
    """One split's samples: keys, whether they are text, and their hashes."""

    keys: list[str]
    text: bool
    hashes: Hashes


def hash_shard(job: ShardJob) -> tuple[str, list[str], bool, Hashes]:
    """The keys and hashes of one shard's samples (image members, or else .txt)."""
    keys, hasher, text = [], None, False
    for sample in read_samples(job.url):
        extension = next((e for e in IMAGE_EXTENSIONS if e in sample), None)
        if extension is None and "txt" not in sample:
            continue
        if hasher is None:
            text = extension is None
            if text and job.near:
                require_near_text()
            hasher = Hasher("near" if job.near else "exact", text)
        keys.append(sample["__key__"])
        hasher.add(sample["txt"] if extension is None else sample[extension])
    return job.url, keys, text, (hasher or Hasher("near" if job.near else "exact", False)).result()


def hash_splits(splits: dict[str, ShardIndex], near: bool, workers: int, quiet: bool = False) -> dict[str, Hashed]:
    jobs = [ShardJob(shard.url, near) for index in splits.values() for shard in index.shards]
    done: dict[str, tuple[list[str], bool, Hashes]] = {}
    columns = (TextColumn("hash"), BarColumn(), MofNCompleteColumn(), TextColumn("shards"))
    with Progress(*columns, disable=quiet, transient=True, console=Console(stderr=True)) as progress:
        task = progress.add_task("hash", total=len(jobs))
        for url, keys, text, hashes in imap_unordered(hash_shard, jobs, workers):
            done[url] = (keys, text, hashes)
            progress.advance(task)
    result = {}
    for split, index in splits.items():
        parts = [done[shard.url] for shard in index.shards if done[shard.url][0]]
        text = any(part[1] for part in parts)
        if parts and len({part[1] for part in parts}) > 1:
            raise UserError(f"{split} mixes image and text samples: the leakage check compares one kind")
        hashes = Hashes.concat([part[2] for part in parts]) if parts else Hasher("exact", False).result()
        result[split] = Hashed([key for part in parts for key in part[0]], text, hashes)
    return result


@dataclass
class Leaks:
    """The samples of one split that duplicate a train sample: exact copies, and near copies (not exact)."""

    split: str
    samples: int
    exact: list[int] = field(default_factory=list)
    near: list[int] = field(default_factory=list)
    examples: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.exact) + len(self.near)

    def line(self) -> str:
        return (
            f"{self.split}: {self.total} of {self.samples} samples duplicate train samples "
            f"({len(self.exact)} exact, {len(self.near)} near)"
        )


def leaks(train: Hashed, other: Hashed, split: str, near_distance: int, near_jaccard: float) -> Leaks:
    """Which samples of `other` have a copy in `train`: those in one duplicate group with a train sample, as
    `prepare --dedup near` would group them (`matching.groups`). Train comes first, so a group's label, its
    smallest member, is a train sample whenever the group holds one."""
    if train.hashes.digest.size and other.hashes.digest.size and train.text != other.text:
        raise UserError(f"train holds {'text' if train.text else 'images'} and {split} does not: nothing to compare")
    n = len(train.hashes)
    both = Hashes.concat([train.hashes, other.hashes])
    first, labels = first_of_equal(both.digest)[n:], groups(both, near_distance, near_jaccard)[n:]
    exact = np.flatnonzero(first < n)
    near = np.flatnonzero((labels < n) & (first >= n))
    found = Leaks(split, len(other.hashes), exact.tolist(), near.tolist())
    partner = {
        **dict(zip(exact.tolist(), first[exact].tolist(), strict=True)),
        **dict(zip(near.tolist(), labels[near].tolist(), strict=True)),
    }
    for i, t in sorted(partner.items())[:EXAMPLES]:
        found.examples.append(f"  {split}/{other.keys[i]} = train/{train.keys[t]} ({match(both, t, n + i)})")
    return found


def check(
    splits: dict[str, ShardIndex], near_distance: int, near_jaccard: float, workers: int, quiet: bool = False
) -> list[Leaks]:
    """The leaks of every split but train into train."""
    if "train" not in splits or len(splits) < 2:
        raise UserError("--leakage needs DIR/train and DIR/val or DIR/test, each with a shardindex.json")
    hashed = hash_splits(splits, near=True, workers=workers, quiet=quiet)
    return [
        leaks(hashed["train"], hashed[split], split, near_distance, near_jaccard)
        for split in splits
        if split != "train"
    ]
