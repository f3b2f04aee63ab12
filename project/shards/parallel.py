"""Run a function over jobs in worker processes, or in this process when one worker is asked for."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from project.data.workers import default_sigterm, worker_context

Job = TypeVar("Job")
Result = TypeVar("Result")


def imap_unordered(
    function: Callable[[Job], Result], jobs: Iterable[Job], workers: int, start_method: str | None = None
) -> Iterator[Result]:
    """function(job) for each job, yielded as they finish, from `workers` processes.

    The processes start from a forkserver by default, not as forks of this one, whose threads (a progress
    bar's refresh thread, say) a fork would copy mid-step (see project/data/workers.py).
    """
    if workers <= 1:
        yield from map(function, jobs)
        return
    context = worker_context("forkserver") if start_method is None else multiprocessing.get_context(start_method)
    pool = context.Pool(workers, initializer=default_sigterm)
    try:
        yield from pool.imap_unordered(function, jobs)
        pool.close()  # every job done: the workers take their end marks and exit; no signal needed
        pool.join()
    finally:
        # an error or an early stop: Pool.terminate sends SIGTERM, which a worker still starting ignores (as
        # the forkserver it forks from does, until its initializer runs), and then waits for it forever (seen:
        # a test hung in Pool.__exit__); SIGKILL first
        for process in pool._pool:  # noqa: SLF001 - the pool's own processes
            if process.exitcode is None:
                process.kill()
        pool.terminate()
