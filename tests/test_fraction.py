"""Data fractions: exact, nested, seed-independent training subsets that keep the epoch plan's guarantees."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from project.data.plan import fraction_counts, total_batches, train_plan
from project.errors import UserError
from project.tasks.image.data import ImageShards

from .conftest import run_here

shard_sizes = st.lists(st.integers(0, 80), min_size=1, max_size=15)
fractions = st.floats(0.001, 1.0, allow_nan=False)


@given(shard_sizes, fractions, fractions)
@settings(max_examples=400, deadline=None)
def test_fraction_counts_are_exact_nested_and_take_every_shards_share(counts, small, large):
    small, large = min(small, large), max(small, large)
    kept_small, kept_large = fraction_counts(counts, small), fraction_counts(counts, large)
    total = sum(counts)
    assert sum(kept_small) == round(small * total) and sum(kept_large) == round(large * total)
    assert all(0 <= a <= b <= n for a, b, n in zip(kept_small, kept_large, counts, strict=True)), "not nested"
    # every shard gives its share, to within a sample plus the rounding spread over the other shards
    for kept, n in zip(kept_large, counts, strict=True):
        assert abs(kept - large * n) <= 1 + n * (len(counts) / 2 + 1) / max(total, 1)
    assert fraction_counts(counts, large) == kept_large
    assert fraction_counts(counts, 1.0) == list(counts)


def test_equal_shards_give_equal_shares_within_one_sample():
    kept = fraction_counts([1000] * 7, 0.1)
    assert sum(kept) == 700 and set(kept) == {100}
    kept = fraction_counts([100] * 6, 0.25)  # 150 samples: 25 each
    assert kept == [25] * 6
    kept = fraction_counts([10] * 6, 0.05)  # 3 samples from 6 shards: one each from three of them
    assert sorted(kept) == [0, 0, 0, 1, 1, 1]


@given(shard_sizes, fractions, st.integers(1, 6), st.integers(1, 4), st.integers(1, 8))
@settings(max_examples=300, deadline=None)
def test_the_plan_on_a_fraction_stays_equal_per_rank(counts, fraction, world_size, num_workers, batch_size):
    kept = fraction_counts(counts, fraction)
    if sum(kept) < world_size * batch_size:
        return  # planning refuses this (tested in test_plan.py)
    ranks = [
        train_plan(
            kept, epoch=1, seed=3, world_size=world_size, rank=rank, num_workers=num_workers, batch_size=batch_size
        )
        for rank in range(world_size)
    ]
    assert len({total_batches(plans) for plans in ranks}) == 1
    read = [(s.shard, i) for plans in ranks for plan in plans for s in plan.segments for i in range(s.start, s.stop)]
    assert len(read) == len(set(read)) == total_batches(ranks[0]) * world_size * batch_size
    assert all(i < kept[shard] for shard, i in read), "read past the subset's prefix"


@pytest.mark.parametrize("fraction", [0.0, -0.5, 1.5])
def test_a_fraction_outside_zero_to_one_is_a_user_error(fraction):
    with pytest.raises(UserError, match=r"data.fraction must be in \(0, 1\]"):
        fraction_counts([10], fraction)
    with pytest.raises(UserError, match=r"data.fraction must be in \(0, 1\]"):
        ImageShards(root=None, fraction=fraction)


def read_split(folder, split: str, fraction: float, seed: int = 0) -> list[list[str]]:
    """The keys of every batch of one epoch of `split`, and check no batch skipped a sample."""
    module = ImageShards(
        root=str(folder), batch_size=5, num_workers=0, image_size=8, seed=seed, fraction=fraction, augment="none"
    )
    loader = module.train_dataloader() if split == "train" else module.val_dataloader()
    batches = list(loader)
    assert len(batches) == len(loader)
    assert all(not batch.skipped for batch in batches)
    return [batch.keys for batch in batches]


def test_the_data_module_trains_on_a_nested_seed_independent_prefix_and_keeps_val_whole(shard_folder, tmp_path):
    sizes = [20, 20, 20, 20]
    _, train_keys = shard_folder(sizes, "train")
    _, val_keys = shard_folder([7, 6], "val")
    # cut each training shard's tar in half: a fraction up to 0.25 must never read that far
    for shard in sorted((tmp_path / "train").glob("*.tar")):
        data = shard.read_bytes()
        shard.write_bytes(data[: len(data) // 2])
    quarter = [key for batch in read_split(tmp_path, "train", 0.25) for key in batch]
    tenth = [key for batch in read_split(tmp_path, "train", 0.1) for key in batch]
    assert len(quarter) == 20 and len(set(quarter)) == 20  # exactly 25% of 80, in whole batches of 5
    assert len(tenth) == 5 and set(tenth) <= set(quarter)  # 8 samples, one batch of 5 (a partial batch drops)
    assert {key.rsplit("_", 1)[1] for key in quarter} == {f"{i:05d}" for i in range(5)}  # 5 from each shard
    other_seed = [key for batch in read_split(tmp_path, "train", 0.25, seed=1) for key in batch]
    assert set(other_seed) == set(quarter) and other_seed != quarter  # same subset, new order
    assert sorted(key for batch in read_split(tmp_path, "val", 0.25) for key in batch) == sorted(val_keys)
    assert math.isclose(len(train_keys) * 0.25, len(quarter))


@pytest.mark.slow
def test_scaling_trains_each_fraction_and_writes_a_csv_and_a_plot(tiny_demo, tmp_path):
    args = [
        "--fractions=[0.5,0.25]",
        f"--data.root={tiny_demo}",
        "--data.image_size=16",
        "--data.batch_size=32",
        "--data.num_workers=0",
        "--trainer.max_epochs=1",
        "--trainer.limit_val_batches=1",
        "--trainer.num_sanity_val_steps=0",
        "--trainer.limit_test_batches=2",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
    ]
    result = run_here("project.scaling", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    folder = tmp_path / "logs" / "demo-scaling"
    assert f"scaling runs: {Path('logs') / 'demo-scaling'}" in result.stderr
    with (folder / "scaling.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert [(row["fraction"], row["train_samples"], row["steps"]) for row in rows] == [
        ("0.25", "150", "4"),
        ("0.5", "300", "9"),
    ]
    assert all(0 <= float(row["test/acc"]) <= 1 and float(row["fit_seconds"]) > 0 for row in rows)
    for row in rows:
        assert (tmp_path / row["run_folder"] / "checkpoints" / "best.ckpt").is_file()
    with Image.open(folder / "scaling.png") as plot:
        assert plot.format == "PNG" and plot.width > 600
