"""project.active: a loop end to end and resumed, the human oracle's round trip, and appends that a kill
cannot tear."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from project.active import labeled as labeled_set
from project.data.samples import count_samples, read_samples
from project.data.shard_index import INDEX_NAME, read_index
from project.data.specs import resolve_shards

from .conftest import REPO, run_here, write_shards
from .test_cli import assert_user_error


def keys_of(folder: Path) -> list[str]:
    return [key for key, _ in labeled_set.pool_keys(read_index(str(folder / INDEX_NAME)))]


def active_args(pool: Path, labeled: Path, run: Path, *extra: str) -> list[str]:
    return [
        f"--pool={pool}",
        f"--labeled={labeled}",
        f"--run={run}",
        "--budget=20",
        "--initial=20",
        f"--data.root={pool.parent}",
        "--data.image_size=16",
        "--data.batch_size=8",
        "--trainer.max_steps=8",
        "--trainer.enable_progress_bar=false",
        *extra,
    ]


@pytest.mark.slow
def test_a_two_round_loop_runs_end_to_end_and_a_second_run_only_reports(tiny_demo, tmp_path):
    pool, labeled, run = tiny_demo / "train", tmp_path / "labeled", tmp_path / "run"
    args = active_args(pool, labeled, run, "--rounds=2", "--strategy=margin,kcenter")
    result = run_here("project.active", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    pool_keys = set(all_pool := [key for key, _ in labeled_set.pool_keys(resolve_shards(str(pool)))])
    assert len(pool_keys) == len(all_pool)
    seed_set = keys_of(labeled / "initial" / "seed_0")
    for strategy in ("margin", "kcenter"):
        keys = keys_of(labeled / strategy / "seed_0")
        assert len(keys) == 60 and len(set(keys)) == 60, "a key was selected twice"
        assert keys[:20] == seed_set and set(keys) <= pool_keys  # the same seed set for every strategy
        state = json.loads((run / strategy / "seed_0" / "state.json").read_text())
        assert state["status"] == "done" and [r["labeled"] for r in state["rounds"]] == [20, 40, 60]
        rounds = [run / strategy / "seed_0" / f"round_{r}" / "selected.csv" for r in (0, 1)]
        assert [row["key"] for path in rounds for row in csv.DictReader(open(path))] == keys[20:]  # noqa: SIM115
        # the labels come from the pool (simulated oracle), member for member
        round_shard = labeled / strategy / "seed_0" / "round-0001.tar"
        original = {s["__key__"]: s for shard in resolve_shards(str(pool)).shards for s in read_samples(shard.url)}
        for sample in read_samples(str(round_shard)):
            assert sample["cls"] == original[sample["__key__"]]["cls"]
    with open(run / "curves.csv", newline="") as stream:
        assert len(list(csv.DictReader(stream))) == 6  # 2 strategies x 3 points
    assert (run / "curves.png").stat().st_size > 1000
    assert len(list((run / "tensorboard").glob("*/events.*"))) == 2
    assert "margin: test/acc (labels)" in result.stdout and "random" not in (run / "curves.csv").read_text()

    labeled_before, rounds_before = keys_of(labeled / "margin" / "seed_0"), (run / "rounds.csv").read_text()
    again = run_here("project.active", *args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "training on" not in again.stderr, "a finished round was trained again"
    assert keys_of(labeled / "margin" / "seed_0") == labeled_before
    assert (run / "rounds.csv").read_text() == rounds_before


@pytest.mark.slow
def test_the_human_oracle_asks_ingests_good_rows_and_rejects_bad_ones(tiny_demo, tmp_path):
    pool, labeled, run = tiny_demo / "train", tmp_path / "labeled", tmp_path / "run"
    args = active_args(pool, labeled, run, "--rounds=1", "--strategy=entropy", "--oracle=human")
    first = run_here("project.active", *args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    request = run / "initial" / "seed_0" / "to_label.csv"
    assert "to_label.csv" in first.stderr and not (labeled / INDEX_NAME).exists()
    asked = [row["key"] for row in csv.DictReader(open(request))]  # noqa: SIM115
    assert len(asked) == 20 and (request.parent / "to_label.png").exists()
    # every answer "ring" (not the pool's labels), plus bad rows: an unknown class, a key not asked for,
    # a key given twice, and one left blank
    rows = [[key, "ring"] for key in asked[:17]] + [[asked[17], "giraffe"], ["not-asked", "ring"]]
    rows += [[asked[18], "ring"], [asked[18], "star"], [asked[19], ""]]
    with open(request, "w", newline="") as stream:
        csv.writer(stream).writerows([["key", "label"], *rows])
    second = run_here("project.active", *args, cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    problems = [line for line in second.stderr.splitlines() if line.startswith("to_label.csv line")]
    assert len(problems) == 4, second.stderr[-2000:]  # giraffe, not-asked, and both rows of the duplicate
    assert sorted(keys_of(labeled)) == sorted(asked[:17])
    assert {s["cls"] for s in read_samples(str(labeled / "initial.tar"))} == {b"1"}  # the human's, not the pool's
    round_request = run / "entropy" / "seed_0" / "round_0" / "to_label.csv"
    assert round_request.exists() and (run / "entropy" / "seed_0" / "round_0" / "metrics.json").exists()
    new = [row["key"] for row in csv.DictReader(open(round_request))]  # noqa: SIM115
    assert not set(new) & set(asked[:17])
    with open(round_request, "w", newline="") as stream:
        csv.writer(stream).writerows([["key", "label"], *[[key, "star"] for key in new]])
    third = run_here("project.active", *args, cwd=tmp_path)
    assert third.returncode == 0, third.stderr[-3000:]
    assert len(keys_of(labeled)) == 37
    state = json.loads((run / "entropy" / "seed_0" / "state.json").read_text())
    assert state["status"] == "done" and [r["labeled"] for r in state["rounds"]] == [17, 37]


KILLER = """
import os, sys
from pathlib import Path
from project.active import labeled
from project.data import tarwriter
point = sys.argv[1]
folder = Path(sys.argv[2])
samples = [{"__key__": f"new_{i}", "cls": b"1", "jpg": bytes(2000)} for i in range(5)]
def die():
    os.kill(os.getpid(), 9)
real_write, real_fsync, real_replace = tarwriter.FastTarWriter.write, os.fsync, os.replace
calls = []
def write(self, sample):
    calls.append(1)
    if len(calls) == 3:
        self.stream.flush(); die()
    real_write(self, sample)
def fsync(fd):
    real_fsync(fd); die()
def replace(source, target):
    if point == "before index rename" and str(target).endswith("shardindex.json"):
        die()
    real_replace(source, target)
    if point == "after index rename" and str(target).endswith("shardindex.json"):
        die()
if point == "mid shard": tarwriter.FastTarWriter.write = write
if point == "shard synced": os.fsync = fsync
if point == "shard renamed": labeled.write_index = lambda *a, **k: die()
if point in ("before index rename", "after index rename"): os.replace = replace
labeled.append(folder, "round-0001.tar", samples)
"""


@pytest.mark.parametrize(
    "point", ["mid shard", "shard synced", "shard renamed", "before index rename", "after index rename"]
)
def test_a_kill_during_the_append_leaves_the_index_before_or_after_it(point, tmp_path):
    pool = tmp_path / "pool"
    write_shards(pool, [6])
    folder = tmp_path / "labeled"
    labeled_set.start(folder, resolve_shards(str(pool)), resolve_shards(str(pool)))
    before = keys_of(folder)
    killed = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(KILLER), point, str(folder)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO)},
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    index = read_index(str(folder / INDEX_NAME))  # parses: never half written
    for shard in index.shards:
        assert count_samples(shard.url) == shard.nsamples
    after = [*before, *(f"new_{i}" for i in range(5))]
    assert keys_of(folder) in (before, after)
    assert (keys_of(folder) == after) == (point == "after index rename")
    samples = [{"__key__": f"new_{i}", "cls": b"1", "jpg": bytes(2000)} for i in range(5)]
    labeled_set.append(folder, "round-0001.tar", samples)  # the command run again finishes the append
    assert keys_of(folder) == after
    assert not list(folder.glob(".*.tmp")), "a temporary file was left behind"


def test_bad_active_arguments_are_one_line_before_any_training(tiny_demo, tmp_path):
    pool = tiny_demo / "train"
    (tmp_path / "loose").mkdir()
    (tmp_path / "loose" / "a.tar").write_bytes(b"")
    base = [f"--pool={pool}", "--rounds=1", f"--data.root={tiny_demo}"]
    cases = [
        ([*base, "--labeled=x", "--budget=0"], "--budget must be at least 1"),
        ([*base, "--labeled=x", "--budget=10", "--strategy=entropy,bald"], "'bald'"),
        ([*base, "--labeled=x", "--budget=1000"], "fewer than the"),
        ([*base, f"--labeled={tmp_path / 'loose'}", "--budget=10"], "holds shards but no shardindex.json"),
        ([*base, "--labeled=x", "--budget=10", "--data.train=y"], "--data.train cannot be set"),
    ]
    for args, fragment in cases:
        assert_user_error(run_here("project.active", *args, cwd=tmp_path), fragment)
    misspelled = run_here("project.active", *base, "--labeled=x", "--budget=10", "--model.nope=1", cwd=tmp_path)
    assert misspelled.returncode == 2 and "Traceback" not in misspelled.stderr and "nope" in misspelled.stderr
    assert not (tmp_path / "logs").exists() and not (tmp_path / "x").exists()


def test_the_default_seed_set_is_at_least_one_batch(tiny_demo, tmp_path):
    from project.active.run import parse_args, settings_from

    common = [f"--pool={tiny_demo / 'train'}", f"--labeled={tmp_path / 'labeled'}", "--budget=10", "--rounds=1"]
    *_, initial = settings_from(*parse_args([*common, f"--data.root={tiny_demo}"]))
    assert initial == 32  # configs/active/default.yaml's batch_size: 1% of the 600 samples would be 6
    *_, initial = settings_from(*parse_args([*common, "--data.batch_size=4", f"--data.root={tiny_demo}"]))
    assert initial == 6
