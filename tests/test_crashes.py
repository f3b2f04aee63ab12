"""Hard crashes: a DataLoader worker killed mid-epoch, and SIGKILL of the whole run at any moment, checkpoint
writes included. After either, `--ckpt_path last` ends with the uninterrupted run's weights, or says in one
line that there is no checkpoint; a torn checkpoint is one line naming it.

The kill machinery here is shared with scripts/kill_points.py (the full sweep of random kill points).
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback

from project.callbacks.checkpoint_io import AtomicCheckpointIO, check_checkpoint
from project.callbacks.dead_worker import dead_worker
from project.data.atomic import PARTIAL, write_atomically
from project.errors import UserError
from project.tasks.image.demo import make_demo

from .conftest import REPO, run_here

BATCH, STEPS = 16, 36  # 300 training samples: 18 batches an epoch, 2 epochs
NO_CHECKPOINT = "has checkpoints/last.ckpt to resume from"


# -- test-only callbacks, loaded by the runs through --trainer.callbacks+= -----------------------------------


class AnnounceWorkers(Callback):
    """Prints `STEP n WORKERS pid,pid` after each training step, then waits `delay` seconds."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        iterators = trainer.fit_loop._data_fetcher.iterator._iterator.iterators  # private: tests only
        pids = ",".join(str(worker.pid) for worker in getattr(iterators[0], "_workers", []))
        print(f"STEP {trainer.global_step} WORKERS {pids}", flush=True)
        time.sleep(self.delay)


class PauseWrites(Callback):
    """Checkpoint write number `write` (1, 2, ...) stops halfway through its bytes, prints `WRITING`, and
    sleeps: a run killed then is killed in the middle of writing a checkpoint."""

    def __init__(self, write: int) -> None:
        self.write = write

    def setup(self, trainer, pl_module, stage):
        trainer.strategy.checkpoint_io = _PausingIO(self.write)


class _PausingIO(AtomicCheckpointIO):
    def __init__(self, pause_at: int) -> None:
        super().__init__()
        self.pause_at, self.count = pause_at, 0

    def write(self, checkpoint, stream):
        self.count += 1
        if self.count != self.pause_at:
            return super().write(checkpoint, stream)
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        data = buffer.getvalue()
        stream.write(data[: len(data) // 2])
        stream.flush()
        print("WRITING", flush=True)
        time.sleep(120)
        stream.write(data[len(data) // 2 :])


# -- the kill machinery -----------------------------------------------------------------------------------


def callback_flag(name: str, **init_args) -> str:
    return f"--trainer.callbacks+={json.dumps({'class_path': f'tests.test_crashes.{name}', 'init_args': init_args})}"


def train_args(data: Path, *extra: str, every: int = 0) -> list[str]:
    """A 2-epoch run of the tiny demo with 2 workers; `every` > 0 adds a last.ckpt every `every` steps."""
    args = [
        *(f"--data.root={data}", "--data.image_size=16", f"--data.batch_size={BATCH}", "--data.augment=light"),
        *("--data.num_workers=2", "--trainer.max_epochs=2", "--trainer.deterministic=true"),
        *("--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"),
    ]
    if every:
        config = data.parent / f"every{every}.yaml"
        config.write_text((REPO / "configs/trainer/spot.yaml").read_text().replace("200", str(every)))
        args.append(f"--config={config}")
    return [*args, *extra]


def start(folder: Path, args: list[str]) -> subprocess.Popen:
    """`python -m project.train args` in `folder`, in a process group of its own, stdout piped."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"}
    command = [sys.executable, "-m", "project.train", *args]
    return subprocess.Popen(
        command,
        cwd=folder,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=open(folder / "stderr.txt", "w"),
        start_new_session=True,
    )


def wait_for(process: subprocess.Popen, pattern: str, limit: float = 240) -> re.Match | None:
    """The first stdout line matching `pattern`, None if the run ended first; a watchdog kills the run at
    `limit` seconds, so that a hang fails instead of blocking."""
    watchdog = threading.Timer(limit, os.killpg, (process.pid, signal.SIGKILL))
    watchdog.start()
    try:
        return next((found for line in process.stdout if (found := re.match(pattern, line))), None)
    finally:
        watchdog.cancel()


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL every process of the run (trainer, forkserver, workers), as the OOM killer or a scheduler can."""
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)


@dataclass
class Disk:
    """What a killed run left in its run folder."""

    last_step: int | None  # None: no last.ckpt
    partials: int  # temporary files of interrupted writes
    complete: bool  # last.ckpt, if any, is a complete checkpoint

    def __str__(self) -> str:
        last = "no last.ckpt" if self.last_step is None else f"last.ckpt step {self.last_step}"
        last += "" if self.complete else " (TORN)"
        return last + (f", {self.partials} partial file(s)" if self.partials else "")


def on_disk(folder: Path) -> Disk:
    checkpoints = folder / "logs" / "demo" / "version_0" / "checkpoints"
    partials = len(list(checkpoints.glob(f".*{PARTIAL}")))
    last = checkpoints / "last.ckpt"
    if not last.is_file():
        return Disk(None, partials, True)
    try:
        check_checkpoint(last)
    except UserError:
        return Disk(-1, partials, False)
    return Disk(torch.load(last, weights_only=True, map_location="cpu")["global_step"], partials, True)


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True, map_location="cpu")["state_dict"]


def equal_weights(path: Path, expected: dict[str, torch.Tensor]) -> bool:
    final = weights(path)
    return final.keys() == expected.keys() and all(torch.equal(final[name], expected[name]) for name in expected)


def outcome(result: subprocess.CompletedProcess, folder: Path, expected: dict[str, torch.Tensor]) -> str:
    """What `--ckpt_path last` did: "equal" (resumed, final weights equal), "no checkpoint", or FAIL: ..."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    if result.returncode == 2 and NO_CHECKPOINT in result.stderr and "Traceback" not in result.stderr:
        return "no checkpoint" if lines[-1].startswith("error: --ckpt_path last: no run") else "FAIL: not one line"
    if result.returncode != 0:
        return f"FAIL: exit {result.returncode}: {lines[-1] if lines else ''}"
    last = folder / "logs" / "demo" / "version_0" / "checkpoints" / "last.ckpt"
    return "equal" if equal_weights(last, expected) else "FAIL: final weights differ"


# -- fixtures ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("crashdata") / "demo"
    make_demo(root, train=300, val=40, test=40, image_size=16, samples_per_shard=50, workers=1, quiet=True)
    return root


@pytest.fixture(scope="module")
def expected(data, tmp_path_factory) -> dict[str, torch.Tensor]:
    """The final weights of an uninterrupted run."""
    folder = tmp_path_factory.mktemp("whole")
    result = run_here("project.train", *train_args(data, every=3), cwd=folder)
    assert result.returncode == 0, result.stderr[-3000:]
    return weights(folder / "logs" / "demo" / "version_0" / "checkpoints" / "last.ckpt")


# -- fast tests ---------------------------------------------------------------------------------------------


def test_torch_worker_errors_name_the_worker_and_how_it_died():
    forked = RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed. ")
    assert dead_worker(forked).describe() == "pid 4242, killed by signal: Killed"
    polled = RuntimeError("DataLoader worker (pid(s) 17, 18) exited unexpectedly")
    wrapped = ValueError("during fit")
    wrapped.__cause__ = polled
    assert dead_worker(wrapped).pids == [17, 18]
    assert dead_worker(RuntimeError("CUDA out of memory")) is None


def test_an_interrupted_write_leaves_the_old_file_and_the_next_write_removes_its_temporary(tmp_path):
    target = tmp_path / "last.ckpt"
    write_atomically(target, lambda stream: stream.write(b"old"))

    def dies_halfway(stream):
        stream.write(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomically(target, dies_halfway)
    assert target.read_bytes() == b"old" and not list(tmp_path.glob(f".*{PARTIAL}"))
    # a temporary left by a killed writer (a pid that no longer runs) goes with the next write
    stale = tmp_path / f".last.ckpt~{socket.gethostname()}~{2**22 + 1}~abcd{PARTIAL}"
    stale.write_bytes(b"torn")
    write_atomically(target, lambda stream: stream.write(b"new"))
    assert target.read_bytes() == b"new" and not stale.exists()


def test_a_torn_checkpoint_is_one_line_naming_it(tmp_path):
    whole = tmp_path / "best.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(1000)}}, whole)
    check_checkpoint(whole)
    torn = tmp_path / "last.ckpt"
    torn.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with pytest.raises(UserError, match=r"last.ckpt is not a complete checkpoint .*complete ones beside it: best.ckpt"):
        check_checkpoint(torn)
    torn.write_bytes(b"")
    with pytest.raises(UserError, match="is empty"):
        check_checkpoint(torn)


@pytest.mark.slow
def test_ckpt_path_last_refuses_a_torn_last_ckpt_in_one_line_naming_it(tmp_path):
    """A torn last.ckpt (an older version's write, a failed disk) is refused, not replaced by an older
    checkpoint: resuming from best.ckpt would silently drop the steps after it."""
    checkpoints = tmp_path / "logs" / "demo" / "version_0" / "checkpoints"
    checkpoints.mkdir(parents=True)
    torch.save({"state_dict": {"w": torch.zeros(1000)}}, checkpoints / "best.ckpt")
    (checkpoints / "last.ckpt").write_bytes((checkpoints / "best.ckpt").read_bytes()[:-100])
    result = run_here("project.train", "--ckpt_path=last", "--data.root=nowhere", cwd=tmp_path)
    last = Path("logs/demo/version_0/checkpoints/last.ckpt")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: --ckpt_path last: {last} is not a complete checkpoint")
    assert "complete ones beside it: best.ckpt" in errors[0] and "resuming" not in result.stderr


# -- end-to-end ---------------------------------------------------------------------------------------------


def finish(process: subprocess.Popen, limit: float = 120) -> tuple[list[str], int]:
    """The rest of a run's stdout and its exit code; a watchdog kills the run at `limit` seconds."""
    watchdog = threading.Timer(limit, os.killpg, (process.pid, signal.SIGKILL))
    watchdog.start()
    try:
        return list(process.stdout), process.wait()
    finally:
        watchdog.cancel()


@pytest.mark.slow
def test_a_killed_worker_stops_the_run_in_seconds_with_one_line_and_last_continues_exactly(data, expected, tmp_path):
    folder = tmp_path / "run"
    process = start(folder, train_args(data, callback_flag("AnnounceWorkers", delay=0.1)))
    found = wait_for(process, r"STEP 5 WORKERS (\d+),")
    assert found, (folder / "stderr.txt").read_text()[-3000:]
    os.kill(int(found.group(1)), signal.SIGKILL)
    killed = time.monotonic()
    lines, returncode = finish(process)
    stopped = time.monotonic() - killed
    stderr = (folder / "stderr.txt").read_text()
    print(f"stopped {stopped:.1f} s after the worker's SIGKILL")
    assert stopped < 10, f"stopped only {stopped:.1f} s after the kill"
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert returncode == 2 and "Traceback" not in stderr and len(errors) == 1, stderr[-3000:]
    assert errors[0].startswith(f"error: a data-loading worker died (pid {found.group(1)}, killed by SIGKILL)")
    assert all(
        words in errors[0]
        for words in ("out-of-memory", "data.shuffle_buffer", "data.num_workers", "--ckpt_path last continues")
    )

    # the checkpoint holds the last step that finished: the batch that could not be fetched never started
    step = max(int(line.split()[1]) for line in lines if line.startswith("STEP"))
    checkpoint = torch.load(folder / "logs/demo/version_0/checkpoints/last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == step and 5 <= step < STEPS - 1
    loops = checkpoint["loops"]["fit_loop"]
    position = loops["state_dict"]["combined_loader"][0]
    assert (position["epoch"], position["batches"]) == divmod(step, 18)
    assert set(loops["epoch_loop.batch_progress"]["current"].values()) == {step % 18}

    resumed = run_here("project.train", *train_args(data), "--ckpt_path=last", cwd=folder)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert equal_weights(folder / "logs/demo/version_0/checkpoints/last.ckpt", expected)


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["step 1", "mid-write 2", "step 20"])
def test_sigkill_of_the_whole_run_resumes_exactly_or_says_there_is_no_checkpoint(data, expected, tmp_path, moment):
    """Kill points: before the first checkpoint; halfway through writing the second (last.ckpt of step 6,
    paused by PauseWrites); in the second epoch."""
    folder = tmp_path / "run"
    kind, number = moment.split()
    extra = callback_flag("PauseWrites", write=int(number)) if kind == "mid-write" else callback_flag("AnnounceWorkers")
    process = start(folder, train_args(data, extra, every=3))
    moment_seen = wait_for(process, "WRITING" if kind == "mid-write" else f"STEP {number} ")
    assert moment_seen, (folder / "stderr.txt").read_text()[-3000:]
    kill_group(process)
    disk = on_disk(folder)
    assert disk.complete
    if kind == "mid-write":
        assert (disk.last_step, disk.partials) == (3, 1), disk  # the old last.ckpt, whole, and the torn temporary

    resumed = run_here("project.train", *train_args(data, every=3), "--ckpt_path=last", cwd=folder)
    assert outcome(resumed, folder, expected) == ("no checkpoint" if disk.last_step is None else "equal")
    assert not list((folder / "logs/demo/version_0/checkpoints").glob(f".*{PARTIAL}"))


def test_an_allocation_that_fails_is_told_apart_from_other_errors_and_the_largest_settings_are_named():
    from types import SimpleNamespace

    from project.errors import allocation_failure, largest_settings

    try:
        torch.empty(10**15, dtype=torch.uint8)  # 1,000 TB: refused by the allocator at once
    except RuntimeError as real:
        try:
            raise ValueError("Does not validate against any of the types") from real  # as jsonargparse wraps it
        except ValueError as wrapped:
            assert allocation_failure(wrapped) == "1,000,000.0 GB in one piece"
    assert allocation_failure(MemoryError()) == "MemoryError"
    assert allocation_failure(ValueError("bad value")) is None
    config = {
        "model": SimpleNamespace(init_args=SimpleNamespace(dim=10**11, layers=2, dropout=0.1, ngram_branch=True)),
        "data": SimpleNamespace(init_args=SimpleNamespace(batch_size=64, hash_buckets=2**18)),
    }
    named = largest_settings(config)
    assert (
        named == "check the largest size settings: model.dim=100000000000, data.hash_buckets=262144, data.batch_size=64"
    )
