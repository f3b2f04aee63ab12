"""Batches decoded by threads of one loader process, in order, with each batch's random draws its own.

With `data.decode_threads` N > 1, a loader process (a DataLoader worker, or the training process itself when
`num_workers` is 0) reads and shuffles its samples in one thread and decodes N batches at once in a thread pool.
JPEG decoding (simplejpeg, libjpeg-turbo) and OpenCV's resize release the GIL, so the threads share the cores;
with `num_workers` 0 there is then no worker process, no forkserver and no hand-over of batches between
processes: the training process's memory and nothing more, as SPDL's threads in one process (benchmarks/README.md).

Augmentation draws from torch's default generator, which the stream seeds per batch (the same crops on every run
and after a resume). That generator is one per process, so threads share it: here each batch keeps its own copy
of the generator's state (`BatchRandom`), and a task's draws run with that state swapped in, under a lock
(`batch_draws`). A batch's draws are then the same sequence, whichever thread decodes it and whatever the others
draw meanwhile: the batches are exactly those of one thread. Our own pool, not `torch.utils.data`'s (which has
processes only) nor SPDL's (a whole pipeline framework): a bounded, ordered map is all the stream needs.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import torch

Job = TypeVar("Job")
Result = TypeVar("Result")

_lock = threading.Lock()  # held while a batch's state is torch's default generator's
_local = threading.local()  # this thread's current batch (`random`), and whether its state is swapped in


def ordered_map(function: Callable[[Job], Result], jobs: Iterable[Job], threads: int) -> Iterator[Result]:
    """function(job) for each job in `threads` threads, yielded in the jobs' order; at most threads + 1 jobs
    are taken ahead of the one yielded (their results are what memory holds). An error is raised where its
    job's result would have been yielded; closing the iterator cancels what has not started and waits for
    what has."""
    executor = ThreadPoolExecutor(threads, thread_name_prefix="decode")
    pending: collections.deque[Future] = collections.deque()
    try:
        for job in jobs:
            pending.append(executor.submit(function, job))
            if len(pending) > threads:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        executor.shutdown(wait=True, cancel_futures=True)


class BatchRandom:
    """One batch's state of torch's default generator, as `torch.manual_seed(seed)` would leave it."""

    def __init__(self, seed: int) -> None:
        self.state = torch.Generator().manual_seed(seed).get_state()

    @contextlib.contextmanager
    def current(self) -> Iterator[None]:
        """This batch is the thread's current one: `batch_draws` in it draws from the batch's state."""
        _local.random = self
        try:
            yield
        finally:
            _local.random = None

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """torch's default generator holds this batch's state within the block (one thread at a time)."""
        with _lock:
            generator = torch.default_generator
            saved = generator.get_state()
            generator.set_state(self.state)
            _local.swapped = True
            try:
                yield
            finally:
                _local.swapped = False
                self.state = generator.get_state()
                generator.set_state(saved)


@contextlib.contextmanager
def batch_draws() -> Iterator[None]:
    """Around a task's draws from torch's default generator in `decode` or `collate`: with decode threads, the
    draws come from the batch's own state; otherwise (the stream seeded the generator for this batch in
    this thread) nothing to do. A task whose every draw is inside one may set `thread_safe = True`."""
    random = getattr(_local, "random", None)
    if random is None or getattr(_local, "swapped", False):
        yield
        return
    with random.swapped_in():
        yield
