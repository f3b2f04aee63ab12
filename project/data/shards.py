"""Resolve a data spec (folder, shard index, glob, brace pattern, URL or list) into shards with counts.

Pure apart from reading the index file and checking that local shards exist: no torch, no processes.
The shard index is the wids format that webdataset's own tools write, plus keys of the tools that wrote
it beside the shard list (the image task's class names, a demo's settings), kept as `ShardIndex.extra`:

    {"__kind__": "wids-shard-index-v1", "wids_version": 1, "name": "train",
     "shardlist": [{"url": "train-000000.tar", "nsamples": 1000, "filesize": 123456}, ...],
     ...}
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import braceexpand

from project.data.atomic import write_atomically
from project.data.redact import redact, redact_text
from project.data.remote import is_remote, local_path, open_url
from project.data.samples import count_samples
from project.errors import ShardError, UserError

INDEX_NAME = "shardindex.json"
INDEX_KIND = "wids-shard-index-v1"
WIDS_KEYS = ("__kind__", "wids_version", "name", "shardlist")
SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz")


@dataclass(frozen=True)
class Shard:
    """One tar shard: where it is and how many samples (distinct keys) it holds."""

    url: str
    nsamples: int
    filesize: int | None = None


@dataclass
class ShardIndex:
    """An ordered list of shards, and what else the index records."""

    shards: list[Shard]
    name: str | None = None
    extra: dict = field(default_factory=dict)  # the index's keys beyond the wids ones, for the tasks and tools

    @property
    def nsamples(self) -> int:
        return sum(shard.nsamples for shard in self.shards)


def _resolve_url(url: str, base: str) -> str:
    """Resolve a shard url from an index against the index's own folder (or URL).

    A relative url in a remote index also takes the index URL's query string when it has none of its own:
    the token of a store that signs a whole prefix (an Azure container SAS, a CDN token) reaches every
    shard. A store that signs each object (S3 or GCS presigned URLs) needs each shard's own signed URL in
    the index: absolute urls, and urls with their own query, are used as they are.
    """
    if is_remote(url) or os.path.isabs(local_path(url)):
        return url
    if is_remote(base):
        joined, query = _join(base, url), urlsplit(base).query
        return f"{joined}?{query}" if query and not urlsplit(joined).query else joined
    return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(local_path(base))), url))


def _join(base: str, url: str) -> str:
    """`urljoin` for any scheme: it leaves `url` unjoined for schemes it does not know (s3://, gs://), so
    those are joined as http and get their scheme back."""
    scheme, _, rest = base.partition("://")
    if not rest or "://" in url or scheme in ("http", "https", "file"):
        return urljoin(base, url)
    return f"{scheme}://{urljoin('http://' + rest, url)[len('http://') :]}"


def _read_text(url: str) -> str:
    with open_url(url) as stream:
        return stream.read().decode("utf-8")


def read_index(url: str, check_exists: bool = True) -> ShardIndex:
    """Read a shard index file (local path or URL); relative shard urls resolve against its folder."""
    try:
        text = _read_text(url)
    except FileNotFoundError:
        raise UserError(f"shard index not found: {redact(url)}") from None
    except OSError as error:
        raise UserError(f"cannot read shard index {redact(url)}: {redact_text(str(error))}") from None
    try:
        data = json.loads(text)
        entries = data["shardlist"]
        shards = [Shard(_resolve_url(str(e["url"]), url), int(e["nsamples"]), e.get("filesize")) for e in entries]
    except (ValueError, KeyError, TypeError) as error:
        raise UserError(f"{redact(url)} is not a shard index ({INDEX_KIND} with a 'shardlist'): {error!r}") from None
    if check_exists:
        for shard in shards:
            if not is_remote(shard.url) and not os.path.exists(local_path(shard.url)):
                raise ShardError(f"shard index {url} names a missing shard: {shard.url}")
    extra = {key: value for key, value in data.items() if key not in WIDS_KEYS}
    return ShardIndex(shards, data.get("name"), extra)


def write_index(
    path: str | Path,
    shards: Sequence[Shard],
    name: str | None = None,
    extra: dict | None = None,
) -> Path:
    """Write a shard index atomically; shard urls inside the index's folder are stored relative to it."""
    path = Path(path)
    folder = path.parent.resolve()

    def relative(url: str) -> str:
        if is_remote(url):
            return url
        absolute = Path(local_path(url)).resolve()
        return os.path.relpath(absolute, folder) if absolute.is_relative_to(folder) else str(absolute)

    data = {
        "__kind__": INDEX_KIND,
        "wids_version": 1,
        "name": name or folder.name,
        "shardlist": [{"url": relative(s.url), "nsamples": s.nsamples, "filesize": s.filesize} for s in shards],
    }
    data.update({key: value for key, value in (extra or {}).items() if key not in WIDS_KEYS})
    text = json.dumps(data, indent=1) + "\n"
    write_atomically(path, lambda stream: stream.write(text.encode("utf-8")))  # never half-written
    return path


def merged_extra(indexes: Sequence[ShardIndex]) -> dict:
    """The other keys of several indexes as one: for a key in more than one, the first index's value."""
    extra: dict = {}
    for index in reversed(indexes):
        extra.update(index.extra)
    return extra


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
