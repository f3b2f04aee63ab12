"""A plain folder of files as shards: what `project.predict` reads when it is given a folder of images (or of
.txt files) instead of shards.

Each regular file the task can read (by suffix) becomes one sample (a link out of the folder, a FIFO or a device
is skipped, and the count said on stderr), packed once into uncompressed tar shards in a
temporary folder of this user's alone (`project.data.private`), named after the folder's listing (paths,
sizes and modification times): a second run over the same files reuses the shards, so a killed predict
resumes on the same plan, and a changed folder gets new ones. The packing is deterministic and lands with one
rename, so ranks that pack the same folder at the same time agree without talking to each other.

A sample's key is the file's path relative to the folder, with the dots and percent signs of its file name
escaped (webdataset's key rule ends a key at the file name's first dot): `unpack_key` gives the path back.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

from project.data.paths import Listed, SourceFile, open_regular, source_files
from project.data.private import private_folder
from project.data.shard_index import INDEX_NAME, Shard, write_index
from project.data.specs import SHARD_SUFFIXES
from project.errors import UserError
from project.shown import shown

FILES_PER_SHARD = 1000
PACKED_KEY = "files_from"  # the shard index of a packed folder records the folder under this key


def is_plain_folder(spec: object) -> bool:
    """A local folder with neither a shard index nor tar shards in it."""
    if not isinstance(spec, str) or not os.path.isdir(spec):
        return False
    if os.path.exists(os.path.join(spec, INDEX_NAME)):
        return False
    return not any(name.endswith(SHARD_SUFFIXES) for name in os.listdir(spec))


def listing(folder: Path, suffixes: frozenset[str]) -> Listed:
    """The regular files under `folder` whose suffix is one of `suffixes`, sorted by relative path (hidden ones
    out), and a line for each entry skipped: a link out of the folder, a FIFO, a device (`source_files`), a
    name that is no UTF-8 (a sample key and a row of predictions are text)."""
    listed = source_files(folder, tuple(f".{suffix}" for suffix in suffixes), hidden=False)
    unnamed = [file for file in listed.files if not _utf8(file.path)]
    if unnamed:
        listed.skipped += [f"skipped {file.path}: its name is not UTF-8" for file in unnamed]
        listed.files = [file for file in listed.files if _utf8(file.path)]
    listed.files.sort(key=lambda file: Path(file.path).relative_to(folder).as_posix())
    return listed


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # os.fsdecode's lone surrogates, for bytes that are no UTF-8
        return False
    return True


def pack_key(relative: str) -> str:
    """The sample key of a relative path: its file name's '%' and '.' escaped, so the key keeps them all."""
    folder, _, name = relative.rpartition("/")
    escaped = name.replace("%", "%25").replace(".", "%2E")
    return f"{folder}/{escaped}" if folder else escaped


def unpack_key(key: str) -> str:
    """The relative path a packed key came from."""
    return key.replace("%2E", ".").replace("%25", "%")


def pack_folder(folder: str, suffixes: frozenset[str], cache: str | None = None) -> str:
    """Pack the readable files of `folder` into shards (once) and return the folder that holds them."""
    source = Path(folder).resolve()
    if not suffixes:
        raise UserError(f"{folder} is a plain folder (no shards, no {INDEX_NAME}), and this task reads none")
    listed = listing(source, suffixes)
    files = listed.files
    if listed.skipped:  # the packed shards leave them out: say so, as a tool says what it skipped
        first = shown(listed.skipped[0])  # a file's name, from the folder
        print(f"{len(listed.skipped)} files skipped in {shown(folder)}; the first: {first}", file=sys.stderr)
    if not files:
        wanted = ", ".join(f".{suffix}" for suffix in sorted(suffixes))
        raise UserError(f"no shards and no files to read in {folder}: expected a {INDEX_NAME}, .tar files or {wanted}")
    digest = hashlib.sha256(str(source).encode())
    for file in files:
        stat = os.stat(file.real)
        relative = Path(file.path).relative_to(source).as_posix()
        digest.update(f"\0{relative}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    # a folder of this user's alone: in the shared /tmp, another user could plant an index at a name a hash
    # of the listing makes predictable
    target = private_folder("files", cache) / digest.hexdigest()[:24]
    if (target / INDEX_NAME).exists():
        return str(target)
    building = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        shards = [
            write_shard(building / f"files-{number:06d}.tar", source, files[start : start + FILES_PER_SHARD])
            for number, start in enumerate(range(0, len(files), FILES_PER_SHARD))
        ]
        write_index(building / INDEX_NAME, shards, name=source.name, extra={PACKED_KEY: str(source)})
        os.rename(building, target)  # atomic; fails if another process packed it first, which is as good
    except OSError as error:  # a file replaced since the listing (a FIFO, a link), or another rank's rename
        if not (target / INDEX_NAME).exists():
            raise UserError(f"cannot pack {folder}: {shown(error)}") from None
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return str(target)


def write_shard(path: Path, source: Path, files: list[SourceFile]) -> Shard:
    """One uncompressed tar of `files`, each as member `<key>.<suffix>` (the suffix in lower case). Each is
    opened as a regular file (`open_regular`: a FIFO put in its place since the listing never blocks), and its
    size taken from the open file."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:  # pax: paths of any length
        for file in files:
            relative = Path(file.path).relative_to(source).as_posix()
            info = tarfile.TarInfo(f"{pack_key(relative)}.{Path(file.path).suffix[1:].lower()}")
            with open_regular(file.real) as stream:
                info.size, info.mtime, info.mode = os.fstat(stream.fileno()).st_size, 0, 0o644
                tar.addfile(info, stream)
    return Shard(str(path), len(files), path.stat().st_size)
