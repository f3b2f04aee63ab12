"""DDP on CPU with gloo, through the real command line: equal batches per rank, disjoint training data,
exactly-once evaluation, metrics equal to a single process's, and one run folder written by rank zero."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
import yaml

from project.data.samples import read_samples
from project.data.specs import resolve_shards
from project.tasks.image.demo import make_demo

from .conftest import REPO, run_here, run_module
from .helpers import load_records, recorder, step_checkpoints

pytestmark = pytest.mark.slow
BATCH = 16
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def all_keys(folder: Path) -> list[str]:
    return [s["__key__"] for shard in resolve_shards(str(folder)).shards for s in read_samples(shard.url)]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """3 uneven training shards (100, 100, 50); odd val (75) and test (33) splits: ranks get 17 and 16
    test samples, which a ceil(n / batch) split would make 2 batches and 1, and hang DDP."""
    root = tmp_path_factory.mktemp("ddpdata")
    make_demo(root, train=250, val=75, test=33, image_size=16, samples_per_shard=100, workers=1, quiet=True)
    return root


def ddp_args(data: Path) -> list[str]:
    """2 processes x 2 DataLoader workers, 2 epochs, deterministic, with augmentation (seeded per batch), the
    shards read in interleaved groups of 3 (each worker of each rank a slice of each shard of a group)."""
    return [
        *("--config", str(REPO / "configs/trainer/ddp_cpu.yaml"), "--trainer.deterministic=true"),
        *(f"--data.root={data}", "--data.image_size=16", f"--data.batch_size={BATCH}", "--data.num_workers=2"),
        *("--data.augment=light", "--data.mix_shards=3", "--trainer.max_epochs=2", *QUIET),
    ]


@pytest.fixture(scope="module")
def ddp_run(data, tmp_path_factory):
    """One 2-process DDP training run through the CLI, with step checkpoints every 5 steps."""
    cwd = tmp_path_factory.mktemp("ddprun")
    result = run_module(
        "project.train", *ddp_args(data), recorder(cwd / "records"), step_checkpoints(cwd / "steps", 5), cwd=cwd
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return cwd, result, load_records(cwd / "records")


def test_every_rank_runs_the_same_batches_on_disjoint_samples(ddp_run, data):
    _, _, records = ddp_run
    assert sorted(records) == [0, 1]
    train_keys = set(all_keys(data / "train"))
    orders = []
    for epoch in ("0", "1"):
        batches = {rank: records[rank]["train"][epoch] for rank in (0, 1)}
        assert len(batches[0]) == len(batches[1]) == 250 // (2 * BATCH)  # 7 each
        seen = [key for rank in (0, 1) for batch in batches[rank] for key in batch]
        assert len(seen) == len(set(seen)) and set(seen) <= train_keys
        assert len(train_keys) - len(seen) < 2 * BATCH
        orders.append(seen)
    assert orders[0] != orders[1], "the same order in two epochs"


def test_validation_and_test_see_every_sample_exactly_once_across_ranks(ddp_run, data):
    _, _, records = ddp_run
    for stage, split in (("val", "val"), ("test", "test")):
        for epoch in records[0][stage]:
            seen = Counter(k for rank in (0, 1) for batch in records[rank][stage][epoch] for k in batch)
            assert set(seen) == set(all_keys(data / split)) and set(seen.values()) == {1}, (stage, epoch)
            assert len(records[0][stage][epoch]) == len(records[1][stage][epoch]), "unequal batch counts"


def test_one_run_folder_written_once_by_rank_zero(ddp_run):
    cwd, result, _ = ddp_run
    assert [p.name for p in (cwd / "logs" / "demo").iterdir()] == ["version_0"]
    run = cwd / "logs" / "demo" / "version_0"
    assert (run / "config.yaml").exists() and (run / "checkpoints" / "best.ckpt").exists()
    output = result.stdout + result.stderr
    assert output.count("run folder:") == 1
    assert output.count(f"global batch: {BATCH} per device × 2 device(s) × 1 node(s)") == 1
    assert yaml.safe_load((run / "hparams.yaml").read_text())["global_batch_size"] == 2 * BATCH


def test_test_metrics_on_two_processes_equal_one_process(ddp_run, data):
    cwd, _, _ = ddp_run
    ckpt = cwd / "logs" / "demo" / "version_0" / "checkpoints" / "best.ckpt"
    metrics = {}
    # evaluate reads the model from the run's config.yaml, never its trainer: one process unless asked for two
    single = ["--trainer.devices=1", "--trainer.strategy=auto"]
    for name, extra in (("single", single), ("ddp", ["--config", str(REPO / "configs/trainer/ddp_cpu.yaml")])):
        run = run_module if name == "ddp" else run_here  # one process needs no interpreter of its own
        result = run(
            "project.evaluate",
            f"--ckpt_path={ckpt}",
            *extra,
            f"--data.root={data}",
            "--data.num_workers=2",
            *QUIET,
            cwd=cwd,
        )
        assert result.returncode == 0, result.stderr[-4000:]
        metrics[name] = json.loads(result.stdout.strip().splitlines()[-1])
    for key in ("test/acc", "test/loss"):
        assert metrics["ddp"][key] == pytest.approx(metrics["single"][key], abs=1e-6)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_node_torchrun_on_localhost_reads_disjoint_data(data, tmp_path):
    """scripts/torchrun_multi_node.sh run twice on this machine, as two one-process "nodes": the launcher
    starts ranks that train together, and each reads its own samples."""
    args = [
        *("--trainer.accelerator=cpu", f"--data.root={data}", "--data.image_size=16"),
        *(f"--data.batch_size={BATCH}", "--data.num_workers=1", "--trainer.max_epochs=1"),
        *QUIET,
        recorder(tmp_path / "records"),
    ]
    port = str(free_port())
    common = {"NNODES": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "GPUS_PER_NODE": "1"}
    env = {
        **os.environ,
        **common,
        "PYTHON": sys.executable,
        "PYTHONPATH": str(REPO),
        "PYTHONWARNINGS": "ignore",
    }
    nodes = [
        subprocess.Popen(
            ["bash", str(REPO / "scripts" / "torchrun_multi_node.sh"), *args],
            cwd=tmp_path,
            env={**env, "NODE_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [node.communicate(timeout=300)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    records = load_records(tmp_path / "records")
    batches = {rank: records[rank]["train"]["0"] for rank in (0, 1)}
    assert len(batches[0]) == len(batches[1]) == 250 // (2 * BATCH)
    keys = [{k for batch in batches[rank] for k in batch} for rank in (0, 1)]
    assert not keys[0] & keys[1] and len(keys[0]) == len(keys[1]) == 7 * BATCH
    assert any("GLOBAL_RANK: 1, MEMBER: 2/2" in output for output in outputs)  # the launcher started both ranks
    assert [p.name for p in (tmp_path / "logs" / "demo").iterdir()] == ["version_0"]
    assert (tmp_path / "logs" / "demo" / "version_0" / "checkpoints" / "last.ckpt").is_file()
    assert sum(output.count("run folder:") for output in outputs) == 1
    assert sum(output.count("2 node(s)") for output in outputs) == 1


def test_resuming_with_another_world_size_continues(ddp_run, data, tmp_path):
    """A checkpoint written by 2 processes resumes in 1 process, for one more full, duplicate-free epoch."""
    cwd, _, _ = ddp_run
    last = cwd / "logs" / "demo" / "version_0" / "checkpoints" / "last.ckpt"
    args = [
        f"--ckpt_path={last}",
        f"--data.root={data}",
        "--data.image_size=16",
        f"--data.batch_size={BATCH}",
    ]
    args += ["--data.num_workers=2", "--trainer.max_epochs=3", *QUIET, recorder(tmp_path / "records")]
    result = run_module("project.train", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    epoch = load_records(tmp_path / "records")[0]["train"]["2"]
    keys = [k for batch in epoch for k in batch]
    assert len(epoch) == 250 // BATCH and len(keys) == len(set(keys))


def test_ddp_resumes_mid_epoch_exactly_on_every_rank(ddp_run, data, tmp_path):
    """2 ranks x 2 workers: resumed from a step-5 checkpoint (an odd batch count, mid epoch 0), each rank
    continues with exactly the batches the uninterrupted run had next, and the weights end equal."""
    cwd, _, before = ddp_run
    step_5 = f"--ckpt_path={cwd / 'steps' / 'step=5.ckpt'}"
    resumed = run_module("project.train", *ddp_args(data), recorder(tmp_path / "records"), step_5, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    after = load_records(tmp_path / "records")
    for rank in (0, 1):
        expected = before[rank]["train"]["0"][5:] + before[rank]["train"]["1"]
        assert after[rank]["train"]["0"] + after[rank]["train"]["1"] == expected, rank
    final = torch.load(tmp_path / "logs/demo/version_0/checkpoints/last.ckpt", weights_only=True)
    reference = torch.load(cwd / "logs/demo/version_0/checkpoints/last.ckpt", weights_only=True)
    diff = max(
        (final["state_dict"][k] - reference["state_dict"][k]).abs().max().item() for k in reference["state_dict"]
    )
    assert diff == 0.0


def test_decode_threads_in_each_rank_keep_the_batches_equal_disjoint_and_evaluation_exactly_once(data, tmp_path):
    """2 ranks, no workers, two decode threads in each rank's training process: the same guarantees."""
    args = [*ddp_args(data), "--data.num_workers=0", "--data.decode_threads=2", "--trainer.max_epochs=1"]
    result = run_module("project.train", *args, recorder(tmp_path / "records"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    records = load_records(tmp_path / "records")
    batches = {rank: records[rank]["train"]["0"] for rank in (0, 1)}
    assert len(batches[0]) == len(batches[1]) == 250 // (2 * BATCH)
    seen = [key for rank in (0, 1) for batch in batches[rank] for key in batch]
    assert len(seen) == len(set(seen)) and set(seen) <= set(all_keys(data / "train"))
    for stage in ("val", "test"):
        for epoch in records[0][stage]:
            counts = Counter(k for rank in (0, 1) for batch in records[rank][stage][epoch] for k in batch)
            assert set(counts) == set(all_keys(data / stage)) and set(counts.values()) == {1}, (stage, epoch)
