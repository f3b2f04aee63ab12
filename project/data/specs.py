"""Resolve a data spec (folder, shard index, glob, brace pattern, URL or list) into shards with counts.

Pure apart from reading index files (project/data/shard_index.py) and checking that local shards exist: no
torch, no processes.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

import braceexpand

from project.data.remote import is_remote, local_path
from project.data.samples import count_samples
from project.data.shard_index import INDEX_NAME, Shard, ShardIndex, merged_extra, read_index
from project.errors import ShardError, UserError
from project.redact import redact

SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz")


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
    return _resolve_paths(urls, pattern, count)


def _resolve_paths(urls: list[str], pattern: str, count: Callable[[str], int]) -> ShardIndex:
    if any(is_remote(url) for url in urls):
        raise UserError(
            f"remote shards need a shard index to know their sizes: pass the URL of its {INDEX_NAME} "
            f"instead of {redact(pattern)!r}"
        )
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


def _resolve_one(spec: str, count: Callable[[str], int]) -> ShardIndex:
    spec = os.path.expanduser(spec)
    if (urlsplit(spec).path if is_remote(spec) else spec).endswith(".json"):  # a presigned index has a query
        return read_index(spec)
    if is_remote(spec):
        return _resolve_pattern(spec, count)
    if os.path.isdir(spec):
        if os.path.exists(os.path.join(spec, INDEX_NAME)):
            return read_index(os.path.join(spec, INDEX_NAME))
        tars = sorted(p for p in glob.glob(os.path.join(spec, "*")) if p.endswith(SHARD_SUFFIXES))
        if not tars:
            raise UserError(f"no shards in {spec}: expected a {INDEX_NAME} or .tar files, found neither")
        return _resolve_paths(tars, spec, count)
    if not re.search(r"[*?\[{]", spec) and not os.path.exists(spec):
        raise UserError(f"data path not found: {spec}")
    return _resolve_pattern(spec, count)


def resolve_shards(spec: str | Sequence[str], count: Callable[[str], int] | None = None) -> ShardIndex:
    """Turn a data spec into a `ShardIndex`.

    Args:
        spec: a folder holding a shard index (or tar files), a shard index file, a glob
            (``data/train/*.tar``), a brace pattern (``shard-{000000..000099}.tar``), a URL of a shard
            index, or a list of any of these.
        count: counts the samples of a local shard that no shard index describes (a tar header scan).
    """
    count = count or count_samples
    specs = [spec] if isinstance(spec, str) else list(spec)
    if not specs:
        raise UserError("empty data spec: expected a folder, shard index, glob, brace pattern or URL")
    parts = [_resolve_one(str(s), count) for s in specs]
    shards = [shard for part in parts for shard in part.shards]
    if not shards:
        raise UserError(f"no shards in {spec}")
    return ShardIndex(shards, parts[0].name if len(parts) == 1 else None, merged_extra(parts))
