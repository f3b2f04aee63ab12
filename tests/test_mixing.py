"""Shards written in class order are told apart from shuffled ones, and `index` and `inspect` say so in one line."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest
from webdataset import TarWriter

from project.shards import index as index_tool
from project.shards import inspect as inspect_tool
from project.shards.mixing import label_mixing, sorted_warning
from tests.conftest import jpeg


def test_one_class_per_shard_is_sorted_and_a_shuffle_is_not():
    rng = random.Random(0)
    labels = [c for c in range(10) for _ in range(100)]
    sorted_shards = [Counter(labels[i : i + 100]) for i in range(0, 1000, 100)]
    assert label_mixing(sorted_shards) == 0.0 and sorted_warning(sorted_shards)
    rng.shuffle(labels)
    shuffled = [Counter(labels[i : i + 100]) for i in range(0, 1000, 100)]
    assert label_mixing(shuffled) > 0.9 and sorted_warning(shuffled) is None
    # two classes a shard: sorted still (log 2 of log 10 is 0.3)
    pairs = [Counter(labels) for labels in ([2 * k] * 50 + [2 * k + 1] * 50 for k in range(5))]
    assert 0.25 < label_mixing(pairs) < 0.35 and sorted_warning(pairs)


def test_small_shards_of_many_classes_are_not_called_sorted():
    """A shard of 5 samples cannot hold 100 classes: its mixing is measured against what 5 samples can show."""
    rng = random.Random(1)
    labels = [rng.randrange(100) for _ in range(500)]
    assert label_mixing([Counter(labels[i : i + 5]) for i in range(0, 500, 5)]) > 0.9


@pytest.mark.parametrize("counts", [[], [Counter({"a": 10})], [Counter({"a": 5}), Counter({"a": 7})]])
def test_it_does_not_guess_with_one_shard_or_one_class(counts):
    assert label_mixing(counts) is None and sorted_warning(counts) is None


def class_ordered_shards(folder: Path, classes: int = 4, per_class: int = 12) -> None:
    """One shard per class, as a tool that reads a class folder at a time writes them."""
    folder.mkdir(parents=True)
    for label in range(classes):
        with TarWriter(str(folder / f"part-{label}.tar"), encoder=False) as writer:
            for i in range(per_class):
                writer.write({"__key__": f"c{label}_{i:03d}", "jpg": jpeg(i), "cls": str(label).encode()})


def test_index_and_inspect_warn_about_sorted_shards(tmp_path, capsys):
    shards = tmp_path / "sorted"
    class_ordered_shards(shards)
    index_tool.main([str(shards), "--out", str(shards / "shardindex.json")])
    said = capsys.readouterr().out
    assert "look sorted by label (their labels are 0% as mixed" in said and "data.mix_shards (32)" in said
    inspect_tool.main([str(shards / "shardindex.json"), "--sheet", str(tmp_path / "sheet.png")])
    said = capsys.readouterr().out
    assert said.count("look sorted by label") == 1


def test_index_says_nothing_of_mixed_shards(tmp_path, capsys):
    shards = tmp_path / "mixed"
    shards.mkdir()
    for number in range(3):
        with TarWriter(str(shards / f"part-{number}.tar"), encoder=False) as writer:
            for i in range(12):
                writer.write({"__key__": f"s{number}_{i:03d}", "jpg": jpeg(i), "cls": str(i % 4).encode()})
    index_tool.main([str(shards), "--out", str(shards / "shardindex.json")])
    assert "sorted" not in capsys.readouterr().out
