"""The shard index: `shardindex.json` in the wids format that webdataset's own tools write, plus keys of the
tools that wrote it beside the shard list (the image task's class names, a demo's settings), kept as
`ShardIndex.extra`:

    {"__kind__": "wids-shard-index-v1", "wids_version": 1, "name": "train",
     "shardlist": [{"url": "train-000000.tar", "nsamples": 1000, "filesize": 123456}, ...],
     ...}

An index is a stranger's input (docs/DESIGN.md, "Threat model"): `read_index` reads at most MAX_INDEX_BYTES,
refuses an entry that names a command, a scheme that is no storage or (from a remote index) a local file, and
checks each count against its file. `write_index` writes atomically and refuses to write a command.
`ShardOpen` stops a remote shard's download a byte past the filesize its index declares.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urljoin, urlsplit

from project.data.atomic import write_atomically
from project.data.bounded import Limit, TooLong
from project.data.remote import is_remote, local_path, open_url
from project.data.stores import scheme_of
from project.errors import ShardError, UserError
from project.redact import redact, redact_text

INDEX_NAME = "shardindex.json"
INDEX_KIND = "wids-shard-index-v1"
WIDS_KEYS = ("__kind__", "wids_version", "name", "shardlist")
SHUFFLED_KEY = "shuffled_before_sharding"  # written true by prepare and the demos (see shuffled_before_sharding)
MAX_INDEX_BYTES = 64 << 20  # about 700,000 shards; a larger index is refused unread
MAX_URL_CHARS = 8192
MAX_SHARD_SAMPLES = 1 << 32
MAX_SHARD_BYTES = 1 << 44  # 16 TiB
# the schemes an index may name besides local paths: storage, never a command (pipe:) or a local-file scheme
INDEX_SCHEMES = frozenset({"http", "https", "s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "hf"})


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


class ShardOpen:
    """Opens a stream's shards (`open_url`, through the cache if one is given), a remote one stopped a byte past
    the filesize its index declares: a server that sends more (a body that never ends, a stale index) stops
    there in one line naming the shard, where the tar reader would read on through members it skips. Picklable,
    for the loader's workers; a shard without a declared size is read as it comes."""

    WHY = "the filesize its shard index declares: the index is stale, or the server sends more than the shard"

    def __init__(self, shards: Sequence[Shard], cache_dir: str | None = None, cache_bytes: int | None = None) -> None:
        self.sizes = {shard.url: shard.filesize for shard in shards if shard.filesize is not None}
        self.cache_dir, self.cache_bytes = cache_dir, cache_bytes

    def __call__(self, url: str):  # noqa: ANN204 - a binary stream, as open_url's
        size = self.sizes.get(url)
        limit = None if size is None or not is_remote(url) else Limit(size, self.WHY)
        return open_url(url, self.cache_dir, self.cache_bytes, limit)


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


def _read_text(url: str) -> bytes:
    """The index's bytes, at most MAX_INDEX_BYTES of them: a larger file is refused, not read whole; a server
    that declares more is refused before a byte comes, one that sends more (no Content-Length, a body that never
    ends) a byte past the bound."""
    advice = "split the dataset into several indexes (a data spec takes a list)"
    too_large = UserError(f"shard index {redact(url)} is larger than {MAX_INDEX_BYTES:,} bytes: {advice}")
    try:
        with open_url(url, limit=Limit(MAX_INDEX_BYTES, f"the most a shard index may hold: {advice}")) as stream:
            data = stream.read(MAX_INDEX_BYTES + 1)  # a local file: the bound is this read's
    except TooLong:
        raise too_large from None
    if len(data) > MAX_INDEX_BYTES:
        raise too_large
    return data


def read_index(url: str, check_exists: bool = True) -> ShardIndex:
    """Read a shard index file (local path or URL); relative shard urls resolve against its folder.

    The index is a stranger's input: it may not name a command (`pipe:`), a scheme outside `INDEX_SCHEMES`
    or, from a remote index, a local file; its counts must be integers that its files can hold. Anything
    else is one line naming the entry.
    """
    try:
        data = _read_text(url)
    except FileNotFoundError:
        raise UserError(f"shard index not found: {redact(url)}") from None
    except OSError as error:
        raise UserError(f"cannot read shard index {redact(url)}: {redact_text(str(error))}") from None
    try:
        parsed = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as error:  # RecursionError: JSON nested thousands deep
        raise UserError(f"{redact(url)} is not a shard index: not JSON ({type(error).__name__}: {error})") from None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("shardlist"), list):
        raise UserError(f"{redact(url)} is not a shard index ({INDEX_KIND}, an object with a 'shardlist' list)")
    shards = [_entry(entry, number, url) for number, entry in enumerate(parsed["shardlist"])]
    if check_exists:
        for shard in shards:
            _check_files(shard, url)
    extra = {key: value for key, value in parsed.items() if key not in WIDS_KEYS}
    name = parsed.get("name")
    plain = isinstance(name, str) and len(name) <= 200 and _plain_text(name)
    return ShardIndex(shards, name if plain else None, extra)


def _entry(entry: object, number: int, index_url: str) -> Shard:
    """One entry of an index's shard list, checked (see `read_index`)."""
    where = f"shard index {redact(index_url)}, entry {number}"
    if not isinstance(entry, dict):
        raise UserError(f"{where}: expected an object with url and nsamples, got {_shown(entry)}")
    url, nsamples, filesize = entry.get("url"), entry.get("nsamples"), entry.get("filesize")
    if not isinstance(url, str) or not url or len(url) > MAX_URL_CHARS or not _plain_text(url) or url != url.strip():
        raise UserError(
            f"{where}: 'url' must be 1 to {MAX_URL_CHARS} printable characters, not starting or ending with a "
            f"space, got {_shown(url)}"
        )
    if not _is_count(nsamples, MAX_SHARD_SAMPLES):
        raise UserError(f"{where}: 'nsamples' must be an integer in 0..{MAX_SHARD_SAMPLES:,}, got {_shown(nsamples)}")
    if filesize is not None and not _is_count(filesize, MAX_SHARD_BYTES):
        raise UserError(f"{where}: 'filesize' must be an integer in 0..{MAX_SHARD_BYTES:,}, got {_shown(filesize)}")
    try:
        resolved = _resolve_url(url, index_url)
        if is_remote(resolved):
            urlsplit(resolved).port  # noqa: B018 - raises for an unclosed IPv6 host or a port that is no number
    except ValueError as error:
        raise UserError(f"{where}: 'url' {_shown(url)} is no URL or path: {error}") from None
    problem = url_problem(resolved, from_remote_index=is_remote(index_url))
    if problem:
        raise UserError(f"{where} ({_shown(redact(url))}) {problem}")
    if filesize is not None and nsamples > filesize:
        raise UserError(f"{where}: {nsamples:,} samples cannot fit in its {filesize:,} bytes")
    return Shard(resolved, nsamples, filesize)


def url_problem(url: str, from_remote_index: bool = False) -> str | None:
    """Why an index may not name `url` (already resolved against the index), or None: a command, a scheme
    that is no storage, fsspec's chained urls, or a local file named by a remote index."""
    if url.startswith("pipe:"):
        return "is a shell command (pipe:): an index may not run commands; only a data spec you write may"
    if "::" in url:
        return "chains fsspec filesystems (::), which an index may not do"
    if is_remote(url):
        scheme = scheme_of(url)
        if scheme not in INDEX_SCHEMES:
            return f"has the scheme {scheme}:, which is not one an index may name ({', '.join(sorted(INDEX_SCHEMES))})"
        if not url[len(scheme) :].startswith("://"):  # fsspec reads `gs:/x` as a local path
            return f"is no url: a {scheme} url starts {scheme}://"
    elif from_remote_index:
        return "is a local file, which a remote index may not name"
    return None


def _plain_text(text: str) -> bool:
    """Printable (no line break, no control character) and UTF-8 (no lone surrogate, which JSON's \\ud800
    makes): what a path or url of an index may be."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return text.isprintable()


def _is_count(value: object, most: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= most


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_files(shard: Shard, index_url: str) -> None:
    """A local shard must exist, and hold at least a byte per sample (a gzip-compressed tar header takes
    more; a plain one 512): an index whose counts its files cannot hold is stale or a stranger's lie."""
    if is_remote(shard.url):
        return
    try:
        size = os.stat(local_path(shard.url)).st_size
    except OSError:
        raise ShardError(f"shard index {redact(index_url)} names a missing shard: {shard.url}") from None
    if shard.nsamples > size:
        raise ShardError(
            f"shard index {redact(index_url)} says {shard.url} holds {shard.nsamples:,} samples, more "
            f"than its {size:,} bytes can: the index is stale, rebuild it"
        )


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

    commands = [shard.url for shard in shards if shard.url.startswith("pipe:")]
    if commands:
        raise UserError(
            f"refusing to write a shell command into {path}: {redact(commands[0])} (an index may not "
            "run commands; list the shards' own paths or URLs)"
        )
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
    """The other keys of several indexes as one: for a key in more than one, the first index's value;
    `SHUFFLED_KEY` only when every index says so."""
    extra: dict = {}
    for index in reversed(indexes):
        extra.update(index.extra)
    if not all(shuffled_before_sharding(index) for index in indexes):
        extra.pop(SHUFFLED_KEY, None)
    return extra


def shuffled_before_sharding(index: ShardIndex) -> bool:
    """Whether the tool that wrote the index says it shuffled the samples before cutting them into shards
    (`prepare` and the demos do): a shard is then a random sample of the set, and needs no interleaving."""
    return index.extra.get(SHUFFLED_KEY) is True
