"""Open a shard or index url as a byte stream: local paths, http(s) with resume on dropped connections,
object stores through fsspec (s3://, gs://, ...), and explicit `pipe:` commands.

No shell for plain urls: webdataset's gopen hands http urls to `curl` through a shell, so a url holding
`;` or `$(...)` would run commands. A `pipe:` url runs a command here, so only the user's own data spec may
hold one: `shards.read_index` refuses an index that lists one (or whose relative entry would become one),
and `shards.write_index` refuses to write one.

A Basic password (`user:token@`) is sent to the url's own origin only: a redirect to another host, port or
scheme drops it. The cache names a copy by a hash of the whole url, so two urls never share a copy.

A download stops at its bound (bounded.py): a shard at the filesize its index declares (`ShardOpen`), any
http(s) body at its Content-Length, and what a caller asks; a refused or interrupted one leaves nothing cached.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import time
import urllib.error
import urllib.request
from http.client import HTTPException, HTTPResponse
from pathlib import Path
from typing import IO, Any
from urllib.parse import unquote, urlparse, urlsplit, urlunsplit

from project.data.atomic import write_atomically
from project.data.bounded import Bounded, Limit, TooLong, content_length, tighter
from project.data.paths import open_regular
from project.data.stores import FsspecStream, filesystem, scheme_of
from project.errors import ShardError

NETWORK_ERRORS = (OSError, HTTPException, urllib.error.URLError)


def is_remote(url: str) -> bool:
    """True for URLs that open over a network or a command (http, s3, pipe:, ...), False for local paths
    (a one-letter scheme is a Windows drive)."""
    scheme = scheme_of(url)
    return len(scheme) > 1 and scheme != "file"


def local_path(url: str) -> str:
    """The path of a local url (`file:` or plain)."""
    return urlparse(url).path if url.startswith("file:") else url


def without_userinfo(url: str) -> tuple[str, str | None]:
    """(the url without `user:password@`, the Basic Authorization header it stood for, or None): urllib
    would take the userinfo for part of the host name."""
    parts = urlsplit(url)
    if parts.username is None:
        return url, None
    credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
    netloc = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=netloc)), "Basic " + base64.b64encode(credentials).decode("ascii")


def origin(url: str) -> tuple[str, str | None, int | None]:
    """(scheme, host, port) of a url: where a credential may be sent."""
    parts = urlsplit(url)
    default = {"http": 80, "https": 443}.get(parts.scheme.lower())
    try:
        port = parts.port or default
    except ValueError:
        port = None
    return parts.scheme.lower(), (parts.hostname or "").lower(), port


class SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    """urllib's redirects, without the Authorization header once a redirect leaves the url's origin
    (urllib copies every header but the content ones to whatever host a server names)."""

    def redirect_request(self, request: urllib.request.Request, *response: Any) -> urllib.request.Request | None:
        """`response`: the redirect as urllib hands it over (fp, code, message, headers, new_url), passed on."""
        redirected = super().redirect_request(request, *response)
        if redirected is not None and origin(redirected.full_url) != origin(request.full_url):
            redirected.remove_header("Authorization")
        return redirected


OPENER = urllib.request.build_opener(SameOriginRedirects)


class HTTPStream(io.RawIOBase):
    """A readable http(s) body that reconnects after a dropped connection, with a Range request from
    the byte it had reached: no byte is read twice or lost, so no sample is duplicated or dropped."""

    def __init__(self, url: str, retries: int = 5, timeout: float = 60.0) -> None:
        self.url, self.retries, self.timeout = url, retries, timeout
        self.position = 0
        self.target, self.auth = without_userinfo(url)
        self.response = self._connect()
        # the whole body's length as the server declares it: read here, since http.client ignores it beside
        # chunked transfer encoding, where a lying server may send more
        self.declared = content_length(self.response.headers.get("Content-Length"))

    def _connect(self) -> HTTPResponse:
        headers = {"Range": f"bytes={self.position}-"} if self.position else {}
        if self.auth:
            headers["Authorization"] = self.auth
        request = urllib.request.Request(self.target, headers=headers)
        response = OPENER.open(request, timeout=self.timeout)  # http(s) only, checked by the caller
        if self.position and response.status != 206:  # no Range support: read up to where we were
            remaining = self.position
            while remaining:
                chunk = response.read(min(remaining, 1 << 20))
                if not chunk:
                    raise OSError(f"{self.url} is shorter than before ({self.position - remaining} bytes)")
                remaining -= len(chunk)
        return response

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:
        for attempt in range(self.retries + 1):
            try:
                count = self.response.readinto(buffer)
                expected = self.response.length  # bytes still promised by Content-Length, if any
                if count == 0 and expected:  # closed early: the connection dropped
                    raise HTTPException(f"connection closed with {expected} bytes to go")
                self.position += count
                return count
            except NETWORK_ERRORS:
                if attempt == self.retries:
                    raise
                self.response.close()
                time.sleep(min(0.2 * 2**attempt, 5.0))  # back off before reconnecting, not per sample
                self.response = self._connect()
        return 0

    def close(self) -> None:
        if not self.closed:
            self.response.close()
        super().close()


def _open_remote(url: str, limit: Limit | None = None) -> IO[bytes]:
    """A remote url's bytes; an http(s) or storage body stops a byte past `limit` (or its Content-Length)."""
    scheme = urlparse(url).scheme
    if url.startswith("pipe:"):
        from webdataset.gopen import gopen  # the user asked for a shell command explicitly: not bounded

        return gopen(url, "rb")
    if scheme in ("http", "https"):
        stream = HTTPStream(url)
        try:
            limit = tighter(limit, stream.declared)
        except TooLong:
            stream.close()
            raise
        return io.BufferedReader(stream if limit is None else Bounded(stream, limit), buffer_size=1 << 20)
    fs, path = filesystem(url)
    stream = FsspecStream(FsspecStream.call(fs.open, path, "rb"))
    if limit is None:
        return stream
    size = getattr(stream.file, "size", None)
    if not isinstance(size, int):
        return io.BufferedReader(Bounded(stream, limit), buffer_size=1 << 20)
    if size > limit.bytes:  # a stored object's size is known, and reads stop there: checked once
        stream.close()
        raise TooLong(f"it holds {size:,} bytes, more than {limit.bytes:,}, {limit.why}")
    return stream  # seekable, as before: the tar reader seeks over members it skips


def open_url(
    url: str, cache_dir: str | None = None, cache_bytes: int | None = None, limit: Limit | None = None
) -> IO[bytes]:
    """Open a shard or index for reading; remote ones optionally through a size-bounded local cache, their
    bodies stopped a byte past `limit`. A local file is read as it is."""
    if not is_remote(url):  # a FIFO put at a shard's path after it was listed is refused, never waited on
        return open_regular(local_path(url), follow_links=True)
    try:
        if cache_dir is None:
            return _open_remote(url, limit)
        return open(cached(url, Path(cache_dir), cache_bytes, limit), "rb")  # noqa: SIM115
    except NETWORK_ERRORS as error:
        raise ShardError(f"cannot open {url}: {error}") from None


CACHED_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".json", ".ckpt", ".pt", ".pth")


def cache_name(url: str) -> str:
    """The file name of a url's copy: a hash of the whole url but its userinfo (scheme, host, port, path,
    query), so no two urls share a copy and no secret is in the name; the suffix stays, for people."""
    target, _ = without_userinfo(url)
    path = urlsplit(target).path
    suffix = next((suffix for suffix in CACHED_SUFFIXES if path.endswith(suffix)), "")
    return hashlib.sha256(target.encode("utf-8", "surrogateescape")).hexdigest()[:40] + suffix


def cached(url: str, cache_dir: Path, max_bytes: int | None, limit: Limit | None = None) -> Path:
    """The local copy of `url` in `cache_dir`, downloaded once, stopped a byte past `limit` (then nothing is
    kept); the least recently used copies are removed to keep the folder under `max_bytes`."""
    target = cache_dir / cache_name(url)
    if target.exists() and (limit is None or target.stat().st_size <= limit.bytes):
        os.utime(target)  # mark as recently used
        return target
    target.unlink(missing_ok=True)  # a copy past the bound (a looser one wrote it): downloaded again, or refused

    def download(sink: IO[bytes]) -> None:
        with _open_remote(url, limit) as source:
            while chunk := source.read(1 << 20):
                sink.write(chunk)

    # whole or absent; a killed download's temporary is removed by the next download into the folder
    write_atomically(target, download)
    if max_bytes is not None:
        _evict(cache_dir, max_bytes, keep=target)
    return target


def _evict(cache_dir: Path, max_bytes: int, keep: Path) -> None:
    copies = (path for path in cache_dir.iterdir() if path.is_file() and not path.name.startswith("."))
    files = sorted(copies, key=lambda path: path.stat().st_mtime)
    total = sum(p.stat().st_size for p in files)
    for path in files:
        if total <= max_bytes:
            break
        if path != keep:
            total -= path.stat().st_size
            path.unlink(missing_ok=True)  # a reader that has it open keeps reading (POSIX)
