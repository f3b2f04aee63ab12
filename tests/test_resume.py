"""Exact mid-epoch resume through the CLI: the same samples in the same order, and equal final weights."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from project.tasks.image.demo import make_demo

from .conftest import REPO, run_here
from .helpers import load_records, recorder, step_checkpoints

pytestmark = pytest.mark.slow
BATCH = 16  # 300 training samples: 18 batches an epoch


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("resumedata")
    make_demo(root, train=300, val=40, test=40, image_size=16, samples_per_shard=50, workers=1, quiet=True)
    return root


THREADS = "threads"  # no worker: two decode threads in the training process


def train_args(data: Path, workers: int | str, records: Path, *extra: str) -> list[str]:
    loader = (
        ["--data.num_workers=0", "--data.decode_threads=2"] if workers == THREADS else [f"--data.num_workers={workers}"]
    )
    return [
        *(f"--data.root={data}", "--data.image_size=16", f"--data.batch_size={BATCH}", "--data.augment=light"),
        *(*loader, "--trainer.max_epochs=2", "--trainer.deterministic=true"),
        *("--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"),
        recorder(records),
        *extra,
    ]


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True, map_location="cpu")["state_dict"]


def keys_from(records: dict, start_epoch: int, start_batch: int) -> list[str]:
    """Training keys from (epoch, batch) on, in the order the training loop saw them."""
    epochs = records[0]["train"]
    return [
        key
        for epoch in sorted(epochs, key=int)
        for number, batch in enumerate(epochs[epoch])
        if (int(epoch), number) >= (start_epoch, start_batch)
        for key in batch
    ]


@pytest.fixture(scope="module")
def uninterrupted(data, tmp_path_factory):
    """{workers: the folder of an uninterrupted 2-epoch run with step checkpoints every 7 steps}: what the
    interrupted runs must equal. Module-scoped: the SIGTERM test compares against the 2-worker one too."""

    def run(workers: int) -> Path:
        folder = tmp_path_factory.mktemp(f"whole{workers}")
        args = train_args(data, workers, folder / "records", step_checkpoints(folder / "steps", 7))
        result = run_here("project.train", *args, cwd=folder)
        assert result.returncode == 0, result.stderr[-3000:]
        return folder

    return {workers: run(workers) for workers in (0, 2, THREADS)}


@pytest.mark.parametrize("workers", [0, 2, THREADS])
def test_resuming_mid_epoch_replays_nothing_skips_nothing_and_ends_with_equal_weights(
    data, tmp_path, workers, uninterrupted
):
    whole = uninterrupted[workers]
    records = load_records(whole / "records")
    expected = weights(whole / "logs" / "demo" / "version_0" / "checkpoints" / "last.ckpt")
    # mid epoch 0 (batch 7), and mid epoch 1 (batch 3: an odd count rotates the workers)
    for step in (7, 21):
        ckpt = whole / "steps" / f"step={step}.ckpt"
        saved = torch.load(ckpt, weights_only=True)
        loader_state = saved["loops"]["fit_loop"]["state_dict"]["combined_loader"]
        assert loader_state[0]["batches"] == step % 18 and loader_state[0]["epoch"] == step // 18
        # the data module's state, as checkpoints have always held it: what a resume reads
        assert saved["ImageShards"] == {"train_position": loader_state[0]}
        folder = tmp_path / f"from{step}"
        resumed = run_here(
            "project.train", *train_args(data, workers, folder / "records"), f"--ckpt_path={ckpt}", cwd=tmp_path
        )
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert keys_from(load_records(folder / "records"), 0, 0) == keys_from(records, step // 18, step % 18)
        final = weights(sorted((tmp_path / "logs" / "demo").iterdir())[-1] / "checkpoints" / "last.ckpt")
        assert max((final[name] - expected[name]).abs().max().item() for name in expected) == 0.0


def test_sigterm_saves_the_current_step_and_ckpt_path_last_finishes_like_an_uninterrupted_run(
    data, tmp_path, uninterrupted
):
    slow = {"class_path": "tests.helpers.AnnounceSteps", "init_args": {"delay": 0.2}}
    args = train_args(data, 2, tmp_path / "records")
    (tmp_path / "cut").mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"}
    with open(tmp_path / "cut.err", "w") as errors:
        command = [sys.executable, "-m", "project.train", *args, f"--trainer.callbacks+={json.dumps(slow)}"]
        options = dict(cwd=tmp_path / "cut", env=env, stderr=errors, text=True, start_new_session=True)
        process = subprocess.Popen(command, stdout=subprocess.PIPE, **options)
        for line in process.stdout:
            if line.startswith("STEP 1"):
                break
        os.killpg(process.pid, signal.SIGTERM)  # like a preemption: every process of the job, workers too
        sent = time.monotonic()
        process.stdout.read()
        returncode = process.wait(timeout=30)
    assert time.monotonic() - sent < 30, "did not exit within a 30 s grace period"
    stderr = (tmp_path / "cut.err").read_text()
    assert returncode == 143, stderr[-3000:]
    assert "stopped by SIGTERM: restart with --ckpt_path last" in stderr
    run = tmp_path / "cut" / "logs" / "demo" / "version_0"
    step = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    assert 1 <= step < 10, step  # saved at the step where the signal arrived, far from the end (36)

    resumed = run_here("project.train", *args, "--ckpt_path=last", cwd=tmp_path / "cut")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming {Path('logs/demo/version_0/checkpoints/last.ckpt')}" in resumed.stderr
    assert [p.name for p in (tmp_path / "cut" / "logs" / "demo").iterdir()] == ["version_0"]
    final = weights(run / "checkpoints" / "last.ckpt")
    expected = weights(uninterrupted[2] / "logs" / "demo" / "version_0" / "checkpoints" / "last.ckpt")
    assert max((final[name] - expected[name]).abs().max().item() for name in expected) == 0.0


def test_ckpt_path_last_without_a_previous_run_is_a_clear_error(tmp_path):
    result = run_here("project.train", "--ckpt_path=last", "--data.root=nowhere", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"error: --ckpt_path last: no run in {Path('logs/demo')} has" in result.stderr
