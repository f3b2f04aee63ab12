"""Resolve a data spec (folder, shard index, glob, brace pattern, URL or list) into shards with counts.

Counts come from a shard index (shard_index.py), a folder's `_info.json` (the Hub's layout: hub_layout.py), a tar
header scan of local shards, or, for remote shards that come with neither, an index made once and cached
(index_cache.py). No torch, no processes.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

import braceexpand

from project.data.hub_layout import has_info, read_info
from project.data.index_cache import cached_index
from project.data.listing import SHARD_SUFFIXES, exists, is_folder, join, remote_shards
from project.data.remote import is_remote, local_path
from project.data.samples import count_samples
from project.data.scanning import COUNTING
from project.data.shard_index import INDEX_NAME, Shard, ShardIndex, merged_extra, read_index
from project.errors import ShardError, UserError
from project.redact import redact

__all__ = ["SHARD_SUFFIXES", "resolve_shards"]
# the index of remote shards that come without one, from their urls and the sizes their listing gave
IndexRemote = Callable[[list[str], dict[str, int]], ShardIndex]


def _expand(pattern: str) -> list[str]:
    """Brace-expand, then glob each part (sorted), keeping literal paths as they are."""
    urls: list[str] = []
    for part in braceexpand.braceexpand(pattern):
        if not is_remote(part) and re.search(r"[*?\[]", part):
            urls.extend(sorted(glob.glob(part)))
        else:
            urls.append(part)
    return urls


def _sibling_indexes(paths: list[str]) -> tuple[dict[str, Shard], dict]:
    """Counts (and the other keys) for local shards from a shardindex.json in their folders, if any."""
    known: dict[str, Shard] = {}
    indexes: list[ShardIndex] = []
    for folder in sorted({os.path.dirname(os.path.abspath(p)) for p in paths}):
        index_path = os.path.join(folder, INDEX_NAME)
        if os.path.exists(index_path):
            index = read_index(index_path, check_exists=False)
            known.update((os.path.abspath(shard.url), shard) for shard in index.shards)
            indexes.append(index)
    return known, merged_extra(indexes)


def _resolve_pattern(pattern: str, count: Callable[[str], int]) -> ShardIndex:
    urls = _expand(pattern)
    if not urls:
        raise UserError(f"no shards match {pattern!r}")
    return _resolve_paths(urls, count)


def _remote_folder(spec: str, index_remote: IndexRemote, split: str | None) -> ShardIndex:
    """A store's or server's folder: its shardindex.json, its `_info.json` (with a split), else the shards it
    holds (listed), indexed by `index_remote`."""
    if exists(join(spec, INDEX_NAME)):
        return read_index(join(spec, INDEX_NAME))
    if split is not None and has_info(spec):
        return read_info(spec, split)
    return _remote_group([spec], index_remote)


def _remote_group(specs: list[str], index_remote: IndexRemote) -> ShardIndex:
    """Remote shards named without an index (urls, brace patterns, globs, folders), indexed together."""
    urls: list[str] = []
    sizes: dict[str, int] = {}
    for spec in specs:
        named, listed = remote_shards(spec)
        urls += named
        sizes |= listed
    return index_remote(list(dict.fromkeys(urls)), sizes)


def _is_remote_shards(spec: str) -> bool:
    """A remote spec that names shards, not an index or a folder (those are resolved on their own)."""
    path = urlsplit(spec).path if is_remote(spec) else spec
    return is_remote(spec) and not spec.startswith("pipe:") and not path.endswith(".json") and not is_folder(spec)


def _resolve_paths(urls: list[str], count: Callable[[str], int]) -> ShardIndex:
    missing = [url for url in urls if not os.path.isfile(local_path(url))]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ShardError(f"shard not found: {missing[0]}{more}")
    known, extra = _sibling_indexes(urls)
    shards = []
    for url in urls:
        absolute = os.path.abspath(local_path(url))
        shard = known.get(absolute)
        shards.append(shard if shard else Shard(absolute, count(absolute), os.path.getsize(absolute)))
    return ShardIndex(shards, extra=extra)


def _resolve_one(spec: str, count: Callable[[str], int], index_remote: IndexRemote, split: str | None) -> ShardIndex:
    spec = os.path.expanduser(spec)
    if (urlsplit(spec).path if is_remote(spec) else spec).endswith(".json"):  # a presigned index has a query
        return read_index(spec)
    if spec.startswith("pipe:"):
        raise UserError(f"a pipe: data spec must print a shard index (its command ending in .json): {redact(spec)}")
    if is_remote(spec):
        return _remote_folder(spec, index_remote, split)
    if os.path.isdir(spec):
        if os.path.exists(os.path.join(spec, INDEX_NAME)):
            return read_index(os.path.join(spec, INDEX_NAME))
        if split is not None and has_info(spec):
            return read_info(spec, split)
        tars = sorted(p for p in glob.glob(os.path.join(spec, "*")) if p.endswith(SHARD_SUFFIXES))
        if not tars:
            raise UserError(f"no shards in {spec}: expected a {INDEX_NAME} or .tar files, found neither")
        return _resolve_paths(tars, count)
    if not re.search(r"[*?\[{]", spec) and not os.path.exists(spec):
        raise UserError(f"data path not found: {spec}")
    return _resolve_pattern(spec, count)


def resolve_shards(
    spec: str | Sequence[str],
    count: Callable[[str], int] | None = None,
    *,
    index_remote: IndexRemote | None = None,
    split: str | None = None,
) -> ShardIndex:
    """Turn a data spec into a `ShardIndex`.

    Args:
        spec: a folder holding a shard index (or tar files, or an `_info.json`), a shard index file, a glob
            (``data/train/*.tar``), a brace pattern (``shard-{000000..000099}.tar``), a URL of a shard
            index, of a store's folder (``s3://bucket/train/``) or of shards, or a list of any of these.
        count: counts the samples of a local shard that no shard index describes (a tar header scan); given
            without `index_remote`, it counts remote shards without an index too (a caller that needs only urls).
        index_remote: the index of remote shards that come without one, from their urls and listed sizes
            (default: scanned for their counts once, and cached: index_cache.py).
        split: the split being read (train, val, test), which a folder in the Hub's layout names in its
            `_info.json`.
    """
    if index_remote is None:
        index_remote = _counted(count) if count is not None else (lambda urls, sizes: cached_index(urls, COUNTING))
    count = count or count_samples
    specs = [spec] if isinstance(spec, str) else list(spec)
    if not specs:
        raise UserError("empty data spec: expected a folder, shard index, glob, brace pattern or URL")
    parts: list[ShardIndex] = []
    group: list[str] = []  # remote shards in a row: one index (a list of shard urls is one set, scanned at once)
    for item in [*map(str, specs), None]:
        if item is not None and _is_remote_shards(item):
            group.append(item)
            continue
        if group:
            parts.append(_remote_group(group, index_remote))
            group = []
        if item is not None:
            parts.append(_resolve_one(item, count, index_remote, split))
    shards = [shard for part in parts for shard in part.shards]
    if not shards:
        raise UserError(f"no shards in {spec}")
    return ShardIndex(shards, parts[0].name if len(parts) == 1 else None, merged_extra(parts))


def _counted(count: Callable[[str], int]) -> IndexRemote:
    return lambda urls, sizes: ShardIndex([Shard(url, count(url), sizes.get(url)) for url in urls])
