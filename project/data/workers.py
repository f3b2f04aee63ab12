"""DataLoader worker processes: how they start, which signals they leave to the trainer, how they stop.

Workers start from a forkserver, not by forking the training process. A fork copies a process that has
threads (gloo's, TensorBoard's writer, the queue feeders and progress-bar monitors that come and go at
every stage boundary, exactly when the next loader forks), and a child forked while one of them held an
interpreter lock deadlocks before it runs a line (CPython gh-112275, fixed in 3.12; seen here on 3.11 as a
DDP test stage hanging on a worker that never started). Python 3.12 warns about forking a process with
threads, and 3.14 made forkserver the default start method on Linux. The forkserver is a fresh, single-threaded
interpreter that imports the data pipeline once; each worker is a fork of it (milliseconds), given the
dataset by pickle.

The data module starts the server as it is built, when its parsed configuration asks for workers from it
(`num_workers` > 0, `worker_start` forkserver): its imports then run while the model and the trainer are
built, and a run without workers (`decode_threads` in the training process) holds no idle server (~0.3 GB).
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from multiprocessing import forkserver
from multiprocessing.context import BaseContext
from typing import Literal

StartMethod = Literal["forkserver", "spawn", "fork"]
# imported once by the forkserver, so that each worker starts with the stream already loaded
PRELOAD = ("project.data.workers", "project.data.stream")
MAIN_MODULE_VARIABLE = "PROJECT_WORKERS_MAIN"  # read by project/data/forkserver_main.py, in the server
MAIN_PATH_VARIABLE = "PROJECT_WORKERS_MAIN_PATH"  # and this, for a script run by path


def preload(modules: Sequence[str] = ()) -> list[str]:
    """What the forkserver imports once, before it forks any worker: the stream, `modules` (a task's
    decode and collate), and last `project.data.forkserver_main`, which runs the entry point's module there.

    A worker started by forkserver (or spawn) first runs the main module (`python -m project.train`) again
    as `__mp_main__`, as multiprocessing does so that what it defines unpickles. Run once in the server, it
    costs each worker nothing: multiprocessing skips it in a child whose `__main__` is that module already.
    (Importing it under its own name instead made every worker warn that it was "found in sys.modules".)
    """
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name and not name.endswith("__main__"):
        os.environ[MAIN_MODULE_VARIABLE] = name  # the server inherits this process's environment
    else:
        os.environ.pop(MAIN_MODULE_VARIABLE, None)  # a script run by path, python -m pkg, python -c
    # a script run by path (`python my_train.py`, benchmarks/peers.py) runs again in every worker, its imports
    # included (2 s of CPU a worker that imports Lightning), unless the server ran it (multiprocessing's own
    # "__main__" preload does not, on 3.11: it looks for a "main_path" its preparation data never holds)
    path = getattr(main, "__file__", None) if name is None else None
    if path is not None:
        if not os.path.isabs(path) and multiprocessing.process.ORIGINAL_DIR is not None:  # as spawn makes it
            path = os.path.join(multiprocessing.process.ORIGINAL_DIR, path)
        os.environ[MAIN_PATH_VARIABLE] = os.path.normpath(path)
    else:
        os.environ.pop(MAIN_PATH_VARIABLE, None)
    return list(dict.fromkeys([*PRELOAD, *modules, "project.data.forkserver_main"]))


def ignore_sigterm(worker_id: int) -> None:
    """DataLoader workers leave SIGTERM to the main process, which saves a checkpoint and then stops them.

    A preemption often signals every process of the job; a worker killed by it would make the main
    process fail on its next batch instead of checkpointing.
    """
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


class WorkerInit:
    """DataLoader's worker_init_fn: ignore SIGTERM (`ignore_sigterm`), and stop when the training process
    that made the loader is gone.

    torch's workers stop when their parent goes; a forkserver's workers have the server as parent, which
    stays up as long as they do, so a training process killed with SIGKILL (the OOM killer, a scheduler
    after its grace period) would leave its workers and the server running for good.
    """

    def __init__(self, interval: float = 2.0) -> None:
        self.trainer_pid, self.interval = os.getpid(), interval

    def __call__(self, worker_id: int) -> None:
        ignore_sigterm(worker_id)
        if os.getppid() != self.trainer_pid:  # forked by a server, not by the training process
            threading.Thread(target=self._watch, name="trainer-watchdog", daemon=True).start()

    def _watch(self) -> None:
        while process_alive(self.trainer_pid):
            time.sleep(self.interval)
        os._exit(0)


def proc_stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after "pid (comm)": state, ppid, pgrp, ... utime at 11, stime at 12.
    Raises OSError where there is no such process, or no /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()


def process_alive(pid: int) -> bool:
    """Whether a process exists and has not exited (a zombie, exited but not yet reaped, has)."""
    if os.path.isdir("/proc/self"):
        try:
            return proc_stat(pid)[0] not in ("Z", "X")
        except FileNotFoundError:
            return False
    try:  # no /proc (macOS): whether it exists, zombie or not
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def default_sigterm() -> None:
    """For other processes started from the forkserver (a Pool's): SIGTERM stops them, as Pool.terminate
    expects, instead of being ignored like the server that forked them."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def as_is(batch: object) -> object:
    """The stream's batches as they are (a module-level function, so that workers can unpickle it)."""
    return batch


def worker_context(method: StartMethod, modules: Sequence[str] = ()) -> BaseContext:
    """The multiprocessing context DataLoader workers start with; for forkserver, its server is started now
    (see `start_forkserver`, which preloads `modules` if this starts it). Where forkserver does not exist
    (Windows), spawn."""
    if method == "forkserver" and not start_forkserver(modules):
        method = "spawn"
    return multiprocessing.get_context(method)


def warm_forkserver(modules: Sequence[str] = ()) -> None:
    """Start the forkserver and wait until it has imported `preload(modules)`: for benchmarks that time
    workers (a task's module not preloaded would be imported by every worker, in the timed epoch)."""
    process = worker_context("forkserver", modules).Process(target=os.getpid)
    process.start()
    process.join()


def start_forkserver(modules: Sequence[str] = ()) -> bool:
    """Start this process's forkserver, if it is not running, ignoring SIGTERM like the workers it forks;
    False where there is no forkserver (Windows). `modules` are preloaded in it (see `preload`) when this
    call starts it.

    A preemption signals every process of the job: a forkserver killed by it would take its workers with
    it (each stops when its parent goes) before the trainer has saved its checkpoint. The server still
    stops when this process exits. While it starts, SIGTERM is blocked here, so a signal arriving then
    reaches the trainer's handler afterwards instead of being lost. Returns at once: the server imports
    `preload()` in the background, and the first worker waits for that.

    The server is this process's only one: anything else started with the forkserver context also
    starts ignoring SIGTERM (a Pool's processes should call `default_sigterm` first, as `parallel` does).
    """
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return False
    if threading.current_thread() is not threading.main_thread():  # signal handlers are the main thread's
        forkserver.ensure_running()
        return True
    multiprocessing.get_context("forkserver").set_forkserver_preload(preload(modules))  # read only at the start
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)  # exec keeps only ignored signals
        try:
            forkserver.ensure_running()
        finally:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    return True


@atexit.register  # registered after multiprocessing's own exit handler, so it runs before it
def _kill_leftover_workers() -> None:
    """At exit, multiprocessing stops daemonic children with SIGTERM and waits for them; workers ignore
    SIGTERM, and an iterator kept alive by an exception's traceback never told its workers to stop."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # torch's handler would report the kill as a worker failure
    for child in multiprocessing.active_children():
        if child.daemon:
            child.kill()
