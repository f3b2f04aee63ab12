"""`python -m project.baseline`: TF-IDF and a linear SVM fitted on the training split as training reads it, its C
chosen on val, test accuracy printed, in TensorBoard and in baseline.json; and what that file gives every
training run on the same splits (project/callbacks/baseline.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from project.callbacks.baseline import MAX_BYTES, read_baseline
from project.tasks.text import TextShards
from project.tasks.text.linear import read_split

from .conftest import REPO, run_here
from .test_text import make_text_data, split_samples

pytest.importorskip("sklearn")
CONFIGS = ["--config", str(REPO / "configs" / "text" / "demo.yaml"), "--config", str(REPO / "tests" / "text.yaml")]


def scalars(run: Path) -> dict[str, list[float]]:
    events = EventAccumulator(str(run))
    events.Reload()
    return {tag: [event.value for event in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return make_text_data(tmp_path_factory.mktemp("texts"))


@pytest.fixture(scope="module")
def measured(root, tmp_path_factory) -> tuple[Path, str, dict]:
    folder = tmp_path_factory.mktemp("baseline")
    result = run_here("project.baseline", f"--data.root={root}", "--quiet=true", cwd=folder)
    assert result.returncode == 0, result.stderr[-3000:]
    return folder, result.stdout, json.loads((root / "train" / "baseline.json").read_text())


def test_it_picks_C_on_val_and_reports_test_accuracy_where_the_user_looks(measured):
    folder, stdout, report = measured
    by_C = {float(C): accuracy for C, accuracy in report["val_acc_by_C"].items()}
    assert sorted(by_C) == [0.03, 0.1, 0.3, 1.0, 3.0]
    assert report["val_acc"] == max(by_C.values()) == by_C[report["C"]]
    assert report["texts"] == {"train": 480, "val": 60, "test": 60} and report["skipped"] == 0
    assert report["test_acc"] >= 0.5, report  # 8 classes: chance is 0.125
    line = stdout.strip().splitlines()[-1]  # one line on stdout: the bars go to stderr
    assert f"val/acc {report['val_acc']:.4f}, test/acc {report['test_acc']:.4f}" in line, line
    logged = scalars(folder / "logs" / "text" / "baseline")  # the experiment of configs/text/default.yaml
    assert logged["val/acc"] == pytest.approx([report["val_acc"]]) and logged["test/acc"] == pytest.approx(
        [report["test_acc"]]
    )


def test_it_reads_what_training_reads(root):
    """Every text of a split with its label; with data.fraction, the same prefix of each shard as training."""
    data = TextShards(root=str(root), num_workers=0)
    test = read_split(data, "test", quiet=True)
    assert sorted(test.texts) == sorted(split_samples(root, "test").values()) and test.skipped == 0
    assert all(0 <= label < len(data.classes) for label in test.labels)
    half = TextShards(root=str(root), num_workers=0, fraction=0.5)
    assert len(read_split(half, "train", quiet=True).texts) == sum(s.nsamples for s in half.shards("train")) == 240


@pytest.mark.slow
def test_a_training_run_on_the_same_splits_logs_the_baseline_beside_its_own(root, measured, tmp_path):
    _, _, report = measured
    args = [*CONFIGS, f"--data.root={root}", "--trainer.max_epochs=2"]
    result = run_here("project.train", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    logged = scalars(tmp_path / "logs" / "text-demo" / "version_0")
    assert logged["val/acc_baseline"] == pytest.approx([report["val_acc"]] * 2)  # one a validation, no sanity check
    assert logged["test/acc_baseline"] == pytest.approx([report["test_acc"]])
    ours = logged["test/acc"][-1]
    assert f"test/acc {ours:.4f}: " in result.stdout + result.stderr
    assert f"the linear baseline's {report['test_acc']:.4f}" in result.stdout + result.stderr

    other = run_here("project.train", *args, "--data.fraction=0.5", "--trainer.max_epochs=1", cwd=tmp_path)
    assert other.returncode == 0, other.stderr[-3000:]
    assert "baseline.json was measured on other splits" in other.stdout + other.stderr
    assert "val/acc_baseline" not in scalars(tmp_path / "logs" / "text-demo" / "version_1")


def test_a_baseline_file_that_is_not_one_is_ignored(tmp_path):
    path = tmp_path / "baseline.json"
    good = {"fingerprint": "f" * 64, "val_acc": 0.8, "test_acc": 0.75}
    path.write_text(json.dumps(good))
    assert read_baseline(path) == good
    for bad in (
        "not json",
        "[]",
        json.dumps({**good, "test_acc": 1.5}),
        json.dumps({**good, "val_acc": math.nan}),
        json.dumps({**good, "val_acc": True}),
        json.dumps({**good, "test_acc": "0.7"}),
        json.dumps({k: v for k, v in good.items() if k != "fingerprint"}),
        "[" * 100_000,
        json.dumps({**good, "pad": "x" * MAX_BYTES}),
    ):
        path.write_text(bad)
        assert read_baseline(path) is None, bad[:80]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--C=[]"], "--C must list positive values"),
        (["--C=[0.1,-1]"], "--C must list positive values"),
        (["--name=../elsewhere"], "--name must be a folder name"),
        (["--max_train_texts=0"], "--max_train_texts must be positive"),
    ],
)
def test_a_bad_argument_is_one_line(root, tmp_path, args, message):
    result = run_here("project.baseline", f"--data.root={root}", *args, cwd=tmp_path)
    assert result.returncode == 2 and message in result.stderr.strip().splitlines()[-1], result.stderr[-2000:]
    assert not (tmp_path / "logs").exists()


def test_a_missing_split_is_one_line_before_any_reading(tmp_path):
    result = run_here("project.baseline", f"--data.root={tmp_path / 'nothing'}", cwd=tmp_path)
    assert result.returncode == 2 and "nothing" in result.stderr.strip().splitlines()[-1], result.stderr[-2000:]
