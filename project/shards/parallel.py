"""Run a function over jobs in worker processes, or in this process when one worker is asked for.

Our own small pool, not multiprocessing.Pool: Pool restarts a killed worker behind our back (so stopping it
early raced with a fresh worker that still ignored SIGTERM, and Pool.terminate waited for it forever), and it
waits forever when a worker dies, as one killed for memory does. Here each worker has its own pipe and one
job at a time; a dead worker is an error naming its exit code, and stopping kills what is left.
"""

from __future__ import annotations

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


def imap_unordered(
    function: Callable[[Job], Result], jobs: Iterable[Job], workers: int, start_method: str | None = None
) -> Iterator[Result]:
    """function(job) for each job, yielded as they finish, from `workers` processes.

    The processes start from a forkserver by default, not as forks of this one, whose threads (a progress
    bar's refresh thread, say) a fork would copy mid-step (see project/data/workers.py). An error in a job is
    raised here, with the worker's traceback chained; closing the iterator early kills the workers.
    """
    if workers <= 1:
        yield from map(function, jobs)
        return
    context = worker_context("forkserver") if start_method is None else multiprocessing.get_context(start_method)
    waiting = iter(jobs)
    processes: dict[multiprocessing.connection.Connection, multiprocessing.process.BaseProcess] = {}
    busy: dict[multiprocessing.connection.Connection, Job] = {}
    try:
        for _ in range(workers):
            job = next(waiting, STOP)
            if job is STOP:
                break
            ours, theirs = context.Pipe()
            process = context.Process(target=serve, args=(function, theirs), daemon=True)
            process.start()
            theirs.close()
            processes[ours] = process
            ours.send(job)
            busy[ours] = job
        while busy:
            sentinels = {processes[connection].sentinel: connection for connection in busy}
            for ready in multiprocessing.connection.wait([*busy, *sentinels]):
                connection = sentinels.get(ready, ready)
                if connection not in busy:
                    continue  # its result and its exit were both ready; the result was taken
                job = busy.pop(connection)
                ok, value, text = receive(connection, processes[connection], job)
                if not ok:
                    if text:
                        raise value from RemoteTraceback(text)
                    raise value
                yield value
                job = next(waiting, STOP)
                if job is not STOP:
                    connection.send(job)
                    busy[connection] = job
        for connection in processes:
            connection.send(STOP)
        for process in processes.values():
            process.join()
    finally:
        for process in processes.values():
            if process.exitcode is None:
                process.kill()  # an error or an early stop; a worker still starting would ignore SIGTERM
            process.join()
        for connection in processes:
            connection.close()


def receive(connection, process, job) -> tuple[bool, object, str]:
    """(True, result, "") or (False, error, its traceback) from a worker, or a WorkerDied where it died first."""
    try:
        return connection.recv()
    except (EOFError, OSError):
        process.join()
        code = process.exitcode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        hint = " (out of memory?)" if code == -signal.SIGKILL else ""
        return False, WorkerDied(f"a worker process {how}{hint} on job {job!r}"), ""


def serve(function: Callable[[Job], Result], connection) -> None:
    """A worker: run jobs from the pipe until told to stop, sending back (ok, result or error, traceback)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the forkserver we come from ignores it
    while (job := connection.recv()) is not STOP:
        try:
            connection.send((True, function(job), ""))
        except Exception as error:  # noqa: BLE001 - every job error is sent back, with its traceback
            text = '\n"""\n' + "".join(traceback.format_exception(error)) + '"""'
            try:
                pickle.loads(pickle.dumps(error))  # one that pickles but does not unpickle would fail us there
                connection.send((False, error, text))
            except Exception:  # noqa: BLE001 - an error that does not pickle is sent as its text
                connection.send((False, RuntimeError(f"{type(error).__name__}: {error}"), text))
