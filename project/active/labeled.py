"""The labeled set of an active-learning loop: a shard index that only ever grows by whole new shards.

Existing shards are never rewritten. A round's samples are copied from the pool's shards into a new
`round-NNNN.tar` (written under a temporary name, synced, then renamed), and only then is the index
rewritten to list it (`write_index`: a temporary file and a rename). A kill at any point leaves the index
as it was before the append or as it is after it; a shard written but not yet listed is written again
when the command runs again.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

from project.data.paths import check_output
from project.data.remote import is_remote, local_path
from project.data.samples import read_samples
from project.data.shard_index import INDEX_NAME, Shard, ShardIndex, read_index, write_index
from project.data.tarwriter import FastTarWriter
from project.errors import UserError
from project.shown import shown

# what a pool's folder may hold beside its index that a task reads there (the text task's tokenizer)
COMPANION_FILES = ("tokenizer.json",)


def pool_keys(index: ShardIndex) -> Iterator[tuple[str, str]]:
    """(key, shard url) of every pool sample, from the tar headers only: no sample's bytes are read."""
    for shard in index.shards:
        for sample in read_samples(shard.url, extensions=frozenset()):
            yield sample["__key__"], shard.url


def labeled_keys(folder: Path) -> set[str]:
    """The keys the labeled set at `folder` holds (none when it has no index yet)."""
    if not (folder / INDEX_NAME).exists():
        return set()
    return {key for key, _ in pool_keys(read_index(str(folder / INDEX_NAME)))}


def fetch(samples_of: Iterable[tuple[str, str]], drop: frozenset[str] = frozenset()) -> dict[str, dict]:
    """{key: sample with every member} for the (key, shard url) pairs, reading each shard once; members
    with an extension in `drop` are left out (the labels a human oracle replaces)."""
    wanted: dict[str, set[str]] = {}
    for key, url in samples_of:
        wanted.setdefault(url, set()).add(key)
    found: dict[str, dict] = {}
    for url, keys in wanted.items():
        for sample in read_samples(url):
            if sample["__key__"] in keys:
                found[sample["__key__"]] = {k: v for k, v in sample.items() if k not in drop and k != "__url__"}
                if len(keys & found.keys()) == len(keys):
                    break
    missing = [key for keys in wanted.values() for key in keys if key not in found]
    if missing:
        raise UserError(f"{len(missing)} selected samples are no longer in the pool (the first: {shown(missing[0])})")
    return found


def start(folder: Path, seed_set: ShardIndex | None, pool: ShardIndex) -> None:
    """Create the labeled set's index at `folder`: the seed set's shards, and the pool's other index keys
    (class names) so that training finds them; copy what a task reads beside the pool's index."""
    if (folder / INDEX_NAME).exists():
        return
    folder.mkdir(parents=True, exist_ok=True)
    pool_folder = pool_index_folder(pool)
    for name in COMPANION_FILES:
        if pool_folder is not None and (pool_folder / name).exists() and not (folder / name).exists():
            shutil.copyfile(pool_folder / name, check_output(folder / name, folder))  # not through a broken link out
    extra = {**pool.extra, **(seed_set.extra if seed_set else {})}
    write_index(folder / INDEX_NAME, seed_set.shards if seed_set else [], name=folder.name, extra=extra)


def pool_index_folder(pool: ShardIndex) -> Path | None:
    """The local folder of the pool's first shard (where its index and companions are), if local."""
    if not pool.shards or is_remote(pool.shards[0].url):
        return None
    return Path(local_path(pool.shards[0].url)).parent


def append(folder: Path, name: str, samples: list[dict], extra: dict | None = None) -> Path:
    """Add `samples` as the new shard `folder/name` and list it in the index (both atomic, in that order).
    Appending a shard the index already lists does nothing: a re-run after a kill finishes the append."""
    index = read_index(str(folder / INDEX_NAME))
    path = check_output(folder / name, folder)  # a shard name planted as a link out of the labeled set
    if lists(index, name):
        return path
    if not samples:
        raise ValueError("an appended shard holds at least one sample")
    for stale in [*folder.glob(f".{name}.*.tmp"), *folder.glob(f".{INDEX_NAME}.*.tmp")]:  # an earlier try's, killed
        stale.unlink(missing_ok=True)
    temporary = folder / f".{name}.{os.getpid()}.tmp"
    with open(temporary, "wb") as stream:
        with FastTarWriter(stream) as writer:
            for sample in samples:
                writer.write(sample)
        stream.flush()
        os.fsync(stream.fileno())  # on disk before the rename makes it visible
    os.replace(temporary, path)
    shards = [*index.shards, Shard(str(path), len(samples), path.stat().st_size)]
    write_index(folder / INDEX_NAME, shards, name=index.name, extra={**index.extra, **(extra or {})})
    return path


def round_is_listed(folder: Path, name: str) -> bool:
    """Whether the labeled set's index lists the shard `name` (its round was appended)."""
    return (folder / INDEX_NAME).exists() and lists(read_index(str(folder / INDEX_NAME)), name)


def lists(index: ShardIndex, name: str) -> bool:
    """Whether `index` lists a shard file called `name` (a labeled set's shards all sit in its folder)."""
    return any(Path(local_path(shard.url)).name == name for shard in index.shards)
