"""Temporary folders of this user's alone: `$TMPDIR/lightning-shards-<uid>/<name>`, mode 0700, owned by this
user, never a link. The system's temporary folder is shared by every local user and its names are
predictable, so a folder found there is used only when it passes those checks: another user cannot plant a
shard index for `predict` to read, or a checkpoint for a run to load."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from project.errors import UserError


def private_folder(name: str, root: str | os.PathLike | None = None) -> Path:
    """`<root>/lightning-shards-<uid>/<name>` (root: the system's temporary folder), made if missing; a
    `UserError` where it, or the per-user folder above it, is a link, another user's, or open to others."""
    parent = Path(root or tempfile.gettempdir())
    parent.mkdir(parents=True, exist_ok=True)
    base = parent / f"lightning-shards-{os.getuid()}"
    folder = base / name
    for path in (base, folder):
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)
        _check_private(path)
    return folder


def _check_private(path: Path) -> None:
    found = os.lstat(path)
    if stat.S_ISLNK(found.st_mode) or not stat.S_ISDIR(found.st_mode):
        raise UserError(f"{path} is not a folder but a link or a file: remove it (another user may have planted it)")
    if found.st_uid != os.getuid():
        raise UserError(f"{path} belongs to another user (uid {found.st_uid}): set TMPDIR to a folder of your own")
    if found.st_mode & 0o077:
        raise UserError(f"{path} is open to other users (mode {stat.S_IMODE(found.st_mode):o}): chmod 700 it")
