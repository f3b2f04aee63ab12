"""A DataLoader worker that dies (the out-of-memory killer's SIGKILL, a segfault): noticed within a second,
and named in one line by the entry point.

torch finds a dead worker in one of two ways. A worker forked by the training process (`fork`) is its child,
and the child's SIGCHLD makes the next fetch raise "DataLoader worker (pid N) is killed by signal: Killed.".
Our workers start from a forkserver, whose children they are: the training process learns of a death only
when it has waited `_utils.MP_STATUS_CHECK_INTERVAL` (5 s) for a batch and then looks at its workers, and
raises "DataLoader worker (pid(s) N) exited unexpectedly". `poll_workers_often` makes it look every
`POLL_SECONDS` instead; `dead_worker` reads either error.
"""

from __future__ import annotations

import re
import signal
import weakref
from dataclasses import dataclass
from typing import Any

from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from project.errors import causes

POLL_SECONDS = 0.5
_PIDS = re.compile(r"DataLoader worker \(pids?(?:\(s\))? ([\d, ]+)\)")
_SIGNAL = re.compile(r"killed by signal: ([^.]+)")


@dataclass
class DeadWorker:
    """The pids of the workers that died, and how, where known ("killed by SIGKILL", "exit code 1")."""

    pids: list[int]
    how: str | None = None

    def describe(self) -> str:
        pids = ", ".join(map(str, self.pids))
        return f"pid{'s' if len(self.pids) > 1 else ''} {pids}" + (f", {self.how}" if self.how else "")


def dead_worker(error: BaseException | None) -> DeadWorker | None:
    """The dead worker behind `error` (or an error it was raised from), else None."""
    for link in causes(error):
        found = _PIDS.search(str(link)) if isinstance(link, RuntimeError) else None
        if found:
            pids = [int(pid) for pid in found.group(1).replace(",", " ").split()]
            killed = _SIGNAL.search(str(link))
            return DeadWorker(pids, f"killed by signal: {killed.group(1)}" if killed else _exit_of(link))
    return None


def _exit_of(error: BaseException) -> str | None:
    """How the workers of torch's "exited unexpectedly" ended: their exit codes, found in the frame that
    raised it (the `failed_workers` it had just found dead)."""
    traceback = error.__traceback__
    while traceback is not None and traceback.tb_next is not None:
        traceback = traceback.tb_next
    workers = traceback.tb_frame.f_locals.get("failed_workers", []) if traceback is not None else []
    codes = [getattr(worker, "exitcode", None) for worker in workers]
    codes = [code for code in codes if code is not None]
    if not codes:
        return None
    code = codes[0]
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def poll_workers_often(trainer: Any) -> None:
    """Make the current loaders' iterators look at their workers every `POLL_SECONDS` while they wait for a
    batch (torch: every 5 s), so that a dead worker stops the run about a second after it died.

    Reaches into Lightning's loops and torch's iterator; where either differs from what is expected here,
    nothing changes and torch's own check remains. An iterator given a timeout (DataLoader's `timeout`)
    keeps it."""
    fit = getattr(trainer, "fit_loop", None)
    loops = [fit, getattr(getattr(fit, "epoch_loop", None), "val_loop", None)]
    loops += [getattr(trainer, name, None) for name in ("validate_loop", "test_loop", "predict_loop")]
    for loop in loops:
        combined = getattr(getattr(loop, "_data_fetcher", None), "iterator", None)
        for iterator in getattr(getattr(combined, "_iterator", None), "iterators", None) or []:
            if isinstance(iterator, _MultiProcessingDataLoaderIter) and "_try_get_data" not in vars(iterator):
                iterator._try_get_data = _FastPoll(iterator)


class _FastPoll:
    """An iterator's `_try_get_data` with a short default timeout: an empty wait of POLL_SECONDS returns
    (False, None), torch's caller asks again, and each return checks the workers first. It holds its
    iterator weakly: a cycle would keep the iterator, and its workers, alive until a garbage collection."""

    def __init__(self, iterator: _MultiProcessingDataLoaderIter) -> None:
        self.iterator, self.method = weakref.ref(iterator), type(iterator)._try_get_data

    def __call__(self, timeout: float = POLL_SECONDS) -> tuple[bool, Any]:
        return self.method(self.iterator(), timeout)
