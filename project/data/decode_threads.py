"""Batches decoded by threads of one loader process, in order, with each batch's random draws its own.

With `data.decode_threads` N > 1, a loader process (a DataLoader worker, or the training process itself when
`num_workers` is 0) reads and shuffles its samples in one thread and decodes N batches at once in a thread pool.
JPEG decoding (simplejpeg, libjpeg-turbo) and OpenCV's resize release the GIL, so the threads share the cores;
with `num_workers` 0 there is then no worker process, no forkserver and no hand-over of batches between
processes: the training process's memory and nothing more, as SPDL's threads in one process (benchmarks/README.md).

Augmentation draws from torch's default generator, which the stream seeds per batch (the same crops on every run
and after a resume). That generator is one per process, shared by the threads and, with `num_workers` 0, by the
model and the user's callbacks. So a decode thread never touches it: each batch has a generator of its own
(`BatchRandom`), seeded as the stream seeds the default one, which the task's draws in `decode` take
(`batch_generator()`); the batch's `collate`, where torchvision's transforms draw from the default generator,
runs in the loader's own thread, with that generator set to where the batch's left off. A batch's draws are then
one sequence, whichever thread decodes it and whatever else draws meanwhile: the batches are exactly one
thread's. Our own pool, not `torch.utils.data`'s (which has processes only) nor SPDL's (a whole pipeline
framework): a bounded, ordered map is all the stream needs.
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

_local = threading.local()  # a decode thread's current batch (`random`)


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
    """One batch's generator, as `torch.manual_seed(seed)` would leave torch's default one."""

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    @contextlib.contextmanager
    def current(self) -> Iterator[None]:
        """This batch is the thread's current one: `batch_generator` in it is the batch's generator."""
        _local.random = self
        try:
            yield
        finally:
            _local.random = None

    @contextlib.contextmanager
    def continued(self) -> Iterator[None]:
        """torch's default generator, within the block, continues this batch's draws (and is restored after):
        for the batch's `collate`, in the loader's own thread."""
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.set_state(self.generator.get_state())
            yield


def batch_generator() -> torch.Generator | None:
    """The generator a task's draws in `decode` take (`torch.rand(n, generator=batch_generator())`): in a decode
    thread, the batch's own; otherwise None, torch's default one, which the stream seeded for the batch. Either
    way the same draws."""
    random = getattr(_local, "random", None)
    return None if random is None else random.generator
