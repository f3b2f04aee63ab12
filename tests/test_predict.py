"""project.predict: every sample exactly once with 1 and 2 processes, a killed run resumed to the same rows,
plain folders of files, Parquet, and one-line errors."""

from __future__ import annotations

import json
import math
import shutil
import tarfile
from pathlib import Path

import pytest

from project.data.files import pack_folder, pack_key, unpack_key
from project.data.samples import read_samples
from project.data.specs import resolve_shards

from .conftest import REPO, run_here, run_module
from .test_cli import assert_user_error

pytestmark = pytest.mark.slow


def all_keys(split: Path) -> list[str]:
    return [s["__key__"] for shard in resolve_shards(str(split)).shards for s in read_samples(shard.url)]


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def checkpoint(tiny_demo, tmp_path_factory) -> Path:
    """A checkpoint of a short run on the tiny demo."""
    folder = tmp_path_factory.mktemp("trained")
    args = [
        f"--data.root={tiny_demo}",
        "--data.image_size=16",
        "--data.batch_size=32",
        "--data.num_workers=0",
        "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=8",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
    ]
    result = run_here("project.train", *args, cwd=folder)
    assert result.returncode == 0, result.stderr[-3000:]
    return folder / "logs" / "demo" / "version_0" / "checkpoints" / "last.ckpt"


def predict_args(checkpoint: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return [
        f"--ckpt_path={checkpoint}",
        f"--data.predict={data}",
        f"--out={out}",
        "--data.batch_size=16",
        "--trainer.enable_progress_bar=false",
        *extra,
    ]


@pytest.fixture(scope="module")
def single(checkpoint, tiny_demo, tmp_path_factory) -> list[dict]:
    """The rows of an uninterrupted one-process predict over the tiny demo's test split (2 workers)."""
    folder = tmp_path_factory.mktemp("single")
    out = folder / "rows.jsonl"
    result = run_here("project.predict", *predict_args(checkpoint, tiny_demo / "test", out), cwd=folder)
    assert result.returncode == 0, result.stderr[-3000:]
    assert not out.with_name("rows.jsonl.parts").exists(), "the parts are removed once merged"
    return read_rows(out)


def test_one_process_predicts_every_key_exactly_once(single, tiny_demo):
    keys = [row["key"] for row in single]
    assert sorted(keys) == sorted(all_keys(tiny_demo / "test")) and len(set(keys)) == len(keys)
    classes = json.loads((tiny_demo / "test" / "shardindex.json").read_text())["classes"]
    for row in single:
        assert row["pred"] == row["top_classes"][0] == classes[row["pred_index"]]
        assert row["prob"] == row["top_probs"][0] and row["top_probs"] == sorted(row["top_probs"], reverse=True)
        assert len(row["top_classes"]) == 5 and 0 < sum(row["top_probs"]) <= 1 + 1e-5
        assert row["label"] in classes  # the demo's samples have labels: they are passed through


def test_two_processes_predict_every_key_exactly_once_with_the_same_rows(checkpoint, single, tiny_demo, tmp_path):
    out = tmp_path / "ddp.jsonl"
    ddp = ("--config", str(REPO / "configs/trainer/ddp_cpu.yaml"), "--log_probs=true")
    result = run_module("project.predict", *predict_args(checkpoint, tiny_demo / "test", out, *ddp), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_rows(out)
    assert len(rows) == len(single) and len({row["key"] for row in rows}) == len(rows)
    by_key = {row["key"]: row for row in single}
    for row in rows:
        assert row["pred"] == by_key[row["key"]]["pred"]
        assert row["prob"] == pytest.approx(by_key[row["key"]]["prob"], abs=1e-4)
        # each rank writes every class's log-probability of its own samples (for project.ensemble)
        assert math.exp(row["log_probs"][row["pred"]]) == pytest.approx(row["prob"], abs=1e-4)


def test_a_killed_predict_started_again_finishes_with_each_row_once(checkpoint, single, tiny_demo, tmp_path):
    out = tmp_path / "rows.jsonl"
    killer = json.dumps({"class_path": "tests.helpers.KillAtPredictBatch", "init_args": {"batch": 4}})
    args = predict_args(checkpoint, tiny_demo / "test", out)
    killed = run_module("project.predict", *args, f"--trainer.callbacks+={killer}", cwd=tmp_path)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not out.exists()
    progress = json.loads((tmp_path / "rows.jsonl.parts" / "rank-0.json").read_text())
    assert progress["batches"] == 4 and not progress["done"]
    # a torn last batch, as a kill while writing leaves it: cut back to the last complete batch
    with open(tmp_path / "rows.jsonl.parts" / "rank-0.jsonl", "ab") as part:
        part.write(b'{"key": "torn')
    resumed = run_module("project.predict", *args, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming after 4 batches" in resumed.stdout + resumed.stderr
    assert sorted(read_rows(out), key=lambda row: row["key"]) == sorted(single, key=lambda row: row["key"])


def test_log_probs_rows_are_the_calibrated_distribution_and_ensemble_joins_them_by_key(
    checkpoint, single, tiny_demo, tmp_path
):
    """`--log_probs true` adds every class's log-probability; two predicts of the test split in different
    batches, added by project.ensemble, give that model's accuracy and its predicted classes."""
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    for out, extra in ((first, []), (second, ["--data.batch_size=8", "--data.num_workers=1"])):
        args = [*predict_args(checkpoint, tiny_demo / "test", out, "--log_probs=true"), *extra]
        result = run_here("project.predict", *args, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
    rows, by_key = read_rows(first), {row["key"]: row for row in single}
    classes = json.loads((tiny_demo / "test" / "shardindex.json").read_text())["classes"]
    for row in rows:
        assert list(row["log_probs"]) == classes
        probs = {name: math.exp(value) for name, value in row["log_probs"].items()}
        assert sum(probs.values()) == pytest.approx(1, abs=1e-3) and max(probs, key=probs.get) == row["pred"]
        assert probs[row["pred"]] == pytest.approx(by_key[row["key"]]["prob"], abs=1e-4)
    out = tmp_path / "ensemble.jsonl"
    result = run_here("project.ensemble", str(first), str(second), f"--out={out}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    accuracy = sum(row["pred"] == row["label"] for row in single) / len(single)
    assert summary["samples"] == len(single) and summary["left_out"] == 0
    assert summary["acc"] == pytest.approx(accuracy) and set(summary["members"].values()) == {summary["acc"]}
    assert {row["key"]: row["pred"] for row in read_rows(out)} == {key: row["pred"] for key, row in by_key.items()}


def test_a_plain_folder_of_images_is_predicted_by_file_path_into_parquet(checkpoint, tiny_demo, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    folder = tmp_path / "photos"
    (folder / "sub.dir").mkdir(parents=True)
    with tarfile.open(resolve_shards(str(tiny_demo / "test")).shards[0].url) as tar:
        jpegs = [tar.extractfile(m).read() for m in tar.getmembers() if m.name.endswith(".jpg")][:5]
    names = ["a.jpg", "b.v2.JPEG", "100%.png.jpg", "sub.dir/c.jpg", "sub.dir/d.e.jpg"]
    for name, data in zip(names, jpegs, strict=True):
        (folder / name).write_bytes(data)
    (folder / "notes.txt").write_text("not an image")
    out = tmp_path / "rows.parquet"
    result = run_here("project.predict", *predict_args(checkpoint, folder, out, "--embeddings=true"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    table = pq.read_table(out).to_pylist()
    assert sorted(row["key"] for row in table) == sorted(names)
    assert all(row["label"] is None and len(row["embedding"]) > 0 for row in table)


def test_packed_keys_give_back_their_paths_and_a_changed_folder_is_packed_again(tmp_path):
    for path in ("a.b.c.jpg", "x%2E.jpg", "dir.v1/file.jpg", "plain"):
        assert unpack_key(pack_key(path)) == path and "." not in pack_key(path).rpartition("/")[2]
    folder = tmp_path / "files"
    folder.mkdir()
    (folder / "one.jpg").write_bytes(b"1")
    first = pack_folder(str(folder), frozenset({"jpg"}), cache=str(tmp_path / "cache"))
    assert pack_folder(str(folder), frozenset({"jpg"}), cache=str(tmp_path / "cache")) == first  # reused
    (folder / "two.jpg").write_bytes(b"22")
    second = pack_folder(str(folder), frozenset({"jpg"}), cache=str(tmp_path / "cache"))
    assert second != first and resolve_shards(second).nsamples == 2
    samples = list(read_samples(resolve_shards(second).shards[0].url))
    assert [unpack_key(s["__key__"]) for s in samples] == ["one.jpg", "two.jpg"]
    assert [s["jpg"] for s in samples] == [b"1", b"22"]


def test_bad_predict_arguments_are_one_line_before_any_work(checkpoint, tiny_demo, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [
        ([f"--ckpt_path={checkpoint}", f"--data.predict={tiny_demo / 'test'}"], "--out is required"),
        ([f"--ckpt_path={checkpoint}", f"--out={tmp_path / 'x.csv'}", f"--data.predict={tiny_demo}"], ".jsonl or"),
        ([f"--ckpt_path={checkpoint}", f"--out={tmp_path / 'x.jsonl'}"], "--data.predict is required"),
        ([f"--ckpt_path={tmp_path / 'none.ckpt'}", f"--out={tmp_path / 'x.jsonl'}"], "checkpoint not found"),
        (predict_args(checkpoint, empty, tmp_path / "x.jsonl"), "no shards and no files to read"),
        (predict_args(checkpoint, tiny_demo / "test", tmp_path / "x.jsonl", "--top_k=0"), "--top_k"),
    ]
    for args, fragment in cases:
        assert_user_error(run_here("project.predict", *args, cwd=tmp_path), fragment)
    assert not list(tmp_path.glob("*.jsonl*"))
    shutil.rmtree(empty)
