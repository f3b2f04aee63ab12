"""Files written whole or not at all: a temporary file in the destination's own folder, flushed and fsync'ed,
renamed over the destination (`os.replace`, atomic on POSIX and Windows), and the rename made durable. A
reader, or a run started after a kill at any moment, sees the old file or the new one. Checkpoints and
config.yaml (project/callbacks/atomic_checkpoint.py), shard indexes, the tokenizer and active learning's
files all go through here."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
from collections.abc import Callable
from pathlib import Path
from typing import IO

from project.data.workers import process_alive

PARTIAL = ".partial"  # `.<name>~<host>~<pid>~<random>.partial`: never matches Lightning's `*.ckpt` globs


def write_atomically(path: str | os.PathLike, write: Callable[[IO[bytes]], None]) -> None:
    """Write `path` through `write(stream)` into a temporary file beside it, fsync it, then rename it over
    `path`: a reader (or a run started after a kill) sees the old file or the new one, whole."""
    path = Path(str(path).removeprefix("file://"))
    folder = path.parent
    folder.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(folder)
    temporary = folder / f".{path.name}~{socket.gethostname()}~{os.getpid()}~{secrets.token_hex(4)}{PARTIAL}"
    # os.open: the umask applies (0666 & ~umask), as for any file; mkstemp would make it private (0600)
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(descriptor, "wb") as stream:
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    fsync_folder(folder)


def fsync_folder(folder: Path) -> None:
    """Make a rename in `folder` durable (POSIX; Windows cannot open a folder)."""
    if os.name != "posix":
        return
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    except OSError:  # some filesystems (network ones) refuse fsync on a folder
        pass
    finally:
        os.close(descriptor)


def remove_stale_partials(folder: Path) -> None:
    """Remove the temporary files in `folder` whose writer, a process of this machine, is gone."""
    host = socket.gethostname()
    for partial in folder.glob(f".*{PARTIAL}"):
        parts = partial.name[: -len(PARTIAL)].split("~")
        if len(parts) != 4 or parts[1] != host or not parts[2].isdigit():
            continue
        pid = int(parts[2])
        if pid != os.getpid() and not process_alive(pid):
            with contextlib.suppress(OSError):
                partial.unlink()


def replace_atomically(path: Path, write: Callable[[Path], object]) -> None:
    """`write_atomically` for writers that need a path: `write(temporary)`, where the temporary keeps the
    suffix (PIL and matplotlib pick the format from it); removed if the write fails."""
    temporary = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        write(temporary)
        with open(temporary, "rb+") as stream:
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    fsync_folder(path.parent)
