"""Fetch a worker's remote shards ahead of its reading: the next shards of its plan are requested and read
into memory by background threads while the worker decodes, up to a byte budget.

Without it a worker waits for each shard's first byte (the store's latency) after finishing the one before,
and for the network each time it fills its shuffle buffer, decoding nothing meanwhile: 0.6-0.8 of the local rate
from a server with 50 ms of latency and 25 MB/s per connection (benchmarks/latency.py). The bytes and their
order are the same as without it, so batches, resume and exactly-once evaluation do not change. An error
reaches the reader where its bytes stop, naming the same shard as without it: opening the shard when the
reader opens it, a read after the bytes that came before it.

Bounds: at most `FETCHES` fetches under way per opener, the shard being read and the next (one its reader has
closed may take a last read to notice). The budget is spent in plan order: a shard fetches on while it and
the shards before it hold less than the budget, so the one being read is never starved by those behind it,
and an opener holds at most twice the budget (the shard being read refilling while the next holds the rest)
plus a chunk a fetch, a chunk being at most a quarter of the budget (or 1 MB); a shard ahead is held whole only
when it fits. A worker reading a mixed group of shards has an opener per lane (see stream.py), which share its
budget: it holds at most 2.5 times `data.read_ahead_mb` in all. Local files are opened when they are
needed: a disk has no latency worth hiding.
"""

from __future__ import annotations

import collections
import io
import threading
from collections.abc import Callable, Iterable
from typing import IO

from project.data.remote import is_remote

CHUNK = 1 << 20  # bytes fetched at a time: about 40 ms of a 25 MB/s connection
MIN_CHUNK = 1 << 12
FETCHES = 2  # fetches under way per worker: two streams at once where a store caps each connection's rate
READ_AHEAD_BYTES = 32 * 10**6  # data.read_ahead_mb's default: a shuffle buffer of 32 kB samples
Opener = Callable[[str], IO[bytes]]


class ReadAhead(io.RawIOBase):
    """One shard's bytes, fetched by a thread of its own into its opener's budget: the thread opens the url
    at once and reads on while the reader is busy elsewhere."""

    def __init__(self, url: str, opener: ShardOpener) -> None:
        self.url, self.opener, self.condition = url, opener, opener.condition
        self.chunks: collections.deque[memoryview] = collections.deque()
        self.buffered = 0
        self.opened = self.finished = self.stopped = False
        self.counted = True  # in its opener's `fetching`: until its fetch ends or its reader closes it
        self.open_error: BaseException | None = None  # raised by `wait_opened`, where opening would have raised
        self.read_error: BaseException | None = None  # raised by a read once the bytes before it are consumed
        threading.Thread(target=self._fetch, name="shard-read-ahead", daemon=True).start()

    def _fetch(self) -> None:
        try:
            stream = self.opener.open_stream(self.url)
        except BaseException as error:  # noqa: BLE001 - handed to the reader as it is, a Rust panic too: a thread
            self._finish(open_error=error)  # that ended without a word would leave its reader waiting for ever
            return
        with self.condition:
            self.opened = True
            self.condition.notify_all()
        failure = None  # handed to the reader after the bytes before it
        read = getattr(stream, "read1", stream.read)  # one raw read at a time: the bytes before an error arrive
        try:
            while self._room() and (chunk := read(self.opener.chunk)):
                with self.condition:
                    if not self.stopped:
                        self.chunks.append(memoryview(chunk))
                        self.buffered += len(chunk)
                        self.condition.notify_all()
        except BaseException as error:  # noqa: BLE001 - as above
            failure = error
        try:
            stream.close()
        except BaseException as error:  # noqa: BLE001 - a pipe: command's exit status
            failure = failure or error
        self._finish(read_error=failure)

    def _room(self) -> bool:
        """Wait for room in the budget; False once the reader has closed this stream."""
        with self.condition:
            self.condition.wait_for(lambda: self.stopped or self.opener.has_room(self))
            return not self.stopped

    def _finish(self, open_error: BaseException | None = None, read_error: BaseException | None = None) -> None:
        with self.condition:
            self.open_error, self.read_error = open_error, read_error
            self.opened = self.finished = True
            self._end_fetch()

    def _end_fetch(self) -> None:
        if self.counted:
            self.counted = False
            self.opener.fetch_ended()

    def wait_opened(self) -> None:
        """Wait until the url is open (usually long done); raise what opening it raised."""
        with self.condition:
            self.condition.wait_for(lambda: self.opened)
        if self.open_error is not None:
            raise self.open_error

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:
        with self.condition:
            self.condition.wait_for(lambda: self.chunks or self.finished)
            if not self.chunks:
                if self.read_error is not None:
                    raise self.read_error
                return 0
            chunk = self.chunks[0]
            count = min(len(buffer), len(chunk))
            buffer[:count] = chunk[:count]
            if count == len(chunk):
                self.chunks.popleft()
            else:
                self.chunks[0] = chunk[count:]
            self._release(count)
            return count

    def _release(self, count: int) -> None:
        self.buffered -= count
        self.opener.top_up()
        self.condition.notify_all()

    def close(self) -> None:
        """Stop the thread (it closes the connection after the read it is in) and drop the bytes held."""
        if not self.closed:
            with self.condition:
                self.stopped = True
                self.chunks.clear()
                self.opener.live.remove(self)
                self._end_fetch()  # its thread may still be in a last read: the next shard need not wait for it
                self._release(self.buffered)
        super().close()


class ShardOpener:
    """Opens a worker's shards in its plan's order (`urls`): a remote one from the bytes fetched ahead.

    Each open starts fetching the shards that follow, while at most `FETCHES` responses are open and the
    bytes held stay under `budget` (0: nothing is fetched ahead)."""

    def __init__(self, urls: Iterable[str], open_stream: Opener, budget: int) -> None:
        self.open_stream, self.budget = open_stream, budget
        # a read at a time: at most a quarter of the budget, so that a small budget (one lane's of a mixed group,
        # see stream.py) is not overrun by its fetches' reads
        self.chunk = max(MIN_CHUNK, min(CHUNK, budget // 4))
        self.condition = threading.Condition()
        self.upcoming = collections.deque(urls)  # not started yet
        self.started: collections.deque[ReadAhead] = collections.deque()  # started, not yet opened by the reader
        self.live: list[ReadAhead] = []  # started and not closed, in plan order: the one being read first
        self.fetching = 0  # fetches under way: responses open
        self.closed = False

    def has_room(self, ahead: ReadAhead | None = None) -> bool:
        """Whether `ahead` and the shards before it (all of them, for None) hold less than the budget."""
        held = 0
        for other in self.live:
            held += other.buffered
            if other is ahead:
                break
        return held < self.budget

    def start(self) -> None:
        """Start fetching the first shards now, before the reader opens one: a mixed group's lanes all begin
        at once (their first requests wait for the store together, not one after another)."""
        with self.condition:
            self.top_up()

    def top_up(self) -> None:
        """Start the next remote shards' fetches while there is room (called with the condition held)."""
        while (
            not self.closed
            and self.upcoming
            and is_remote(self.upcoming[0])
            and self.fetching < FETCHES
            and self.has_room()
        ):
            self.started.append(self._start(self.upcoming.popleft()))

    def _start(self, url: str) -> ReadAhead:
        ahead = ReadAhead(url, self)
        self.fetching += 1
        self.live.append(ahead)
        return ahead

    def fetch_ended(self) -> None:
        """A fetch reached its end or an error, or its reader closed it (called with the condition held)."""
        self.fetching -= 1
        self.top_up()
        self.condition.notify_all()

    def __call__(self, url: str) -> IO[bytes]:
        """Open `url`, the plan's next shard."""
        with self.condition:
            if self.started and self.started[0].url == url:
                ahead = self.started.popleft()
            elif not self.started and self.upcoming and self.upcoming[0] == url:
                self.upcoming.popleft()
                ahead = self._start(url) if self.budget > 0 and is_remote(url) else None
            else:
                raise RuntimeError(f"{url} is not the next shard of the plan")
            self.top_up()
        if ahead is None:
            return self.open_stream(url)
        try:
            ahead.wait_opened()
        except BaseException:
            ahead.close()
            raise
        return io.BufferedReader(ahead, buffer_size=self.chunk)

    def close(self) -> None:
        """Drop the fetches of shards not read yet (the pass ended or stopped early)."""
        with self.condition:
            self.closed = True
            started, self.started = list(self.started), collections.deque()
        for ahead in started:
            ahead.close()
