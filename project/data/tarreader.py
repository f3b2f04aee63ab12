"""A tar reader for the data loader's hot loop: member names and bytes, in order, from a byte stream.

tarfile's stream mode parses every field of every header, about 30 us a member: more than half the
cost of decoding a 32 px JPEG, so the loader ran at half its decode speed. Here a plain ustar, GNU or
pax header costs about 4 us (name, size, type and checksum only). Compressed tars (gzip, bzip2, xz) are
decompressed as a stream, at most a bounded ratio of bytes out per byte in (decompress.py), and read by the
same parser. Errors are `tarfile.ReadError`s, as tarfile's own would be.

Hostile headers cannot make it allocate: each member's `read` knows its declared `size` before reading
(the caller refuses oversized members unread), long-name and pax headers are bounded, and data is read in
chunks, so a header that declares gigabytes over a short file costs only the bytes really there. Nor can
they make it spin: skipping a compressed member reads (in chunks) only the bytes really there, never more
than the decompression bound (a declared size is not trusted for a skip's cost), and every
pax record moves the parser on. (tarfile's stream mode reads a pax or long-name header whole, however
large its gzip bomb, and skips a member that declares 2**80 bytes in 10 kB steps, for ever.)
"""

from __future__ import annotations

import io
import tarfile
import zlib
from collections.abc import Iterator
from typing import IO, Protocol

from project.data.decompress import DECOMPRESSORS, MAX_COMPRESSION_RATIO, sniffed

__all__ = ["DECOMPRESSORS", "MAX_COMPRESSION_RATIO", "Member", "MemberRead", "tar_members"]

BLOCK = 512
REGULAR_TYPES = (b"0", b"\x00", b"7")
MAX_HEADER_BYTES = 1 << 20  # a GNU long name or a pax header: real ones are a few hundred bytes
CHUNK = 1 << 24  # reads above this go in chunks: memory follows the bytes that exist, not a declared size
Member = tuple[str, "MemberRead"]


class MemberRead(Protocol):
    """A member's `read`: its bytes, once; `size` is what its header declares, known before reading."""

    size: int

    def __call__(self) -> bytes: ...


def tar_members(stream: IO[bytes], max_ratio: float | None = MAX_COMPRESSION_RATIO) -> Iterator[Member]:
    """(name, read) for each regular file member, in tar order.

    `read.size` is the member's declared size. `read()` returns the member's bytes and must be called
    before the next member is asked for; members whose `read` is not called are skipped (seeked over when
    the stream can seek, else read through). A compressed stream stops past `max_ratio` bytes decompressed
    per compressed byte read (decompress.py), a member's bytes, skipped or read, counted alike.
    """
    stream, first = sniffed(stream, BLOCK, max_ratio)
    if not first:
        raise tarfile.ReadError("empty file")
    yield from _plain_members(stream, first)


def _plain_members(stream: IO[bytes], header: bytes) -> Iterator[Member]:
    long_name: str | None = None  # from a GNU 'L' member or a pax 'path' record, for the next member
    pax_size: int | None = None
    while True:
        if len(header) < BLOCK:
            if header:
                raise tarfile.ReadError("truncated header")
            _check_not_past_end(stream)
            return
        if header == bytes(BLOCK):  # end-of-archive marker
            return
        kind, size, name = _parse_header(header)
        size = pax_size if pax_size is not None else size
        padding = -size % BLOCK
        if kind in (b"L", b"x"):
            if size > MAX_HEADER_BYTES:
                raise tarfile.ReadError(f"a long-name or pax header of {size:,} bytes (at most {MAX_HEADER_BYTES:,})")
            data = _read_exactly(stream, size + padding)[:size]
            if kind == b"L":
                long_name = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            else:
                records = _pax_records(data)
                long_name = records.get("path", long_name)
                pax_size = _pax_size(records["size"]) if "size" in records else None
        elif kind in REGULAR_TYPES:
            read = _MemberReader(stream, size)
            yield (long_name if long_name is not None else name), read
            _skip(stream, size - read.consumed + padding)
            long_name = pax_size = None
        else:  # directories, links, devices, global pax headers, GNU long link names
            _skip(stream, size + padding)
            if kind not in (b"g", b"K"):  # those two come before the member they describe, or apply to all
                long_name = pax_size = None
        header = stream.read(BLOCK)


def byte_sum(block: bytes) -> int:
    """The sum of a 512-byte block's bytes, as `sum(block)` gives it, 20 times faster: Adler-32's first half is
    1 + the sum of the bytes modulo 65,521, exact for 256 bytes (at most 65,280). A header's checksum is
    computed for every member, read or skipped: `sum` was a sixth of a small sample's reading."""
    return (zlib.adler32(block[:256]) & 0xFFFF) + (zlib.adler32(block[256:]) & 0xFFFF) - 2


def _parse_header(header: bytes) -> tuple[bytes, int, str]:
    """(type flag, size, name) of a 512-byte header; a bad checksum is a `ReadError`."""
    stored = header[148:156].split(b"\0", 1)[0].strip()
    unsigned = byte_sum(header) - sum(header[148:156]) + 8 * 32  # the checksum counts its own field as spaces
    try:
        checksum = int(stored or b"-1", 8)
        if checksum != unsigned and checksum != _signed_checksum(header):
            raise ValueError
        size_field = header[124:136]
        if size_field[0] & 0x80:  # GNU base-256, for members of 8 GiB and more
            size = int.from_bytes(size_field[1:], "big")
        else:
            size = int(size_field.split(b"\0", 1)[0].strip() or b"0", 8)
        if size < 0:  # int() reads "-1" as octal too
            raise ValueError
    except ValueError:
        raise tarfile.ReadError("invalid header: bad checksum or size") from None
    name = header[:100].split(b"\0", 1)[0]
    if header[257:263] == b"ustar\x00" and header[345] != 0:  # POSIX ustar: a prefix holds long paths
        name = header[345:500].split(b"\0", 1)[0] + b"/" + name
    return header[156:157], size, name.decode("utf-8", "surrogateescape")


def _signed_checksum(header: bytes) -> int:
    """The checksum some old tar programs wrote, summing bytes as signed chars."""
    high = sum(1 for byte in header[:148] + header[156:] if byte >= 128)
    return sum(header) - sum(header[148:156]) + 8 * 32 - 256 * high


def _pax_records(data: bytes) -> dict[str, str]:
    """The "LENGTH key=value\\n" records of a pax extended header."""
    records, position = {}, 0
    while position < len(data) and data[position] != 0:
        length_text, _, _ = data[position : position + 20].partition(b" ")
        try:
            length = int(length_text)
        except ValueError:
            raise tarfile.ReadError("invalid pax header") from None
        if length <= len(length_text) + 1:  # a record must move past its own length: 0 or -5 would loop
            raise tarfile.ReadError("invalid pax header")
        record = data[position + len(length_text) + 1 : position + length - 1]
        key, _, value = record.partition(b"=")
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        position += length
    return records


def _pax_size(text: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise tarfile.ReadError(f"invalid pax header: size {text[:30]!r}")
    return int(text)


class _MemberReader:
    """The `read` of one member: its bytes, once; remembers how many it consumed."""

    __slots__ = ("stream", "size", "consumed")

    def __init__(self, stream: IO[bytes], size: int) -> None:
        self.stream, self.size, self.consumed = stream, size, 0

    def __call__(self) -> bytes:
        data = _read_exactly(self.stream, self.size - self.consumed)
        self.consumed = self.size
        return data


def _read_exactly(stream: IO[bytes], count: int) -> bytes:
    if count <= CHUNK:
        data = stream.read(count)
    else:  # one read(count) would allocate `count` bytes first, however few the stream holds
        chunks, remaining = [], count
        while remaining and (chunk := stream.read(min(remaining, CHUNK))):
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
    if len(data) < count:
        raise tarfile.ReadError("unexpected end of data")
    return data


def _skip(stream: IO[bytes], count: int) -> None:
    if count <= 0:
        return
    if _seekable(stream):
        try:
            stream.seek(count, io.SEEK_CUR)  # past the end is noticed at the end (_check_not_past_end)
        except (OSError, OverflowError, ValueError):  # a declared size past what a file can hold
            raise tarfile.ReadError(f"unexpected end of data (a member declares {count:,} bytes)") from None
        return
    while count:
        chunk = stream.read(min(count, 1 << 20))
        if not chunk:
            raise tarfile.ReadError("unexpected end of data")
        count -= len(chunk)


def _check_not_past_end(stream: IO[bytes]) -> None:
    """A seek over a member's data does not fail when the file ends inside it: check at the end."""
    if _seekable(stream):
        position = stream.tell()
        if position > stream.seek(0, io.SEEK_END):
            raise tarfile.ReadError("unexpected end of data")


def _seekable(stream: IO[bytes]) -> bool:
    seekable = getattr(stream, "seekable", None)  # webdataset's Pipe (pipe: urls) has no seekable()
    return bool(seekable and seekable())
