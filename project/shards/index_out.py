"""Where `shards.index` writes: a local path (`write_index`, atomic), or a store's url (through fsspec, one object
written whole, beside the shards: the urls of shards in its folder stored relative to it, as a local index stores
them); and the journal of a run, beside a local index, or in the user's cache folder for a url (a store holds no
file that grows). A url is never a local path: `s3://b/x` is not the folder `s3:/b/x`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

from project.data.index_cache import cache_folder
from project.data.outputs import store_output
from project.data.paths import make_folder
from project.data.remote import is_remote, local_path
from project.data.shard_index import INDEX_KIND, WIDS_KEYS, Shard, write_index
from project.data.stores import FsspecStream, filesystem
from project.errors import UserError
from project.redact import redact, redact_text


def check_out(out: str) -> None:
    """Refuse, before any work, an output that cannot be written: a local folder where a file is in the way, an
    http(s) url, a command, a store whose package is missing (one line naming it)."""
    if not is_remote(out):
        make_folder(Path(local_path(out)).absolute().parent)  # one line where a file is in the way, before any read
        return
    store_output("--out", out, "index writes a local file or")


def journal_path(out: str) -> Path:
    """The journal of a run writing `out`: beside a local index, in the cache folder for a url."""
    if not is_remote(out):
        return Path(local_path(out)).with_name(Path(local_path(out)).name + ".journal")
    name = hashlib.sha256(out.encode("utf-8", "surrogateescape")).hexdigest()[:40]
    return cache_folder() / "journals" / f"{name}.journal"


def write_out(out: str, shards: Sequence[Shard], name: str | None, extra: dict) -> None:
    """Write the index to `out`: a local path or a store's url."""
    if not is_remote(out):
        write_index(local_path(out), shards, name=name, extra=extra)
        return
    folder = out.rsplit("/", 1)[0] + "/"
    data = {
        "__kind__": INDEX_KIND,
        "wids_version": 1,
        "name": name or folder.rstrip("/").rsplit("/", 1)[-1],
        "shardlist": [
            {"url": _relative(shard.url, folder), "nsamples": shard.nsamples, "filesize": shard.filesize}
            for shard in shards
        ],
    }
    data.update({key: value for key, value in extra.items() if key not in WIDS_KEYS})
    fs, path = filesystem(out)
    try:  # one object, whole or absent: a store never shows a reader half of it
        FsspecStream.call(fs.pipe_file, path, (json.dumps(data, indent=1) + "\n").encode("utf-8"))
    except OSError as error:
        raise UserError(f"cannot write {redact(out)}: {redact_text(str(error))}") from None


def _relative(url: str, folder: str) -> str:
    """A shard's url relative to the index's folder where it is a plain file of it (no query, not deeper)."""
    rest = url[len(folder) :] if url.startswith(folder) else ""
    return rest if rest and "/" not in rest and "?" not in rest and "#" not in rest else url


def index_name(out: str) -> str:
    """The index's name: the folder it is written into."""
    return out.rstrip("/").rsplit("/", 2)[-2] if is_remote(out) else Path(local_path(out)).parent.name
