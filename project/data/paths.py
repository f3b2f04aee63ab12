"""The paths a tool is given: the regular files of a source folder it reads, and the output folder it writes.

A source folder (prepare's image and text folders, the folder a listing lies in, predict's plain folder, a
folder or glob of shards for `index` and `inspect`) may be a stranger's. A link in it can name any file this
user can read (`cats/holiday.jpg -> /proc/self/environ`, `notes.txt -> ~/.aws/credentials`), and a FIFO named
`x.jpg` blocks whoever opens it. `source_files` lists what a tool may read, and a line for each entry it
skipped: a link that leaves the source root, a link to a folder, a broken link, and anything that is not a
regular file (FIFOs, sockets, devices, a folder where a file is expected). A link to a regular file inside
the root is followed: it holds nothing the source does not, and a folder made of relative links (a balanced
subset, a split made with `ln -s`) keeps working. A link to a folder is never descended, even inside the root:
a folder linked into itself would list its files twice, or loop.

An output folder is the user's, but a stranger's run folder or dataset may hold a link in it (`export ->
someone/else/models`). `check_output` refuses to write a path whose links lead out of its output folder; the
one atomic writer (`project/data/atomic.py`) calls it on every write.
"""

from __future__ import annotations

import glob
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import braceexpand

from project.errors import UserError
from project.shown import shown

_KINDS = {
    stat.S_IFDIR: "a folder",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFLNK: "a link",
}


def kind(mode: int) -> str:
    """What a file of this mode is, in words ("a FIFO")."""
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def within(path: str, root: str) -> bool:
    """Whether `path` is `root` or below it (both absolute, links resolved)."""
    path, root = os.path.normcase(path), os.path.normcase(root)
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


# -- reading a source ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceFile:
    """A regular file of a source: where it was found, what to read, and its size when asked for."""

    path: str  # the root joined with its path below the root: keys and lines name it
    real: str  # what to read, links resolved: `path`'s own file, or the regular file inside the root its link names
    size: int = 0


@dataclass
class Listed:
    """A source folder's readable files, and a line for each entry skipped ("skipped PATH: why")."""

    files: list[SourceFile] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def source_files(
    root: str | os.PathLike,
    suffixes: tuple[str, ...] | None = None,
    *,
    recursive: bool = True,
    hidden: bool = True,
    sizes: bool = False,
    base: str | os.PathLike | None = None,
) -> Listed:
    """The regular files under `root` whose names end (in lower case) with one of `suffixes` (all where None),
    in `sorted(os.walk(root))` order, names sorted within a folder. `base` is the source root that links must
    stay inside (`root` where None); `root` itself may be a link: the user named it. File sizes are read only
    with `sizes`. Links to folders are counted whatever their name (a real folder there would be walked)."""
    base = base if base is not None else root
    real_base = os.path.realpath(base)
    top = (os.fspath(root), os.path.realpath(root))
    listed = Listed()
    for _, entries in _folders(top[0], recursive, hidden):
        for entry in sorted(entries, key=lambda e: e.name):
            if hidden or not entry.name.startswith("."):
                wanted = suffixes is None or entry.name.lower().endswith(suffixes)
                found = _entry(entry, wanted, recursive=recursive, sizes=sizes, base=(str(base), real_base), top=top)
                if isinstance(found, SourceFile):
                    listed.files.append(found)
                elif found is not None:
                    listed.skipped.append(f"skipped {entry.path}: {found}")
    return listed


def _entry(
    entry: os.DirEntry, wanted: bool, *, recursive: bool, sizes: bool, base: tuple[str, str], top: tuple[str, str]
) -> SourceFile | str | None:
    """A folder entry as a file to read, why it is skipped, or None where it is no candidate (a name not wanted,
    a real folder, which a recursive walk goes into). `top`: the folder walked, and its real path: a file found
    through real folders only lies at the real path plus its path below `top`, which `open_regular` checks."""
    if entry.is_symlink():
        real = os.path.realpath(entry.path)
        try:
            found = os.stat(real)  # a stat never blocks, nor acts, on a FIFO or a device
        except OSError:
            found = None
        if not (wanted or (recursive and found is not None and stat.S_ISDIR(found.st_mode))):
            return None
        if not within(real, base[1]):
            return f"a link out of {base[0]}"
        if found is None:
            return "a broken link"
        if not stat.S_ISREG(found.st_mode):
            return f"a link to {kind(found.st_mode)}, not followed"
        return SourceFile(entry.path, real, found.st_size)
    if entry.is_dir(follow_symlinks=False):
        return "a folder, not a file" if wanted and not recursive else None
    if not wanted:
        return None
    if entry.is_file(follow_symlinks=False):  # scandir's file type: no stat on Linux
        real = os.path.join(top[1], entry.path[len(top[0]) :].lstrip(os.sep))
        return SourceFile(entry.path, real, entry.stat(follow_symlinks=False).st_size if sizes else 0)
    return f"{kind(entry.stat(follow_symlinks=False).st_mode)}, not a regular file"


def _folders(top: str, recursive: bool, hidden: bool) -> Iterator[tuple[str, list[os.DirEntry]]]:
    """(folder, its entries) for `top` and, when `recursive`, every real folder below it (no link is
    descended), in sorted path order: `sorted(os.walk(top))`'s, which `prepare`'s split depends on. The folders
    are found first and each read again when its turn comes: a million files' entries are never all held."""
    folders, pending = [top], [top] if recursive else []
    while pending:
        with os.scandir(pending.pop()) as scanned:
            below = [e.path for e in scanned if e.is_dir(follow_symlinks=False) and (hidden or e.name[0] != ".")]
        folders += below
        pending += below
    for folder in sorted(folders):
        with os.scandir(folder) as scanned:
            yield folder, list(scanned)


def class_folders(root: str | os.PathLike) -> tuple[list[str], list[str]]:
    """The class folders of ROOT/<class>/...: the names of its real, visible folders, sorted, and a line for
    each link among them (to a folder anywhere: skipped, never descended)."""
    names, skipped = [], []
    with os.scandir(root) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.name.startswith("."):
                continue
            if entry.is_symlink():
                if os.path.isdir(entry.path):
                    skipped.append(f"skipped {entry.path}: a link to a folder, not followed")
            elif entry.is_dir(follow_symlinks=False):
                names.append(entry.name)
    return names, skipped


def open_regular(path: str | os.PathLike, follow_links: bool = False) -> BinaryIO:
    """`path` (its links resolved, as `SourceFile.real` is) opened for reading if it is a regular file; an
    OSError otherwise. The kind is checked before the open (opening a device may act) and again on the
    descriptor: a FIFO or a link put in its place after it was listed is refused, never waited on (O_NONBLOCK,
    O_NOFOLLOW), and so is a file that a folder on its way, replaced by a link since, puts elsewhere (Linux).
    `follow_links`: a link to a regular file is read (a shard that a folder or glob listed by its link's name,
    inside it); a FIFO still never blocks."""
    mode = (os.stat if follow_links else os.lstat)(path).st_mode
    if not stat.S_ISREG(mode):
        raise OSError(f"{path} is {kind(mode)}, not a regular file")
    nofollow = 0 if follow_links else getattr(os, "O_NOFOLLOW", 0)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | nofollow | getattr(os, "O_BINARY", 0)
    descriptor = os.open(path, flags)
    stream = os.fdopen(descriptor, "rb")  # closes the descriptor when closed
    mode = os.fstat(descriptor).st_mode
    if not stat.S_ISREG(mode):
        stream.close()
        raise OSError(f"{path} is {kind(mode)}, not a regular file")
    if not follow_links and _opened_elsewhere(descriptor, path):
        stream.close()
        raise OSError(f"{path} is no longer where it was listed: a folder on its way was replaced (by a link?)")
    return stream


def _opened_elsewhere(descriptor: int, path: str | os.PathLike) -> bool:
    """Whether the file open at `descriptor` is not at `path` (as listed: links resolved). O_NOFOLLOW guards the
    last part of a path only: a folder on its way replaced by a link since the listing leads anywhere. Linux
    says where an open file is (/proc/self/fd); elsewhere this is not checked."""
    try:
        opened = os.readlink(f"/proc/self/fd/{descriptor}")
    except OSError:
        return False
    return opened != os.path.abspath(path)


def read_regular(path: str | os.PathLike) -> bytes:
    """The bytes of a regular file (`open_regular`)."""
    with open_regular(path) as stream:
        return stream.read()


def matching_files(pattern: str, suffixes: tuple[str, ...] | None = None) -> Listed:
    """The local files a brace pattern or glob names, with the same rules as `source_files`: a glob's matches
    must stay inside the folder before its first wildcard, and be regular files. A literal path (no wildcard)
    may be a link anywhere (the user named it), but is no FIFO or device either (a missing one is kept, for
    the caller's "not found")."""
    listed = Listed()
    for part in braceexpand.braceexpand(pattern):
        wildcard = re.search(r"[*?\[]", part)
        if not wildcard:
            mode = os.stat(part).st_mode if os.path.exists(part) else stat.S_IFREG
            if stat.S_ISREG(mode):
                listed.files.append(SourceFile(part, part))
            else:
                listed.skipped.append(f"skipped {part}: {kind(mode)}, not a regular file")
            continue
        base = os.path.dirname(part[: wildcard.start()]) or "."
        real_base = os.path.realpath(base)
        for match in sorted(glob.glob(part)):
            if suffixes is not None and not match.lower().endswith(suffixes):
                continue
            real = os.path.realpath(match)
            mode = os.stat(real).st_mode if os.path.exists(real) else None
            if not within(real, real_base):
                listed.skipped.append(f"skipped {match}: a link out of {base}")
            elif mode is None or not stat.S_ISREG(mode):
                listed.skipped.append(f"skipped {match}: {'a broken link' if mode is None else kind(mode)}")
            else:
                listed.files.append(SourceFile(match, real))
    return listed


# -- writing an output ---------------------------------------------------------------------------------


def check_output(path: str | os.PathLike, root: str | os.PathLike | None = None) -> Path:
    """`path`, or a `UserError` naming it where following its links leads out of `root`: a link in its path
    below `root`, or a target that is itself such a link. `root` is the output folder the tool writes into
    (the target's own folder where None); it may be a link itself: the user named it, or chose where it is."""
    path = Path(path)
    root = Path(root) if root is not None else Path(os.path.dirname(os.path.abspath(path)))
    real_root = os.path.realpath(root)
    if within(os.path.realpath(path), real_root):
        return path
    link = _first_link_out(path, root, real_root)
    why = f"{shown(link)} is a link out of {root}" if link is not None else f"it is outside {root}"
    raise UserError(f"refusing to write {shown(path)}: {why}")  # a name from a stranger's folder


def make_folder(folder: str | os.PathLike) -> Path:
    """`folder`, made with its parents where missing; a `UserError` naming it where it cannot be (a file in
    its place: `--out` naming an existing file; no permission), never a traceback."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        placed = isinstance(error, FileExistsError | NotADirectoryError)  # a file where a folder is needed
        why = "a file is in the way" if placed else error.strerror or error
        raise UserError(f"cannot make the folder {shown(folder)}: {why}") from None
    return folder


def _first_link_out(path: Path, root: Path, real_root: str) -> Path | None:
    """The first link in `path` below `root` (or `path` itself) whose target is outside `real_root`."""
    absolute, top = Path(os.path.abspath(path)), Path(os.path.abspath(root))
    try:
        parts = absolute.relative_to(top).parts
    except ValueError:
        return None
    current = top
    for part in parts:
        current = current / part
        if current.is_symlink() and not within(os.path.realpath(current), real_root):
            return current
    return None
