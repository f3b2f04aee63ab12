"""The CPU time and memory of a loader's processes (benchmarks/peer_loaders.py's `run_epoch`, threads.py): this
process and its descendants, read from /proc."""

from __future__ import annotations

import os
import time


class Processes:
    """CPU seconds and summed RSS of this process and its descendants (DataLoader workers, a forkserver),
    read from /proc/<pid>/stat each time a batch arrives: a worker's CPU time is complete when its last
    batch arrives. The RSS sum counts pages shared between processes once per process: an upper bound. The
    PSS sum (each shared page split between its processes, from /proc/<pid>/smaps_rollup, every 0.5 s) is
    what they hold together.

    The CPU this sampling costs (reading smaps_rollup walks a process's pages: 9 ms for a process of 0.9 GB,
    so some 36 ms each 0.5 s for a loader of four such processes) is counted apart (`own_seconds`) and left
    out of `cpu_seconds`: it is this harness's, not the loader's."""

    def __init__(self) -> None:
        import psutil

        self.me = psutil.Process()
        self.ticks, self.page = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")
        self.pids = [self.me.pid] + [child.pid for child in self.me.children(recursive=True)]
        self.start = {pid: self._stat(pid)[0] for pid in self.pids}  # CPU already spent before the epoch
        self.last: dict[int, float] = dict(self.start)
        self.peak_rss, self.peak_pss, self.listed = 0, 0, 0.0
        self.own_seconds = 0.0  # this process's CPU spent in `sample`

    def _stat(self, pid: int) -> tuple[float, int]:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self.ticks, int(fields[21]) * self.page

    def sample(self) -> None:
        begin = time.thread_time()
        try:
            self._sample()
        finally:
            self.own_seconds += time.thread_time() - begin

    def _sample(self) -> None:
        if time.perf_counter() - self.listed > 0.5:  # new workers; listing every process costs milliseconds
            self.pids = [self.me.pid] + [child.pid for child in self.me.children(recursive=True)]
            self.listed = time.perf_counter()
            self.peak_pss = max(self.peak_pss, sum(map(proportional_set_size, self.pids)))
        rss = 0
        for pid in self.pids:
            try:
                self.last[pid], resident = self._stat(pid)
            except (OSError, IndexError):
                continue  # exited
            rss += resident
        self.peak_rss = max(self.peak_rss, rss)

    def cpu_seconds(self) -> float:
        """The CPU seconds of this process and its descendants since this object was made, less the sampling's."""
        return sum(cpu - self.start.get(pid, 0.0) for pid, cpu in self.last.items()) - self.own_seconds


def proportional_set_size(pid: int) -> int:
    """A process's PSS in bytes (0 once it has exited, or where the kernel has no smaps_rollup)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as rollup:
            for line in rollup:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0
