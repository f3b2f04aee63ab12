"""DataLoader workers start from a forkserver that ignores SIGTERM, not as forks of the training process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from project.data.workers import proc_stat, start_forkserver, worker_context
from project.tasks.image.data import ImageShards
from project.tasks.image.demo import make_demo

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def status(pid: int, field: str) -> int:
    """A hexadecimal signal-set field of /proc/PID/status (SigIgn, SigBlk) as an int."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1], 16)
    raise KeyError(field)


def parent(pid: int) -> int:
    return int(proc_stat(pid)[1])


def sigterm_bit() -> int:
    return 1 << (signal.SIGTERM - 1)


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("workers")
    make_demo(root, train=64, val=16, test=16, image_size=16, samples_per_shard=32, workers=1, quiet=True)
    return root


@linux
def test_the_forkserver_ignores_sigterm_and_this_process_keeps_its_handler(demo):
    def handler(signum, frame):  # noqa: ANN001, ANN202
        pass

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        start_forkserver()
        assert signal.getsignal(signal.SIGTERM) is handler
        assert not signal.pthread_sigmask(signal.SIG_BLOCK, []) & {signal.SIGTERM}
        loader = ImageShards(root=str(demo), batch_size=8, num_workers=2, image_size=16).train_dataloader()
        iterator = iter(loader)
        # a batch from each worker: torch sets its own SIGTERM handler as a worker starts, and worker_init_fn
        # replaces it with "ignore" just after; only a worker that has made a batch is surely past that
        next(iterator), next(iterator)
        workers = [worker.pid for worker in iterator._workers]
        servers = {parent(pid) for pid in workers}
        assert len(servers) == 1 and os.getpid() not in servers, "workers must not be forks of this process"
        (server,) = servers
        assert parent(server) == os.getpid()
        assert status(server, "SigIgn") & sigterm_bit(), "a preemption's SIGTERM would stop the forkserver"
        assert all(status(pid, "SigIgn") & sigterm_bit() for pid in workers)
        del iterator
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_every_start_method_yields_the_same_batches(demo):
    keys = {}
    for method in ("forkserver", "spawn", "fork"):
        module = ImageShards(root=str(demo), batch_size=8, num_workers=2, image_size=16, worker_start=method)
        keys[method] = [key for batch in module.val_dataloader() for key in batch.keys]
    assert keys["forkserver"] == keys["spawn"] == keys["fork"]
    assert len(keys["forkserver"]) == 16


def test_forkserver_falls_back_to_spawn_where_it_does_not_exist(monkeypatch):
    import multiprocessing

    monkeypatch.setattr(multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    assert worker_context("forkserver").get_start_method() == "spawn"


ENTRY_POINT = """
import os, sys
import my_helper  # beside the entry point: on sys.path for `python PATH` only as its folder
print("entry point ran in", os.getpid(), file=sys.stderr, flush=True)

def main():
    from project.tasks.image.data import ImageShards

    data = ImageShards(root=sys.argv[1], batch_size=8, num_workers=2, image_size=16, augment="none")
    for epoch in range(2):
        for batch in data.val_dataloader():
            assert len(batch) == 8

if __name__ == "__main__":
    main()
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["module", "path"])
def test_workers_start_without_running_the_entry_point_again_or_warning(demo, tmp_path, how):
    """`python -m MODULE` or `python PATH`: the forkserver runs the entry point once as __mp_main__, so its
    workers neither run it again (it would import the entry point's dependencies in every worker of every epoch:
    2 s of CPU each with Lightning's) nor warn that it was "found in sys.modules" (24 times in a default run, when
    the server imported it by name)."""
    (tmp_path / "my_entry.py").write_text(ENTRY_POINT)
    (tmp_path / "my_helper.py").write_text("")
    entry = ["-m", "my_entry"] if how == "module" else [str(tmp_path / "my_entry.py")]
    path = [str(tmp_path)] if how == "module" else []  # a script's folder comes first on its sys.path by itself
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([*path, str(Path(__file__).resolve().parents[1])]),
        "PYTHONWARNINGS": "default",
    }
    result = subprocess.run(
        [sys.executable, *entry, str(demo)],
        env=env,
        cwd=tmp_path if how == "module" else elsewhere,  # for PATH, not the script's folder: it must not count
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "found in sys.modules" not in result.stderr and "RuntimeWarning" not in result.stderr, result.stderr
    runs = [line for line in result.stderr.splitlines() if line.startswith("entry point ran in")]
    assert len(runs) == 2, runs  # the process itself, and the server once: not each of the 4 workers


def test_the_server_preloads_the_stream_the_task_and_the_entry_point(monkeypatch):
    import importlib.machinery
    import types

    from project.data.workers import MAIN_MODULE_VARIABLE, MAIN_PATH_VARIABLE, PRELOAD, preload

    main = types.ModuleType("__main__")
    main.__spec__ = importlib.machinery.ModuleSpec("project.train", None)
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.delenv(MAIN_MODULE_VARIABLE, raising=False)
    modules = preload(["project.tasks.image.data"])
    assert modules == [*PRELOAD, "project.tasks.image.data", "project.data.forkserver_main"]
    assert os.environ[MAIN_MODULE_VARIABLE] == "project.train"
    assert MAIN_PATH_VARIABLE not in os.environ
    main.__spec__, main.__file__ = None, "my_train.py"  # a script run by path: the server runs it, by its full path
    monkeypatch.setattr("multiprocessing.process.ORIGINAL_DIR", "/work/here")
    preload()
    assert MAIN_MODULE_VARIABLE not in os.environ and os.environ[MAIN_PATH_VARIABLE] == "/work/here/my_train.py"
    del main.__file__  # python -c: nothing to run in the server
    preload()
    assert MAIN_MODULE_VARIABLE not in os.environ and MAIN_PATH_VARIABLE not in os.environ


WHO_STARTS_THE_SERVER = """
import sys
from multiprocessing import forkserver
from project.cli import ProjectCLI
for args in sys.argv[1:]:
    ProjectCLI(args=args.split())
    print(forkserver._forkserver._forkserver_pid is not None, flush=True)  # this process's server, if started
"""


@pytest.mark.slow
def test_the_parsed_configuration_decides_whether_the_forkserver_starts(demo, tmp_path):
    """The data module starts the forkserver as it is built, and only when its configuration asks for workers
    from it: a run with decode threads and no workers, from a flag or from a --config file, holds no idle
    server (~0.3 GB); a later flag for workers starts it."""
    threads = tmp_path / "threads.yaml"
    threads.write_text("data:\n  init_args:\n    num_workers: 0\n    decode_threads: 2\n")
    common = f"--data.root={demo} --data.image_size=16 --trainer.logger=false --trainer.enable_checkpointing=false"
    runs = {
        f"{common} --data.num_workers=0": False,
        f"{common} --config {threads}": False,
        f"{common} --data.num_workers=2 --data.worker_start=spawn": False,
        f"{common} --config {threads} --data.num_workers=2": True,  # the later flag wins
    }
    result = subprocess.run(
        [sys.executable, "-c", WHO_STARTS_THE_SERVER, *runs], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == [str(started) for started in runs.values()]


KILLED_TRAINER = """
import sys, time
from project.tasks.image.data import ImageShards
loader = ImageShards(root=sys.argv[1], batch_size=4, num_workers=2, image_size=16).train_dataloader()
iterator = iter(loader)
next(iterator)
print(*[worker.pid for worker in iterator._workers], flush=True)
time.sleep(300)
"""


@pytest.mark.slow
@linux
def test_workers_and_their_server_stop_when_the_training_process_is_killed(demo):
    """SIGKILL gives the training process no chance to stop its workers; they must notice on their own,
    although their parent is the forkserver, which stays up while they do."""
    from project.data.workers import process_alive

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    trainer = subprocess.Popen(
        [sys.executable, "-c", KILLED_TRAINER, str(demo)], stdout=subprocess.PIPE, text=True, env=env
    )
    workers = [int(pid) for pid in trainer.stdout.readline().split()]
    assert len(workers) == 2
    server = parent(workers[0])
    trainer.kill()
    trainer.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(process_alive(pid) for pid in (*workers, server)):
        time.sleep(0.2)
    assert not any(process_alive(pid) for pid in (*workers, server)), "orphaned workers or server"


def stubborn_job(seconds: float) -> float:
    """A job that ignores SIGTERM (as a pool worker does while it starts, like its forkserver) and runs long."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(seconds)
    return seconds


def test_a_pool_stopped_early_does_not_wait_for_workers_that_ignore_sigterm():
    """Pool.terminate alone sends SIGTERM and then waits for each worker; one that ignores it (still starting
    from the forkserver, which ignores SIGTERM) kept a test waiting forever. Stopping early kills them."""
    import threading

    from project.data.parallel import imap_unordered

    def stop_early() -> None:
        results = imap_unordered(stubborn_job, [0.0, 60.0, 60.0], workers=2)
        assert next(results) == 0.0
        results.close()  # stop early: the two 60 s jobs are running, deaf to SIGTERM

    stopping = threading.Thread(target=stop_early, daemon=True)  # a thread: a regression fails, not hangs
    stopping.start()
    stopping.join(timeout=30)
    assert not stopping.is_alive(), "stopping the pool waited for workers that ignore SIGTERM"
    assert sorted(imap_unordered(stubborn_job, [0.0, 0.1, 0.2], workers=2)) == [0.0, 0.1, 0.2]  # a normal end


class NeedsTwoArguments(Exception):
    def __init__(self, shard: str, why: str) -> None:
        super().__init__(f"{shard}: {why}")


def failing_job(job: int) -> int:
    if job == 3:
        raise ValueError("job 3 is bad")
    if job == 4:
        raise NeedsTwoArguments("shard-4", "unreadable")  # pickles, but does not unpickle
    if job == 5:
        os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's out-of-memory killer does
    return job * 10


def test_a_pool_raises_a_jobs_error_with_its_traceback_and_names_a_worker_that_died():
    from project.data.parallel import RemoteTraceback, WorkerDied, imap_unordered

    assert sorted(imap_unordered(failing_job, range(3), workers=2)) == [0, 10, 20]
    assert sorted(imap_unordered(failing_job, iter(range(3)), workers=8)) == [0, 10, 20]  # fewer jobs than workers
    with pytest.raises(ValueError, match="job 3 is bad") as raised:
        list(imap_unordered(failing_job, [0, 3, 1], workers=2))
    assert isinstance(raised.value.__cause__, RemoteTraceback)
    assert "failing_job" in str(raised.value.__cause__)  # the worker's traceback
    with pytest.raises(RuntimeError, match="NeedsTwoArguments: shard-4: unreadable"):
        list(imap_unordered(failing_job, [4], workers=2))
    with pytest.raises(WorkerDied, match=r"killed by signal 9 \(out of memory\?\) on job 5"):
        list(imap_unordered(failing_job, [0, 5, 1, 2], workers=2))
