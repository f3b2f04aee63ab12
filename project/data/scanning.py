"""Shards read through once each to index them: in threads (the work is waiting on a store), with a progress bar
in bytes and shards, the bounds of any read (a member at `MAX_MEMBER_BYTES`, a shard at the largest size an index
may declare), and a journal (journal.py) of the shards already done, so that an interrupted run goes on from there.

What a scan learns of a shard beyond its count is its task's (`Indexer`: `shards.index` and the image and text
tasks count label texts, and turn them into their index's class names); `COUNTING` only counts samples. A shard
that cannot be opened or whose connection fails for good stops the run (the journal keeps the rest); a shard
whose bytes are broken is indexed up to the break, with a problem naming it.
"""

from __future__ import annotations

import concurrent.futures
import io
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import IO

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from project.data.bounded import Limit, TooLong
from project.data.remote import is_remote, open_url
from project.data.samples import read_samples
from project.data.shard_index import MAX_SHARD_BYTES, Shard
from project.errors import ShardError, UserError
from project.redact import redact, redact_text

Opener = Callable[[str], IO[bytes]]
MAX_PROBLEMS = 1000  # problems kept per shard: a shard of a million bad samples is a line and a count past these
DRAIN_BYTES = 1 << 20  # what may follow a tar's end in a stream of unknown length (padding) before its size is unknown
SHARD_LIMIT = Limit(MAX_SHARD_BYTES, "the largest shard an index may declare")


@dataclass
class Scanned:
    """What one shard's scan found: the shard (its count and size), the label texts a task's scan counted, and
    what is wrong with its samples ("key: what")."""

    shard: Shard
    labels: Counter = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Indexer:
    """How a task indexes shards: its scan of one shard (`scan(url, open_stream)`, reading through `open_stream`),
    and the keys its index records beside the shard list (`extra(scanned)`). `name` tells caches apart."""

    name: str
    scan: Callable[[str, Opener], Scanned]
    extra: Callable[[list[Scanned]], dict]


def count_scan(url: str, open_stream: Opener) -> Scanned:
    """A shard's samples counted from its tar headers; a break ends the count, with a problem naming it."""
    count, problems = 0, []
    try:
        for _ in read_samples(url, extensions=frozenset(), open_stream=open_stream):
            count += 1
    except ShardError as error:
        problems.append(f"(after sample {count}) {error}")
    return Scanned(Shard(url, count), Counter(), problems)


COUNTING = Indexer("count", count_scan, lambda scanned: {})


class Unreachable(Exception):
    """A shard that could not be opened, or whose connection failed for good: the run stops, and may go on. No
    ShardError: a task's scan records those as the shard's problems, and this one must pass through it."""


class Measured(io.RawIOBase):
    """A shard's stream as a scan reads it: the bytes it passes counted (the progress bar), a failure of the stream
    itself (not of its tar data) kept, and, as it closes, its size: the end of a seekable stream, else the bytes
    read to its end (a stream that goes on `DRAIN_BYTES` past its tar's end has no size)."""

    def __init__(self, stream: IO[bytes], progress: Callable[[int], None]) -> None:
        self.stream, self.progress = stream, progress
        self.position, self.size, self.failed = 0, None, None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self.stream.seekable()

    def _moved(self, position: int) -> None:
        if position > self.position:
            self.progress(position - self.position)
        self.position = max(self.position, position)

    def _call(self, method: Callable, *args):
        try:
            return method(*args)
        except OSError as error:
            if not isinstance(error, TooLong):  # past its bound: the shard's fault, not the store's
                self.failed = error
            raise

    def readinto(self, buffer: bytearray | memoryview) -> int:
        count = self._call(self.stream.readinto, buffer) if hasattr(self.stream, "readinto") else None
        if count is None:
            data = self._call(self.stream.read, len(buffer))
            count = len(data)
            buffer[:count] = data
        self._moved(self.position + count)
        return count

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        position = self._call(self.stream.seek, offset, whence)
        if whence != io.SEEK_END:
            self._moved(position)
        return position

    def tell(self) -> int:
        return self.stream.tell()

    def close(self) -> None:
        if not self.closed:
            try:
                if self.failed is None:
                    self.size = self._measure()
            except OSError:
                self.size = None
            finally:
                self.stream.close()
        super().close()

    def _measure(self) -> int | None:
        if self.stream.seekable():
            size = self.stream.seek(0, io.SEEK_END)
            self._moved(size)
            return size
        end = self.position + DRAIN_BYTES
        while self.position <= end and (chunk := self.stream.read(min(1 << 16, end + 1 - self.position))):
            self._moved(self.position + len(chunk))
        return self.position if self.position <= end else None


def scan_one(url: str, scan: Callable[[str, Opener], Scanned], progress: Callable[[int], None]) -> Scanned:
    """One shard scanned, its size measured as it is read; `Unreachable` where its store fails it."""
    streams: list[Measured] = []

    def open_stream(name: str) -> IO[bytes]:
        if not is_remote(name):  # a local file that cannot be opened is a problem of its own, as before
            streams.append(Measured(open_url(name), progress))
            return io.BufferedReader(streams[-1], buffer_size=1 << 16)
        try:
            stream = open_url(name, limit=SHARD_LIMIT)
        except (OSError, ShardError) as error:  # open_url's one line for a network error is a ShardError
            raise Unreachable(f"cannot open {redact(name)}: {redact_text(str(error))}") from None
        streams.append(Measured(stream, progress))
        return io.BufferedReader(streams[-1], buffer_size=1 << 16)

    scanned = scan(url, open_stream)
    stream = streams[-1] if streams else None
    if stream is not None and stream.failed is not None and is_remote(url):
        raise Unreachable(f"cannot read {redact(url)}: {redact_text(str(stream.failed))}")
    if len(scanned.problems) > MAX_PROBLEMS:
        more = len(scanned.problems) - MAX_PROBLEMS
        scanned.problems = [*scanned.problems[:MAX_PROBLEMS], f"... and {more:,} more problems in this shard"]
    return replace(scanned, shard=replace(scanned.shard, filesize=stream.size if stream else None))


class ScanProgress:
    """The progress bar of a scan, on stderr, in bytes (of `total` where the listing gave every size) and shards;
    none when stderr is no terminal, or `quiet`. Threads report to it."""

    def __init__(self, shards: int, done: int, total: int | None, quiet: bool) -> None:
        console = Console(stderr=True)
        columns = (TextColumn("indexing {task.fields[shards]}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
        self.bar = Progress(*columns, console=console, disable=quiet or not console.is_terminal, transient=True)
        self.shards, self.done, self.lock = shards, done, threading.Lock()
        self.task = self.bar.add_task("index", total=total, shards=self._shards())

    def _shards(self) -> str:
        return f"{self.done}/{self.shards} shards"

    def add(self, count: int) -> None:
        self.bar.update(self.task, advance=count)  # rich's Progress takes its own lock

    def finished(self) -> None:
        with self.lock:
            self.done += 1
            self.bar.update(self.task, shards=self._shards())

    def __enter__(self) -> ScanProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()


def scan_shards(
    urls: Sequence[str],
    indexer: Indexer,
    *,
    workers: int = 8,
    finished: dict[str, Scanned] | None = None,
    record: Callable[[Scanned], None] | None = None,
    sizes: dict[str, int] | None = None,
    quiet: bool = False,
) -> list[Scanned]:
    """Every shard of `urls` scanned once, `workers` at a time, in the order given; those `finished` holds already
    (an interrupted run's, from its journal) are not read again, and each one done is passed to `record`. A shard
    its store fails stops the run in one line, once the shards under way are done (and recorded)."""
    done: dict[str, Scanned] = dict(finished or {})
    todo = [url for url in dict.fromkeys(urls) if url not in done]
    known = sizes or {}
    total = sum(known[url] for url in urls) if all(url in known for url in urls) else None
    failures: list[str] = []
    with ScanProgress(len(urls), len(urls) - len(todo), total, quiet) as progress:
        pool = concurrent.futures.ThreadPoolExecutor(max(1, workers), thread_name_prefix="scan")
        try:
            futures = {pool.submit(scan_one, url, indexer.scan, progress.add): url for url in todo}
            for future in concurrent.futures.as_completed(futures):
                if future.cancelled():  # after a failure: left for the next run
                    continue
                try:
                    scanned = future.result()
                except Unreachable as error:
                    failures.append(str(error))
                    for other in futures:  # the shards not started stay for the next run
                        other.cancel()
                    continue
                done[futures[future]] = scanned
                progress.finished()
                if record is not None:
                    record(scanned)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    if failures:
        left = sum(url not in done for url in urls)
        raise UserError(f"{failures[0]} ({left} of {len(urls)} shards left to index: run it again to go on)")
    return [done[url] for url in urls]
