"""Compressed shards: a shard whose first bytes are a gzip, bzip2 or xz magic number is decompressed as a
stream, whatever its name says (a `.tar` that is really bzip2 too), and read by the tar parser as if plain.

Decompression is bounded by the input: at most `max_ratio` bytes come out per compressed byte read. Without
it an 8 KB bzip2 shard of zeros (bzip2 reaches 1:1,100,000) decompresses 9 GB on every read, 35 s of CPU,
whatever its tar headers declare; skipping a member reads through it, so skipping counts too. Real shards
stay far below the default (measured, tar bytes per compressed byte, best of gzip -9, bzip2 -9, xz -9e):
photos as JPEGs 1.3, the image demo's 32 px JPEGs 6, changelogs 11, Debian package summaries 114, label-only
shards 330, 128 px disc masks as .npy 541, 512 px binary masks 5,800 to 23,000 (none to all of them empty).
gzip cannot pass about 1,030 nor xz about 6,900 (on zeros); only bzip2 meets the bound. Past it the read
stops with a `tarfile.ReadError` naming `data.max_compression_ratio`: the stream's shard error. A first block
that is a tar header (its checksum right) is a plain tar, whatever it starts with: a first key `BZh...`.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import tarfile
import zlib
from typing import IO

DECOMPRESSORS = {  # by magic number
    b"\x1f\x8b": lambda stream: gzip.GzipFile(fileobj=stream, mode="rb"),
    b"BZh": bz2.BZ2File,
    b"\xfd7zXZ\x00": lzma.LZMAFile,
}
MAX_COMPRESSION_RATIO = 50_000  # data.max_compression_ratio's default: twice the most compressible shard measured


def sniffed(stream: IO[bytes], block: int, max_ratio: float | None) -> tuple[IO[bytes], bytes]:
    """The stream the tar parser reads, and its first `block` bytes: decompressed when `stream` starts with a
    compression's magic number (at most `max_ratio` bytes out per byte in; None: no bound), else `stream`."""
    first = stream.read(block)
    if is_tar_header(first):
        return stream, first
    for magic, decompressor in DECOMPRESSORS.items():
        if first.startswith(magic):
            source = _Counted(first, stream)
            decompressed = Decompressed(decompressor(source), source, max_ratio)
            return decompressed, decompressed.read(block)
    return stream, first


def is_tar_header(block: bytes) -> bool:
    """Whether `block` starts with a tar header whose checksum is right, as tar writes it."""
    if len(block) < 512:
        return False
    try:
        stored = int(block[148:156].split(b"\0", 1)[0].strip(), 8)
    except ValueError:
        return False
    return stored == sum(block[:512]) - sum(block[148:156]) + 8 * 32


class Decompressed:
    """A decompressed stream, read forward only (a skip reads through), whose errors are `ReadError`s; it
    stops one byte past `max_ratio` times the compressed bytes read so far."""

    __slots__ = ("file", "source", "max_ratio", "produced")
    ERRORS = (OSError, EOFError, zlib.error, lzma.LZMAError)  # bad or truncated data, in each format

    def __init__(self, file: IO[bytes], source: _Counted, max_ratio: float | None) -> None:
        self.file, self.source, self.max_ratio = file, source, max_ratio
        self.produced = 0  # bytes decompressed so far

    def read(self, size: int = -1) -> bytes:
        if self.max_ratio is None:
            return self._read(size)
        chunks = []
        while size != 0:
            # never ask for more than the bound allows and one byte: the decompressor's work stops there, unless
            # reading that byte needed more input, which raises the bound
            # (a float until capped: a ratio of inf, or 1e308 times the bytes read, is no int)
            room = int(min(max(0.0, self.max_ratio * self.source.count - self.produced), 1 << 62))
            data = self._read(room + 1 if size < 0 else min(size, room + 1))
            if not data:
                break
            self.produced += len(data)
            if self.produced > self.max_ratio * self.source.count:
                raise tarfile.ReadError(
                    f"it decompresses to more than {self.max_ratio:,g} times the {self.source.count:,} compressed "
                    f"bytes read (data.max_compression_ratio; a decompression bomb?)"
                )
            chunks.append(data)
            size -= len(data) if size > 0 else 0
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _read(self, size: int) -> bytes:
        try:
            return self.file.read(size)
        except self.ERRORS as error:
            if isinstance(error, OSError) and error.errno is not None:
                raise  # the stream's own error (a disk, a network), not the data's
            raise tarfile.ReadError(f"invalid compressed data: {error}") from None

    def seekable(self) -> bool:
        return False


class _Counted(io.RawIOBase):
    """A stream that first returns `head` (the bytes sniffed for the format), then the rest of `stream`, and
    counts the bytes it returned: the compressed bytes the decompressor has read."""

    def __init__(self, head: bytes, stream: IO[bytes]) -> None:
        self.head, self.stream, self.count = head, stream, 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self._read(size)
        self.count += len(data)
        return data

    def _read(self, size: int) -> bytes:
        if not self.head:
            return self.stream.read(size)
        if size < 0:
            head, self.head = self.head, b""
            return head + self.stream.read()
        head, self.head = self.head[:size], self.head[size:]
        return head if len(head) == size else head + self.stream.read(size - len(head))
