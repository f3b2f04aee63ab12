"""The core is generic: a task it has never heard of (regression on .npy vectors, tests/regression_task.py,
picked by tests/regression.yaml) trains, resumes exactly mid-epoch with equal weights, and runs 2-process
DDP with equal batches and exactly-once evaluation, with no change to any file of project/."""

from __future__ import annotations

import pickle
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from project.data.samples import read_samples
from project.data.specs import resolve_shards
from project.train import main as train

from .conftest import REPO, run_module
from .helpers import load_records, recorder, step_checkpoints
from .regression_task import VectorBatch, VectorShards, VectorTask, write_vector_shards

pytestmark = pytest.mark.slow
BATCH = 8
SIZES = {"train": [40, 31, 25], "val": [17, 13], "test": [30]}  # 96 training samples: 12 batches, 6 per rank
# deterministic: equal weights after a resume need one thread count throughout (README, "Exact mid-epoch resume")
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--trainer.deterministic=true"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[Path, dict[str, list[str]]]:
    root = tmp_path_factory.mktemp("vectors")
    return root, write_vector_shards(root, SIZES)


def train_args(root: Path, records: Path, *extra: str) -> list[str]:
    return [
        "--config",
        str(REPO / "tests" / "regression.yaml"),
        f"--data.root={root}",
        "--data.num_workers=2",
        "--trainer.max_epochs=3",
        *QUIET,
        recorder(records),
        *extra,
    ]


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True, map_location="cpu")["state_dict"]


def test_its_data_module_decodes_only_its_members_into_its_own_batches(data):
    root, keys = data
    module = VectorShards(root=str(root), batch_size=BATCH, num_workers=2)
    batches = list(module.val_dataloader())
    assert all(isinstance(batch, VectorBatch) and batch.features.shape[1:] == (8,) for batch in batches)
    assert sorted(key for batch in batches for key in batch.keys) == sorted(keys["val"])
    sample = next(read_samples(resolve_shards(str(root / "val")).shards[0].url, extensions=module.task.extensions))
    assert set(sample) == {"__key__", "__url__", "npy", "value"}


def test_its_workers_receive_its_task_and_not_its_data_module(data):
    root, _ = data
    module = VectorShards(root=str(root), batch_size=BATCH, num_workers=2, noise=0.25)
    pickled = pickle.dumps(module.loader("val").dataset)  # what each DataLoader worker unpickles
    assert b"VectorShards" not in pickled and b"lightning" not in pickled and b"ShardIndex" not in pickled
    task = pickle.loads(pickled).task
    assert type(task) is VectorTask and task.noise == 0.25


def test_it_trains_and_resumes_exactly_mid_epoch(data, tmp_path, monkeypatch):
    root, _ = data
    for folder in ("whole", "resumed"):
        (tmp_path / folder).mkdir()
    monkeypatch.chdir(tmp_path / "whole")
    train(train_args(root, tmp_path / "r_whole", step_checkpoints(tmp_path / "steps", 5)))
    run = tmp_path / "whole" / "logs" / "demo" / "version_0"
    events = EventAccumulator(str(run))
    events.Reload()
    targets = [
        float(s["value"]) for shard in resolve_shards(str(root / "test")).shards for s in read_samples(shard.url)
    ]
    assert events.Scalars("test/loss")[-1].value < 0.5 * np.var(targets), "no better than predicting the mean"

    monkeypatch.chdir(tmp_path / "resumed")  # from step 5: mid epoch 0, an odd count (the workers rotate)
    train(train_args(root, tmp_path / "r_resumed", f"--ckpt_path={tmp_path / 'steps' / 'step=5.ckpt'}"))
    before, after = load_records(tmp_path / "r_whole")[0]["train"], load_records(tmp_path / "r_resumed")[0]["train"]
    assert len(before["0"]) == 96 // BATCH
    assert after["0"] + after["1"] + after["2"] == before["0"][5:] + before["1"] + before["2"]
    final = weights(tmp_path / "resumed" / "logs" / "demo" / "version_0" / "checkpoints" / "last.ckpt")
    expected = weights(run / "checkpoints" / "last.ckpt")
    assert max((final[name] - expected[name]).abs().max().item() for name in expected) == 0.0


def test_it_runs_two_process_ddp_with_equal_batches_and_exactly_once_evaluation(data, tmp_path):
    root, keys = data
    args = train_args(root, tmp_path / "records", "--config", str(REPO / "configs/trainer/ddp_cpu.yaml"))
    result = run_module("project.train", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    records = load_records(tmp_path / "records")
    for epoch in ("0", "1", "2"):
        batches = {rank: records[rank]["train"][epoch] for rank in (0, 1)}
        assert len(batches[0]) == len(batches[1]) == 96 // (2 * BATCH)
        seen = [key for rank in (0, 1) for batch in batches[rank] for key in batch]
        assert len(seen) == len(set(seen)) == 96 and set(seen) == set(keys["train"])
        val = Counter(key for rank in (0, 1) for batch in records[rank]["val"][epoch] for key in batch)
        assert set(val) == set(keys["val"]) and set(val.values()) == {1}
        assert len(records[0]["val"][epoch]) == len(records[1]["val"][epoch])
    assert (tmp_path / "logs" / "demo" / "version_0" / "checkpoints" / "best.ckpt").is_file()
