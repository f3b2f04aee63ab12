"""The journal of an index run: each shard scanned so far, a JSON line each, so that a run stopped (killed, a store
down) goes on where it stopped, reading none of them again. Its first line names the set of shards and the scan it
is for (a hash of both): another run's journal is not used, and is replaced. It is removed once the index is written.

The journal is a stranger's file like any other the project reads (a folder handed over, a planted file): at most
`MAX_LINE_BYTES` a line and a line per shard, each line an object of a url of the set (once), counts that are
integers, label counts and problems of bounded number and length; anything else is one line naming the journal and
its line. A last line without its line break is a write that a kill cut short, and is left out.

A journal and a cached index (index_cache.py) are keyed by an HMAC of the scan and its urls under the user's own
key (`key` in the user's cache folder, made once, mode 600): a stranger who plants a journal beside an index, or a
cached index in a shared `data.cache_dir`, cannot make one that a run takes for its own, so no count of theirs is
ever trusted. No secret of a url is written: a journal names a shard by its place in the run's list and its
redacted url, and its problems are redacted. Two runs of the same scan wait for each other (a lock in the user's
cache folder): the second reads what the first wrote.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from project.data.atomic import write_atomically
from project.data.paths import check_output, make_folder, open_regular
from project.data.scanning import MAX_PROBLEMS, Scanned
from project.data.shard_index import MAX_SHARD_BYTES, MAX_SHARD_SAMPLES, Shard
from project.errors import UserError
from project.redact import redact, redact_text
from project.shown import shown

KIND = "lightning-shards-index-journal-v1"
MAX_LINE_BYTES = 16 << 20
MAX_LABELS = 100_000  # distinct label texts of a shard: as many as an index may name classes
MAX_TEXT = 64 << 10  # characters of a label text or a problem


KEY_NAME = "key"
_KEYS: dict[str, bytes] = {}  # the user's key, read once per cache folder


def user_cache() -> Path:
    """The user's own cache folder: `$XDG_CACHE_HOME/lightning-shards`, else `~/.cache/lightning-shards`."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lightning-shards"


def url_set_key(urls: Sequence[str], scan: str) -> str:
    """An HMAC, under the user's key, of a scan's name and its shard urls in order: what a journal and a cached
    index are for, which nobody without the key can name or forge."""
    text = "\n".join([scan, *urls])
    return hmac.new(user_key(), text.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()


def user_key() -> bytes:
    """The user's key (64 hex digits in the user's cache folder), made at first use: whole or absent."""
    path = user_cache() / KEY_NAME
    if str(path) not in _KEYS:
        if not os.path.lexists(path):
            _make_key(path)
        _KEYS[str(path)] = _read_key(path)
    return _KEYS[str(path)]


def _make_key(path: Path) -> None:
    make_folder(path.parent)
    temporary = path.with_name(f".{KEY_NAME}.{os.getpid()}.{secrets.token_hex(4)}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        os.write(descriptor, secrets.token_hex(32).encode("ascii"))
        os.fsync(descriptor)
        os.close(descriptor)
        os.link(temporary, path)  # never over another run's key: the first made is the key
    except FileExistsError:
        pass
    finally:
        temporary.unlink(missing_ok=True)


def _read_key(path: Path) -> bytes:
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        try:
            data = os.read(descriptor, 65)
        finally:
            os.close(descriptor)
    except OSError as error:
        raise UserError(f"cannot read the key {shown(str(path))}: {error.strerror or error}") from None
    if len(data) != 64 or any(byte not in b"0123456789abcdef" for byte in data):
        raise UserError(f"{shown(str(path))} is no key of lightning-shards (64 hex digits): remove it")
    return data


class Journal:
    """The journal at `path` of a scan named `scan` over `urls`."""

    def __init__(self, path: str | os.PathLike, urls: Sequence[str], scan: str) -> None:
        self.path, self.urls, self.key = Path(path), list(dict.fromkeys(urls)), url_set_key(urls, scan)
        self.places = {url: place for place, url in enumerate(self.urls)}
        self.started = False  # whether the file holds this run's first line

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Held while a run scans and writes: another run of the same journal waits (and says so) meanwhile."""
        name = hashlib.sha256(str(self.path.absolute()).encode("utf-8", "surrogateescape")).hexdigest()[:40]
        lock = FileLock(make_folder(user_cache() / "locks") / f"{name}.lock")
        try:
            lock.acquire(timeout=0)
        except Timeout:
            print(f"waiting for another run indexing the same shards ({lock.lock_file})", file=sys.stderr)
            lock.acquire()
        try:
            yield
        finally:
            lock.release()

    def finished(self) -> dict[str, Scanned]:
        """The shards an earlier run of the same scan over the same shards finished (none without a journal)."""
        try:
            stream = open_regular(self.path)
        except (FileNotFoundError, NotADirectoryError):  # none there (a file in a folder's place: the writer says)
            return {}
        except OSError as error:
            raise UserError(f"cannot read the journal {shown(str(self.path))}: {error.strerror or error}") from None
        with stream:
            header = self._line(stream, 1)
            if header is None or not isinstance(header, dict) or header.get("kind") != KIND:
                raise self._bad(1, f"not a journal of shards.index ({KIND})")
            if header.get("key") != self.key:
                return {}  # another set of shards, or another scan: started over
            self.started = True
            done: dict[str, Scanned] = {}
            for number in range(2, len(self.urls) + 3):
                entry = self._line(stream, number)
                if entry is None:
                    return done
                if number == len(self.urls) + 2:
                    raise self._bad(number, "more lines than shards")
                scanned = self._entry(entry, number)
                if scanned.shard.url in done:
                    raise self._bad(number, "a shard it already holds")
                done[scanned.shard.url] = scanned
        return done

    def _line(self, stream, number: int) -> object:
        data = stream.readline(MAX_LINE_BYTES + 1)
        if not data.endswith(b"\n"):  # the end, or a last line that a kill cut short
            if len(data) > MAX_LINE_BYTES:
                raise self._bad(number, f"longer than {MAX_LINE_BYTES:,} bytes")
            return None
        try:
            return json.loads(data.decode("utf-8"))
        except (ValueError, RecursionError) as error:
            raise self._bad(number, f"not JSON ({type(error).__name__})") from None

    def _bad(self, number: int, why: str) -> UserError:
        return UserError(f"journal {shown(str(self.path))}, line {number}: {why}; remove it to index from the start")

    def _entry(self, entry: object, number: int) -> Scanned:
        place = entry.get("shard") if isinstance(entry, dict) else None
        if not _count(place, len(self.urls) - 1) or entry.get("url") != redact(self.urls[place]):
            raise self._bad(number, "not an object naming a shard of this run (its place and redacted url)")
        nsamples, filesize = entry.get("nsamples"), entry.get("filesize")
        labels, problems = entry.get("labels"), entry.get("problems")
        if not _count(nsamples, MAX_SHARD_SAMPLES) or not (filesize is None or _count(filesize, MAX_SHARD_BYTES)):
            raise self._bad(number, "nsamples and filesize must be integers in range")
        if not isinstance(labels, dict) or len(labels) > MAX_LABELS:
            raise self._bad(number, f"labels must be an object of at most {MAX_LABELS:,} counts")
        if not all(len(text) <= MAX_TEXT and _count(count, MAX_SHARD_SAMPLES) for text, count in labels.items()):
            raise self._bad(number, "a label count that is no count, or a label text that is too long")
        if not isinstance(problems, list) or len(problems) > MAX_PROBLEMS + 1:
            raise self._bad(number, f"problems must be a list of at most {MAX_PROBLEMS + 1:,}")
        if not all(isinstance(problem, str) and len(problem) <= MAX_TEXT for problem in problems):
            raise self._bad(number, "a problem that is no text, or too long")
        return Scanned(Shard(self.urls[place], nsamples, filesize), Counter(labels), problems)

    def add(self, scanned: Scanned) -> None:
        """Append a shard just scanned (the first one starts the file over, with its first line)."""
        if not self.started:
            header = json.dumps({"kind": KIND, "key": self.key}) + "\n"
            write_atomically(self.path, lambda stream: stream.write(header.encode("utf-8")))
            self.started = True
        shard = scanned.shard
        line = {"shard": self.places[shard.url], "url": redact(shard.url), "nsamples": shard.nsamples}
        problems = [redact_text(problem)[:MAX_TEXT] for problem in scanned.problems]
        line |= {"filesize": shard.filesize, "labels": dict(scanned.labels), "problems": problems}
        data = (json.dumps(line) + "\n").encode("ascii")  # json.dumps escapes the rest
        check_output(self.path)
        descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0))
        try:
            os.write(descriptor, data)  # one write: a kill leaves the line whole or cut, never two mixed
            os.fsync(descriptor)
        finally:
            os.close(descriptor)

    def remove(self) -> None:
        """Remove the journal: the index it led to is written."""
        self.path.unlink(missing_ok=True)


def _count(value: object, most: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= most
