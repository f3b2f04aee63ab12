"""Run a function over jobs in worker processes, or in this process when one worker is asked for.

Our own small pool, not multiprocessing.Pool: Pool restarts a killed worker behind our back (so stopping it
early raced with a fresh worker that still ignored SIGTERM, and Pool.terminate waited for it forever), and it
waits forever when a worker dies, as one killed for memory does. Here each worker has its own pipe and one
job at a time; a dead worker is an error naming its exit code, and stopping kills what is left.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import pickle
import signal
import traceback
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from project.data.workers import worker_context

Job = TypeVar("Job")
Result = TypeVar("Result")

STOP = None  # sent to a worker: no more jobs


class RemoteTraceback(Exception):
    """The traceback of an error raised in a worker, chained to that error where it is raised here."""

    def __str__(self) -> str:
        return self.args[0]


class WorkerDied(RuntimeError):
    """A worker process ended without returning its job's result."""


class Pool:
    """`workers` processes kept from one `imap_unordered` call to the next (prepare hashes every sample, then
    writes the shards, with the same processes), started when first needed and stopped by `close` (or the
    `with` block's end). An error in a job, or a call's iterator closed early, kills them all."""

    def __init__(self, workers: int, start_method: str | None = None):
        self.workers, self.start_method = workers, start_method
        self.processes: dict[multiprocessing.connection.Connection, multiprocessing.process.BaseProcess] = {}

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _start(self, function: Callable) -> multiprocessing.connection.Connection:
        if self.start_method is None:  # the server preloads the function's module, if this starts it
            context = worker_context("forkserver", [function.__module__])
        else:
            context = multiprocessing.get_context(self.start_method)
        ours, theirs = context.Pipe()
        process = context.Process(target=serve, args=(theirs,), daemon=True)
        process.start()
        theirs.close()
        self.processes[ours] = process
        return ours

    def imap_unordered(self, function: Callable[[Job], Result], jobs: Iterable[Job]) -> Iterator[Result]:
        """function(job) for each job, yielded as they finish. An error in a job is raised here, with the
        worker's traceback chained."""
        if self.workers <= 1:
            yield from map(function, jobs)
            return
        waiting = iter(jobs)
        idle = list(self.processes)
        busy: dict[multiprocessing.connection.Connection, Job] = {}
        finished = False
        try:
            while self._hand_out(function, waiting, idle, busy):
                yield from self._collect(busy, idle)
            finished = True
        finally:
            if not finished:
                self.kill()  # an error or an early stop

    def _hand_out(self, function: Callable, waiting: Iterator, idle: list, busy: dict) -> bool:
        """Send a job to each idle worker, and to new ones up to `workers`, while jobs are left; whether any
        worker is busy."""
        while idle or len(self.processes) < self.workers:
            job = next(waiting, STOP)
            if job is STOP:
                break
            connection = idle.pop() if idle else self._start(function)
            connection.send((function, job))
            busy[connection] = job
        return bool(busy)

    def _collect(self, busy: dict, idle: list) -> Iterator:
        """The results of the busy workers that are done (each then idle), once one is; a job's error is
        raised here, with the worker's traceback chained."""
        sentinels = {self.processes[connection].sentinel: connection for connection in busy}
        for ready in multiprocessing.connection.wait([*busy, *sentinels]):
            connection = sentinels.get(ready, ready)
            if connection not in busy:
                continue  # its result and its exit were both ready; the result was taken
            job = busy.pop(connection)
            ok, value, text = receive(connection, self.processes[connection], job)
            if not ok and text:
                raise value from RemoteTraceback(text)
            if not ok:
                raise value
            idle.append(connection)
            yield value

    def close(self) -> None:
        """Stop the workers: each finishes and exits."""
        for connection in self.processes:
            with contextlib.suppress(OSError):  # it is gone already
                connection.send(STOP)
        for process in self.processes.values():
            process.join()
        self._forget()

    def kill(self) -> None:
        """Kill the workers (one still starting from the forkserver would ignore SIGTERM)."""
        for process in self.processes.values():
            if process.exitcode is None:
                process.kill()
            process.join()
        self._forget()

    def _forget(self) -> None:
        for connection in self.processes:
            connection.close()
        self.processes = {}


def imap_unordered(
    function: Callable[[Job], Result], jobs: Iterable[Job], workers: int, start_method: str | None = None
) -> Iterator[Result]:
    """function(job) for each job, yielded as they finish, from `workers` processes of a `Pool` made for this
    call alone. The processes start from a forkserver by default, not as forks of this one, whose threads (a
    progress bar's refresh thread, say) a fork would copy mid-step (see project/data/workers.py); closing the
    iterator early kills them."""
    with Pool(workers, start_method) as pool:
        yield from pool.imap_unordered(function, jobs)


def receive(connection, process, job) -> tuple[bool, object, str]:
    """(True, result, "") or (False, error, its traceback) from a worker, or a WorkerDied where it died first."""
    try:
        return connection.recv()
    except (EOFError, OSError):
        process.join()
        code = process.exitcode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        hint = " (out of memory?)" if code == -signal.SIGKILL else ""
        shown = repr(job) if len(repr(job)) <= 200 else repr(job)[:200] + "..."
        return False, WorkerDied(f"a worker process {how}{hint} on job {shown}"), ""


def serve(connection) -> None:
    """A worker: run (function, job) pairs from the pipe until told to stop, sending back (ok, result or
    error, traceback)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the forkserver we come from ignores it
    while (received := connection.recv()) is not STOP:
        function, job = received
        try:
            connection.send((True, function(job), ""))
        except Exception as error:  # noqa: BLE001 - every job error is sent back, with its traceback
            text = '\n"""\n' + "".join(traceback.format_exception(error)) + '"""'
            try:
                pickle.loads(pickle.dumps(error))  # one that pickles but does not unpickle would fail us there
                connection.send((False, error, text))
            except Exception:  # noqa: BLE001 - an error that does not pickle is sent as its text
                connection.send((False, RuntimeError(f"{type(error).__name__}: {error}"), text))
