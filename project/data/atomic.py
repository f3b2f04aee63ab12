"""Files written whole or not at all: a temporary file in the destination's own folder, flushed and fsync'ed,
renamed over the destination (`os.replace`, atomic on POSIX and Windows), and the rename made durable. A
reader, or a run started after a kill at any moment, sees the old file or the new one. Checkpoints and
config.yaml (project/callbacks/checkpoint_io.py, save_config.py), shard indexes and shards, the remote cache,
the tokenizer, prepare's manifest and reports, export's models and report, predict's progress and output,
best.yaml and active learning's files all go through here: the one atomic writer. Each write first refuses,
in one line, a path whose links lead out of its output folder (`project.data.paths.check_output`): `root`, where
the caller names the folder the user gave it, else the target's own folder, so a target that is a link out is
refused on every path."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
from collections.abc import Callable
from pathlib import Path
from typing import IO

from project.data.paths import check_output, make_folder
from project.data.workers import process_alive

PARTIAL = ".partial"  # in the temporary's name: see `_temporary`


def _temporary(path: Path, keep_suffix: bool = False) -> Path:
    """`.<name>~<host>~<pid>~<random>.partial[<suffix>]` beside `path`: never matches a reader's glob (`*.ckpt`,
    `*.tar`), and names the process that writes it, so a dead writer's temporary can be removed."""
    suffix = path.suffix if keep_suffix else ""
    return path.with_name(f".{path.name}~{socket.gethostname()}~{os.getpid()}~{secrets.token_hex(4)}{PARTIAL}{suffix}")


def write_atomically(
    path: str | os.PathLike, write: Callable[[IO[bytes]], None], root: str | os.PathLike | None = None
) -> None:
    """Write `path` through `write(stream)` into a temporary file beside it, fsync it, then rename it over
    `path`: a reader (or a run started after a kill) sees the old file or the new one, whole. `root`: the
    output folder `path` is in (see the module's docstring)."""
    path = check_output(Path(str(path).removeprefix("file://")), root)  # before a folder is made through a link
    folder = make_folder(path.parent)  # one line where a file is in its place
    remove_stale_partials(folder)
    temporary = _temporary(path)
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


def replace_atomically(
    path: str | os.PathLike, write: Callable[[Path], object], root: str | os.PathLike | None = None
) -> None:
    """`write_atomically` for writers that need a path: `write(temporary)`, where the temporary keeps the
    suffix (PIL, matplotlib and ONNX pick the format from it); removed if the write fails."""
    path = check_output(path, root)
    make_folder(path.parent)
    remove_stale_partials(path.parent)
    temporary = _temporary(path, keep_suffix=True)
    try:
        write(temporary)
        with open(temporary, "rb+") as stream:
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    fsync_folder(path.parent)


def write_text_atomically(path: str | os.PathLike, text: str, root: str | os.PathLike | None = None) -> None:
    """A text file (UTF-8), whole or not at all."""
    data = text.encode("utf-8")
    write_atomically(path, lambda stream: stream.write(data), root)


def write_json_atomically(path: str | os.PathLike, data: object, root: str | os.PathLike | None = None) -> None:
    """A JSON file, indented, whole or not at all."""
    write_text_atomically(path, json.dumps(data, indent=1) + "\n", root)


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
    for partial in folder.glob(f".*{PARTIAL}*"):
        head, found, _ = partial.name.rpartition(PARTIAL)
        parts = head.split("~")
        if not found or len(parts) != 4 or parts[1] != host or not parts[2].isdigit():
            continue
        pid = int(parts[2])
        if pid != os.getpid() and not process_alive(pid):
            with contextlib.suppress(OSError):
                partial.unlink()
