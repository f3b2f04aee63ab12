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
    with context.Pool(workers, initializer=default_sigterm) as pool:
        yield from pool.imap_unordered(function, jobs)
