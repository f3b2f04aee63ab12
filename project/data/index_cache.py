"""The index of remote shards that came without one: made once by scanning them (scanning.py, with the task's
`Indexer`), cached as a shardindex.json named by a hash of the scan and the url set, and said in one line with the
time it took; the next run reads the cache and no shard. The cache folder is `data.cache_dir`'s `indexes/`, else
`$XDG_CACHE_HOME/lightning-shards/indexes` (`~/.cache/...`). An interrupted scan goes on from its journal there.

A cached index is read like any index (`read_index`: bounded, checked entry by entry), and must name exactly the
shards of its url set, in order: anything else is one line asking to remove it. Its name is an HMAC under the
user's key (journal.py), so a stranger cannot plant one that a run reads; its urls are redacted (no password or
signature on disk), each put back from the run's own list. Two runs indexing the same shards at once wait for each
other: the second reads the first's cache.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from project.data.journal import Journal, url_set_key, user_cache
from project.data.scanning import Indexer, scan_shards
from project.data.shard_index import ShardIndex, read_index, write_index
from project.errors import UserError
from project.redact import redact
from project.shown import shown


def cache_folder(cache_dir: str | os.PathLike | None = None) -> Path:
    """Where cached indexes are kept: `cache_dir`/indexes, else the user's cache folder's."""
    return Path(cache_dir) / "indexes" if cache_dir is not None else user_cache() / "indexes"


def cached_path(urls: Sequence[str], indexer: Indexer, cache_dir: str | os.PathLike | None = None) -> Path:
    """The cached index of `urls` as `indexer` scans them."""
    return cache_folder(cache_dir) / f"{url_set_key(urls, indexer.name)[:40]}.json"


def cached_index(
    urls: Sequence[str],
    indexer: Indexer,
    cache_dir: str | os.PathLike | None = None,
    *,
    sizes: dict[str, int] | None = None,
    workers: int = 8,
) -> ShardIndex:
    """The index of remote shards without one: the cached one, or one made now (a progress bar on a terminal, one
    line when done) and cached."""
    path = cached_path(urls, indexer, cache_dir)
    if path.is_file():
        return read_cached(path, urls)
    journal = Journal(path.with_suffix(".journal"), urls, indexer.name)
    with journal.locked():
        if path.is_file():  # another run indexed them while this one waited
            return read_cached(path, urls)
        started = time.monotonic()
        finished = journal.finished()
        scanned = scan_shards(urls, indexer, workers=workers, finished=finished, record=journal.add, sizes=sizes)
        shards = [result.shard for result in scanned]
        extra = indexer.extra(scanned)
        write_index(path, [replace(shard, url=redact(shard.url)) for shard in shards], name="cached", extra=extra)
        journal.remove()
    index = ShardIndex(shards, None, extra)
    problems = sum(len(result.problems) for result in scanned)
    skipped = f", {problems:,} bad samples that training skips and counts" if problems else ""
    print(
        f"indexed {len(shards):,} remote shards, {index.nsamples:,} samples{skipped}, in "
        f"{time.monotonic() - started:.1f} s; cached as {shown(str(path))}",
        file=sys.stderr,
    )
    return index


def read_cached(path: Path, urls: Sequence[str]) -> ShardIndex:
    """A cached index, which must name exactly `urls` (redacted) in order; the shards get their urls back."""
    index = read_index(str(path))
    if [shard.url for shard in index.shards] != [redact(url) for url in urls]:
        raise UserError(f"the cached index {shown(str(path))} is not of the shards it is named for: remove it")
    return ShardIndex(
        [replace(shard, url=url) for shard, url in zip(index.shards, urls, strict=True)], None, index.extra
    )
