"""Fixtures: tiny shards written into tmp_path, so every test makes its own data."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import runpy
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from webdataset import TarWriter

from project.data.shard_index import INDEX_NAME, Shard, write_index
from project.data.workers import proc_stat, start_forkserver
from project.tasks import WORKER_MODULES
from project.tasks.image.data import ImageShards
from project.tasks.image.demo import make_demo
from project.tasks.image.task import ImageTask

REPO = Path(__file__).resolve().parent.parent
CLASSES = ["zero", "one", "two"]


def jpeg(value: int, size: int = 8) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((size, size, 3), value % 256, dtype=np.uint8)).save(buffer, format="JPEG")
    return buffer.getvalue()


def image_data(image_size: int = 8, augment: str = "light", **kwargs) -> ImageShards:
    """The image task's data module, with no splits of its own unless given: labels named by CLASSES."""
    return ImageShards(root=None, image_size=image_size, augment=augment, classes=CLASSES, num_workers=0, **kwargs)


def image_task(image_size: int = 8, augment: str = "light", **kwargs) -> ImageTask:
    """The image task as a stream's decoder (`image_data`'s task)."""
    return image_data(image_size, augment, **kwargs).task


def write_shards(
    folder: Path,
    sizes: Sequence[int],
    *,
    prefix: str = "shard",
    index: bool = True,
    extra_members: dict[str, bytes] | None = None,
) -> list[str]:
    """Shards of `sizes` samples with keys `{prefix}{shard}_{i}`, labels i % 3; returns every key."""
    folder.mkdir(parents=True, exist_ok=True)
    keys, shards = [], []
    for number, size in enumerate(sizes):
        path = folder / f"{prefix}-{number:06d}.tar"
        with TarWriter(str(path), encoder=False) as writer:
            for i in range(size):
                key = f"{prefix}{number}_{i:05d}"
                sample = {"__key__": key, "jpg": jpeg(i), "cls": str(i % 3).encode()}
                sample.update(extra_members or {})
                writer.write(sample)
                keys.append(key)
        shards.append(Shard(str(path), size, path.stat().st_size))
    if index:
        write_index(folder / INDEX_NAME, shards, name=folder.name, extra={"classes": CLASSES})
    return keys


@pytest.fixture(scope="session", autouse=True)
def own_cache_folder(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The suite's own user cache folder ($XDG_CACHE_HOME: cached indexes, their key and locks, prepare's staging),
    inherited by the commands the tests run: no test reads or writes the user's, and two runs of the suite at
    once share no lock. Tests that need a fresh one set their own."""
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("user-cache"))


@pytest.fixture(scope="session", autouse=True)
def workers_server() -> None:
    """The DataLoader workers' forkserver, started as the entry points start it: with the tasks preloaded
    (otherwise each worker of each test imports Lightning again, about a second each here)."""
    start_forkserver(WORKER_MODULES)


@pytest.fixture
def shard_folder(tmp_path: Path):
    """A factory: shard_folder(sizes, name="train") -> (folder, keys)."""

    def make(sizes: Sequence[int], name: str = "train", **kwargs) -> tuple[Path, list[str]]:
        folder = tmp_path / name
        return folder, write_shards(folder, sizes, prefix=name, **kwargs)

    return make


@pytest.fixture(scope="session")
def tiny_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small demo dataset (train 600, val 130, test 150, 16 px), shared by the CLI tests."""
    root = tmp_path_factory.mktemp("demo")
    make_demo(root, train=600, val=130, test=150, image_size=16, samples_per_shard=100, workers=1, quiet=True)
    return root


def small_run(root: Path, *extra: str) -> list[str]:
    """A quick image run's flags on `root` (16 px, batches of 32, no workers, quiet), then `extra`."""
    return [
        f"--data.root={root}",
        "--data.image_size=16",
        "--data.batch_size=32",
        "--data.num_workers=0",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        *extra,
    ]


def run_module(module: str, *args: str, cwd: Path | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run `python -m module args` as a user would, capturing its output.

    The command gets its own process group, so that on a timeout every process it started (DDP ranks,
    DataLoader workers) is stopped and the output so far is shown, with a Python stack of every thread of
    every one of those processes (see `dump_stacks`): where a hang hangs.
    """
    # PYTHONPATH: subprocesses can load test-only callbacks from tests/helpers.py
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(REPO), "PYTHONFAULTHANDLER": "1"}
    command = [sys.executable, "-m", module, *args]
    process = subprocess.Popen(
        command,
        cwd=cwd or REPO,
        env=env,
        text=True,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        dump_stacks(process.pid)
        try:
            stdout, stderr = process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
        output = f"--- stdout\n{stdout[-3000:]}\n--- stderr\n{stderr[-20000:]}"
        pytest.fail(f"{module} timed out after {timeout} s\n{output}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def run_here(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m module args` run inside this test process, as `runpy` (what `-m` uses) runs it: the same
    command line, exit code, stdout and stderr (Lightning's log lines included) as `run_module`, without
    paying a new interpreter's imports (4-5 s here). What a run changes for the whole process (torch's
    threads, deterministic algorithms) is put back.

    Signals, timeouts, a killed process and DDP need `run_module`: Lightning's launcher of DDP ranks kills
    the process that started them (here pytest itself) when one of them fails."""
    stdout, stderr, code = io.StringIO(), io.StringIO(), 0
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    argv, folder = sys.argv, os.getcwd()
    # Lightning's loggers print through handlers made at import, holding the stream of that moment
    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    handlers = [h for logger in loggers for h in logger.handlers if type(h) is logging.StreamHandler]
    streams = [handler.setStream(stderr) for handler in handlers]
    os.chdir(cwd)
    sys.argv = [module, *args]
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else int(exit.code is not None)
    except Exception:  # noqa: BLE001 - what the interpreter would print, and its exit code
        stderr.write(traceback.format_exc())
        code = 1
    finally:
        for handler, stream in zip(handlers, streams, strict=True):
            handler.setStream(stream)
        sys.argv = argv
        os.chdir(folder)
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
    return subprocess.CompletedProcess([module, *args], code, stdout.getvalue(), stderr.getvalue())


def dump_stacks(group: int) -> None:
    """Make every process of a process group print the Python stacks of all its threads to its stderr
    (faulthandler, enabled by PYTHONFAULTHANDLER, on SIGABRT), one process at a time, each under a line
    naming it, so that the stacks do not interleave. Linux reads the group from /proc; elsewhere, all at once.
    """
    members = []
    for folder in Path("/proc").glob("[0-9]*"):
        try:
            fields = proc_stat(int(folder.name))  # state, ppid, pgrp, ...
        except OSError:
            continue
        if int(fields[2]) == group:
            members.append((int(folder.name), int(fields[1])))
    if not members:
        os.killpg(group, signal.SIGABRT)
        return
    for pid, parent in sorted(members):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:150]
            with open(f"/proc/{pid}/fd/2", "w") as stderr:  # the same pipe the process writes to
                stderr.write(f"\n=== stacks of pid {pid} (parent {parent}): {command}\n")
            os.kill(pid, signal.SIGABRT)
        except OSError:
            continue
        time.sleep(0.5)
