"""The demo task: deterministic for a seed, balanced, and written as indexed shards."""

from __future__ import annotations

import hashlib
import json

from project.data.samples import read_samples
from project.data.shard_index import INDEX_NAME
from project.data.specs import resolve_shards
from project.tasks.image.demo import CLASSES, SPLITS, demo_is_complete, make_demo


def digest(root) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*.tar"))}


def test_same_seed_same_bytes_whatever_the_workers_and_other_seed_differs(tmp_path):
    small = dict(train=60, val=20, test=20, image_size=16, samples_per_shard=25, quiet=True)
    one = make_demo(tmp_path / "a", seed=3, workers=1, **small)
    two = make_demo(tmp_path / "b", seed=3, workers=2, **small)
    other = make_demo(tmp_path / "c", seed=4, workers=1, **small)
    assert digest(one) == digest(two)
    assert len(digest(one)) == 3 + 1 + 1  # 60/25 -> 3 train shards, one each for val and test
    assert digest(one) != digest(other)


def test_splits_are_indexed_balanced_and_labelled(tmp_path):
    root = make_demo(tmp_path, train=50, val=30, test=30, image_size=16, samples_per_shard=20, workers=1, quiet=True)
    assert demo_is_complete(root)
    for split in SPLITS:
        data = json.loads((root / split / INDEX_NAME).read_text())
        assert data["__kind__"] == "wids-shard-index-v1" and data["classes"] == CLASSES
        index = resolve_shards(str(root / split))
        labels = [int(s["cls"]) for shard in index.shards for s in read_samples(shard.url)]
        assert (
            len(labels)
            == index.nsamples
            == data["shardlist"][0]["nsamples"] + sum(e["nsamples"] for e in data["shardlist"][1:])
        )
        counts = [labels.count(c) for c in range(len(CLASSES))]
        assert max(counts) - min(counts) <= 1


def test_an_interrupted_demo_is_incomplete(tmp_path):
    root = make_demo(tmp_path, train=10, val=10, test=10, image_size=16, workers=1, quiet=True)
    (root / "val" / INDEX_NAME).unlink()
    assert not demo_is_complete(root)
