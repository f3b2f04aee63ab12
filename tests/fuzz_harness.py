"""What the fuzz harnesses (tests/test_fuzz.py, tests/test_fuzz_boundaries.py) run each case under.

`bounded(folder)` runs one case with the time bound (SIGALRM, and faulthandler's exit for a hang in C code
where no handler runs), its Python allocations traced (tracemalloc's peak), the working folder set to its
own folder, and an audit hook that notes every write outside that folder (every Python-level open for
writing, mkdir, rename, remove, ...) and every process start: subprocess, os.system, the exec, spawn,
posix_spawn and fork families, pty.spawn, and multiprocessing's starts (a forkserver's child is forked by
the server, not here, so `Process.start` and the server's own start are audited too, for the case's span).
A process start is also refused: the hook raises `ProcessStarted`, so that nothing starts.

The hook is added once a session (`sys.addaudithook` cannot be removed) and does nothing between cases.
`write_report` merges a harness's outcome counts into the file FUZZ_REPORT names, so that the two harnesses
run in one session leave both.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import multiprocessing.process
import multiprocessing.util
import os
import signal
import sys
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path

EXAMPLES, SEED = int(os.environ.get("FUZZ_EXAMPLES", "1000")), os.environ.get("FUZZ_SEED")
MEMORY_BOUND = 64 << 20  # tracemalloc's peak during one case
TIME_BOUND = 5.0  # seconds for one case


class Hang(Exception):
    """A case that ran past its time bound."""


class ProcessStarted(Exception):
    """Raised by the audit hook where a case tries to start a process: nothing starts."""


WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
WRITE_EVENTS = {
    "open",
    "os.mkdir",
    "os.rename",
    "os.remove",
    "os.rmdir",
    "os.symlink",
    "os.link",
    "os.truncate",
    "os.chmod",
    "os.utime",
    "shutil.copyfile",
    "shutil.rmtree",
}
PROCESS_EVENTS = {
    "subprocess.Popen",
    "os.system",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.fork",
    "os.forkpty",
    "pty.spawn",
    "os.startfile",
    "multiprocessing.Process.start",
    "multiprocessing.util.spawnv_passfds",
}


@dataclass
class Run:
    """What the running case did: its folder (None between cases), writes outside it, processes started."""

    folder: str | None = None
    writes: list[str] = field(default_factory=list)
    processes: list[str] = field(default_factory=list)
    peak: int = 0  # tracemalloc's peak, once the case is over


RUN = Run()
_HOOKED: list[bool] = []


def audit(event: str, args: tuple) -> None:
    """Note every write outside the running case's folder, and refuse (and note) every process start."""
    folder = RUN.folder and RUN.folder + os.sep
    if folder is None:
        return
    if event in PROCESS_EVENTS:
        shown = repr(args)
        RUN.processes.append(f"{event} {shown if len(shown) <= 200 else shown[:197] + '...'}")
        raise ProcessStarted(f"a case started a process ({event})")
    if event not in WRITE_EVENTS:
        return
    if event == "open" and not ((args[1] and set(str(args[1])) & set("wax+")) or (args[2] or 0) & WRITE_FLAGS):
        return
    for path in args[:1] if event == "open" else args[:2]:
        if isinstance(path, str | bytes | os.PathLike) and not os.path.realpath(os.fsdecode(path)).startswith(folder):
            RUN.writes.append(f"{event} {path}")


def install() -> None:
    """Add the audit hook, once a session."""
    if not _HOOKED:
        sys.addaudithook(audit)
        _HOOKED.append(True)


def _audited(function, event: str):
    def started(*args, **kwargs):
        sys.audit(event, *args[:1])
        return function(*args, **kwargs)

    return started


@contextlib.contextmanager
def bounded(folder: Path, time_bound: float = TIME_BOUND):
    """Run a case under the time bound, with its allocations traced, its writes and process starts audited,
    in `folder`. Afterwards RUN holds what it did (`check` asserts the bounds)."""
    install()

    def alarm(signum, frame):
        raise Hang(f"a case ran past {time_bound} s; its files are in {folder}")

    previous, cwd = signal.signal(signal.SIGALRM, alarm), os.getcwd()
    start, spawn = multiprocessing.process.BaseProcess.start, multiprocessing.util.spawnv_passfds
    multiprocessing.process.BaseProcess.start = _audited(start, "multiprocessing.Process.start")
    multiprocessing.util.spawnv_passfds = _audited(spawn, "multiprocessing.util.spawnv_passfds")
    signal.setitimer(signal.ITIMER_REAL, time_bound)
    faulthandler.dump_traceback_later(time_bound * 6, exit=True)  # a hang inside C code, where no handler runs
    tracemalloc.start()
    os.chdir(folder)
    RUN.folder, RUN.writes, RUN.processes, RUN.peak = str(folder.resolve()), [], [], 0
    try:
        yield RUN
    finally:
        RUN.folder = None
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        faulthandler.cancel_dump_traceback_later()
        multiprocessing.process.BaseProcess.start, multiprocessing.util.spawnv_passfds = start, spawn
        RUN.peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        os.chdir(cwd)


def breaches(memory_bound: int = MEMORY_BOUND) -> list[str]:
    """What the last case did that no case may: a write outside its folder, a process, memory past the bound."""
    found = [f"write outside its folder: {write}" for write in RUN.writes]
    found += [f"process started: {process}" for process in RUN.processes]
    if RUN.peak >= memory_bound:
        found.append(f"memory: {RUN.peak:,} bytes allocated, over {memory_bound:,}")
    return found


_REPORTED: list[str] = []


def write_report(summary: dict) -> None:
    """Merge `summary` into the FUZZ_REPORT file (started afresh by this session's first report), if set."""
    if not os.environ.get("FUZZ_REPORT"):
        return
    path = Path(os.environ["FUZZ_REPORT"])
    merged = json.loads(path.read_text()) if _REPORTED and path.exists() else {}
    merged.update(summary)
    path.write_text(json.dumps(merged, indent=1) + "\n")
    _REPORTED.append(str(path))
