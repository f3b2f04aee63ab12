"""Remote shards named without an index: a brace pattern, a glob or a folder (a prefix) of a store, listed through
fsspec, one level deep, for its `.tar`, `.tar.gz` and `.tgz` objects; and whether a file is there (a folder's
`shardindex.json` or `_info.json`).

http(s) has no listing: a folder given as an http url is one line asking for a brace pattern, a list or the url
of an index. A listing is a stranger's answer: at most `MAX_LISTED` entries, each a plain name one level under
the folder listed (never `..`, another scheme or a local file: `shard_index.url_problem`), else one line.
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import braceexpand

from project.data.remote import OPENER, without_userinfo
from project.data.shard_index import INDEX_NAME, url_problem
from project.data.stores import FsspecStream, filesystem, scheme_of
from project.errors import UserError
from project.redact import redact, redact_text
from project.shown import shown

SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz")
MAX_LISTED = 1_000_000  # entries of one folder's listing
GLOB = re.compile(r"[*?\[]")


def is_http(url: str) -> bool:
    return scheme_of(url) in ("http", "https")


def is_folder(url: str) -> bool:
    """Whether a remote url names a folder (a prefix) rather than a shard, an index, a pattern or a glob."""
    path = urlsplit(url).path if is_http(url) else url
    return not path.endswith((*SHARD_SUFFIXES, ".json")) and not GLOB.search(path) and "{" not in path


def join(folder: str, name: str) -> str:
    """A name inside a remote folder (its query string, a signature, kept at the end)."""
    parts = urlsplit(folder) if is_http(folder) else None
    if parts is not None and parts.query:
        return parts._replace(path=parts.path.rstrip("/") + "/" + name).geturl()
    return folder.rstrip("/") + "/" + name


def exists(url: str) -> bool:
    """Whether a remote file is there: an http(s) HEAD request (404 or 410: not there), or the store's own check."""
    if is_http(url):
        target, auth = without_userinfo(url)
        request = urllib.request.Request(target, method="HEAD", headers={"Authorization": auth} if auth else {})
        try:
            OPENER.open(request, timeout=60).close()  # http(s) only: checked above
        except urllib.error.HTTPError as error:
            if error.code in (404, 410):
                return False
            raise UserError(f"cannot reach {redact(url)}: HTTP Error {error.code}") from None
        except OSError as error:
            raise UserError(f"cannot reach {redact(url)}: {redact_text(str(error))}") from None
        return True
    fs, path = filesystem(url)
    try:
        return bool(FsspecStream.call(fs.isfile, path))
    except OSError as error:
        raise UserError(f"cannot reach {redact(url)}: {redact_text(str(error))}") from None


def remote_shards(spec: str) -> tuple[list[str], dict[str, int]]:
    """The shard urls a remote spec names (a brace pattern, a glob, a folder, a shard), in order, and the sizes
    its listing gave (where it listed)."""
    urls: list[str] = []
    sizes: dict[str, int] = {}
    for part in braceexpand.braceexpand(spec):
        if GLOB.search(urlsplit(part).path if is_http(part) else part) or is_folder(part):
            listed = list_folder(part)
            urls += listed
            sizes |= {url: size for url, size in listed.items() if size is not None}
        else:
            urls.append(part)
    return list(dict.fromkeys(urls)), sizes


def list_folder(url: str) -> dict[str, int | None]:
    """The shards of a store's folder (one level) or glob, sorted by name, with their sizes."""
    if is_http(url):
        raise UserError(
            f"cannot list {redact(url)}: http(s) has no listing; give a brace pattern (shard-{{000000..000099}}.tar), "
            f"a list of shard urls, or the url of their {INDEX_NAME}"
        )
    fs, path = filesystem(url)
    folder = path.rstrip("/")
    globbed = bool(GLOB.search(path))
    try:
        if globbed:
            entries = FsspecStream.call(lambda: fs.glob(path, detail=True))
            entries = list(entries.values()) if isinstance(entries, dict) else entries
        else:
            entries = FsspecStream.call(lambda: fs.ls(folder, detail=True))
    except FileNotFoundError:
        raise UserError(f"no shards in {redact(url)}: the folder is not there") from None
    except OSError as error:
        raise UserError(f"cannot list {redact(url)}: {redact_text(str(error))}") from None
    if len(entries) > MAX_LISTED:
        raise UserError(f"{redact(url)} lists {len(entries):,} entries, more than {MAX_LISTED:,}: give a pattern")
    found: dict[str, int | None] = {}
    for entry in entries:
        shard = _listed(fs, entry, None if globbed else folder, url)
        if shard is not None:
            found[shard[0]] = shard[1]
    if not found:
        raise UserError(f"no shards in {redact(url)}: expected {', '.join(SHARD_SUFFIXES)} objects or an index")
    return dict(sorted(found.items()))


def _listed(fs, entry: object, folder: str | None, url: str) -> tuple[str, int | None] | None:
    """(url, size) of a listed entry that is a shard file, None for one that is not a shard; a name that is no
    plain name one level under `folder` (any level for a glob), or not in the store listed, is one line."""
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise UserError(f"the listing of {redact(url)} holds an entry that is no file: {shown(repr(entry)[:80])}")
    name, size = entry["name"], entry.get("size")
    if entry.get("type") != "file" or not name.endswith(SHARD_SUFFIXES):
        return None
    shard = fs.unstrip_protocol(name)
    below = name[len(folder) + 1 :] if folder is not None and name.startswith(folder + "/") else None
    plain = name.isprintable() and ".." not in name.split("/") and "://" not in name
    problem = url_problem(shard, from_remote_index=True) or (
        None if plain and (folder is None or (below and "/" not in below)) else "is not a file of the folder listed"
    )
    if problem or scheme_of(shard) != scheme_of(url):
        raise UserError(f"the listing of {redact(url)} names {shown(redact(shard))}, which {problem or 'is elsewhere'}")
    return shard, size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None
