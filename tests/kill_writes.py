"""Test-only: SIGKILL a command at the Nth result file it writes through project/data/atomic.py (`write_atomically`,
`replace_atomically`, and the text and JSON writers built on them), halfway through the file's bytes ("torn") or
right after its rename ("after"). tests/test_kill_results.py sweeps N over every write of a command.

Two ways in:
- a real command: `environment(log, at, mode)` added to its environment puts tests/kill_hook/ first on
  PYTHONPATH, whose sitecustomize.py calls `install` in every Python process the command starts (the command,
  its forkserver, its pool and DataLoader workers); the kill takes the whole process group, so start the
  command in a session of its own (`start_new_session=True`).
- a forked child of the test process (`in_fork`): `install` there rebinds the writers wherever they were
  imported, and the kill takes the child alone.

Every write, in any process, appends `number<TAB>pid<TAB>path` to the log (under a lock), so a run with
`at=0`, which never kills, lists a command's writes in order.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import signal
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
HOOK_FOLDER = Path(__file__).resolve().parent / "kill_hook"
MODES = ("torn", "after")


def environment(log: Path, at: int, mode: str = "torn") -> dict[str, str]:
    """The variables that make a command's processes count their writes in `log` and die at write `at`."""
    assert mode in MODES, mode
    return {
        "PYTHONPATH": f"{HOOK_FOLDER}{os.pathsep}{REPO}",
        "KILL_AT_WRITE": str(at),
        "KILL_WRITES_LOG": str(log),
        "KILL_MODE": mode,
    }


def writes(log: Path) -> list[str]:
    """The paths written, in order, as the log recorded them."""
    if not log.exists():
        return []
    return [line.split("\t", 2)[2] for line in log.read_text().splitlines()]


def _count(log: Path, path: object) -> int:
    with open(log, "a+") as stream:
        fcntl.flock(stream, fcntl.LOCK_EX)  # processes of one command write at once (prepare's pool)
        stream.seek(0)
        number = len(stream.readlines()) + 1
        stream.write(f"{number}\t{os.getpid()}\t{path}\n")
        stream.flush()
    return number


@dataclass(frozen=True)
class Kill:
    """Where to die: at write number `at` of those counted in `log` (never with 0), halfway through the file's
    bytes ("torn") or right after its rename ("after"); the process group with `whole_group`, else this process."""

    log: Path
    at: int
    mode: str
    whole_group: bool

    def die(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        if self.whole_group:
            os.killpg(os.getpgrp(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)


def install(log: Path, at: int, mode: str, whole_group: bool) -> None:
    """Count every atomic write in `log`; SIGKILL at write number `at` (never with 0): the process group with
    `whole_group`, else this process."""
    from project.data import atomic

    kill = Kill(log, at, mode, whole_group)
    real_write, real_replace = atomic.write_atomically, atomic.replace_atomically
    wrappers = {
        id(real_write): killing(real_write, _tear_stream, kill),
        id(real_replace): killing(real_replace, _tear_file, kill),
    }
    for module in list(sys.modules.values()):  # atomic's own names, and every `from ... import` made so far
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for name, value in list(namespace.items()):
            if id(value) in wrappers:  # the originals are alive: their ids are theirs alone
                setattr(module, name, wrappers[id(value)])


def killing(real: Callable, tear: Callable[[Any], None], kill: Kill) -> Callable:
    """`real` (project.data.atomic's `write_atomically` or `replace_atomically`, whose signature it keeps),
    counting its writes and dying at `kill.at`, after the rename or with `tear` halving what was written."""

    def wrapper(path: Any, write: Callable, root: Any = None) -> Any:
        if _count(kill.log, path) != kill.at:
            return real(path, write, root)
        if kill.mode == "after":
            real(path, write, root)
            kill.die()

        def torn(target: Any) -> None:
            write(target)
            tear(target)
            kill.die()

        return real(path, torn, root)

    return wrapper


def _tear_stream(stream: Any) -> None:
    """`write_atomically`'s stream: half the bytes reached the disk."""
    stream.flush()
    os.ftruncate(stream.fileno(), os.fstat(stream.fileno()).st_size // 2)


def _tear_file(temporary: Path) -> None:
    """`replace_atomically`'s temporary file: half its bytes reached the disk."""
    if os.path.exists(temporary):
        os.truncate(temporary, os.path.getsize(temporary) // 2)


def in_fork(function: Callable[[], object], log: Path, at: int, mode: str = "torn") -> int:
    """Run `function` in a forked child that counts its writes in `log` and dies at write `at`; its exit code
    (-9 when it was killed, 0 when it finished, 1 when it raised: the traceback is appended to `log`.err).

    For commands that run in this process (no DataLoader workers, no pool): the child shares the test
    process's imports, so a kill point costs milliseconds instead of a new interpreter's imports."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into the test process
        code = 0
        try:
            install(log, at, mode, whole_group=False)
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                function()
        except BaseException:  # noqa: BLE001 - reported to the parent through the file
            Path(f"{log}.err").write_text(traceback.format_exc())
            code = 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)
