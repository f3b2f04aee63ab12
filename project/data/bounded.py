"""Downloads that stop at a bound: a shard at the size its index declares, a checkpoint at its server's
Content-Length and at `LIGHTNING_SHARDS_MAX_CHECKPOINT_GB`, an index at 64 MiB.

A stranger's server may send a body that never ends, or more than its Content-Length says (with chunked
transfer encoding, http.client ignores Content-Length and reads what comes): a download that trusts it fills
the disk (the private cache folder first). `Bounded` counts the bytes that come and raises `TooLong` a byte past
the bound, so the download stops there and its temporary file is removed (`write_atomically`)."""

from __future__ import annotations

import io
from typing import IO, NamedTuple


class Limit(NamedTuple):
    """The most bytes a download may bring, and why, in words that end the error message: "the size its
    shard index declares (filesize)"."""

    bytes: int
    why: str


class TooLong(OSError):
    """A download went past its bound: an OSError, so that every reader's handling of a failed read (one line
    naming the shard or checkpoint) applies; never retried."""

    @classmethod
    def declared(cls, length: int, limit: Limit) -> TooLong:
        return cls(f"its server declares {length:,} bytes (Content-Length), more than {limit.bytes:,}, {limit.why}")

    @classmethod
    def past(cls, limit: Limit) -> TooLong:
        return cls(f"it sent more than {limit.bytes:,} bytes, {limit.why}")


def tighter(limit: Limit | None, declared: int | None) -> Limit | None:
    """The smaller of `limit` and a server's Content-Length `declared` (None: not given); a declared length
    past `limit` is refused before a byte is read."""
    if declared is None:
        return limit
    if limit is not None and declared > limit.bytes:
        raise TooLong.declared(declared, limit)
    if limit is not None and declared == limit.bytes:
        return limit
    return Limit(declared, "the length its server declared (Content-Length): the server sends more than it said")


def content_length(value: str | None) -> int | None:
    """A Content-Length header's value, or None where it is missing or not a whole number."""
    value = (value or "").strip()
    return int(value) if value.isdigit() else None


class Bounded(io.RawIOBase):
    """A readable stream of at most `limit.bytes` bytes: a read that brings more raises `TooLong`. Each read asks
    for at most one byte past the bound, so nothing much past it is downloaded."""

    def __init__(self, raw: IO[bytes], limit: Limit) -> None:
        self.raw, self.limit, self.position = raw, limit, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:
        view = memoryview(buffer)[: self.limit.bytes - self.position + 1]
        count = self.raw.readinto(view)
        self.position += count or 0
        if self.position > self.limit.bytes:
            raise TooLong.past(self.limit)
        return count

    def close(self) -> None:
        if not self.closed:
            self.raw.close()
        super().close()
