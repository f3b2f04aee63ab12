"""Run a function over jobs in worker processes, or in this process when one worker is asked for."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

Job = TypeVar("Job")
Result = TypeVar("Result")


def imap_unordered(
    function: Callable[[Job], Result], jobs: Iterable[Job], workers: int, start_method: str | None = None
) -> Iterator[Result]:
    """function(job) for each job, yielded as they finish, from `workers` processes."""
    if workers <= 1:
        yield from map(function, jobs)
        return
    with multiprocessing.get_context(start_method).Pool(workers) as pool:
        yield from pool.imap_unordered(function, jobs)
