"""Read one shard's samples: tar members in order, grouped by key into {"__key__", "__url__", ext: bytes}.

Members are grouped by webdataset's key rule (`base_plus_ext`): `a/b.c.jpg` is extension `c.jpg` of key `a/b`.
Only the extensions asked for are read into memory; the rest are skipped over. A member whose header declares
more than `max_member_bytes` is never read: its sample gets a "__refused__" reason instead, which the stream
counts as a skipped sample. Nothing is decoded here: what a member means is the task's business
(`Task.decode`), and nothing is ever unpickled.
"""

from __future__ import annotations

import itertools
import re
import tarfile
import zlib
from collections.abc import Callable, Iterator
from typing import IO, NamedTuple

from webdataset.tariterators import base_plus_ext

from project.data.remote import open_url
from project.data.tarreader import MAX_COMPRESSION_RATIO, MemberRead, tar_members
from project.errors import ShardError

READ_ERRORS = (tarfile.TarError, EOFError, zlib.error, OSError)
META_MEMBER = re.compile(r"__[^/]*__($|/)")  # webdataset's rule for metadata members
MAX_MEMBER_BYTES = 1 << 29  # 512 MiB: a raw RGBA image at PIL's pixel limit fits; a hostile 8 GiB header does not
REFUSED = "__refused__"  # a sample's key for why one of its members was not read
# a grouped sample: "__key__" and "__url__" (str), and one entry of bytes per extension read
Sample = dict


def read_samples(
    url: str,
    start: int = 0,
    stop: int | None = None,
    *,
    extensions: frozenset[str] | None = None,
    open_stream: Callable[[str], IO[bytes]] = open_url,
    max_member_bytes: int | None = MAX_MEMBER_BYTES,
    max_ratio: float | None = MAX_COMPRESSION_RATIO,
) -> Iterator[Sample]:
    """Samples [start, stop) of one shard, as {"__key__", "__url__", ext: bytes}.

    Args:
        url: the shard (a path or a URL that `open_stream` opens).
        start: the first sample to yield (those before it are counted by key, never read).
        stop: the sample to stop before; reading ends once sample `stop - 1` is complete.
        extensions: the extensions (lower case) whose bytes are read; None reads every member.
        open_stream: opens `url` as a byte stream.
        max_member_bytes: a member declaring more bytes is left unread, and its sample gets `REFUSED`
            (None: no bound).
        max_ratio: a compressed shard stops (a `ShardError`) past this many bytes decompressed per compressed
            byte read (None: no bound).
    """
    try:
        stream = open_stream(url)
    except OSError as error:
        raise ShardError(f"cannot open shard {url}: {error.strerror or error}") from None
    try:
        by_key = itertools.groupby(_keyed(_members(stream, url, max_ratio)), key=lambda member: member.key)
        for position, (key, members) in enumerate(by_key):
            if stop is not None and position >= stop:
                return
            if position >= start:  # the members of a sample before `start` are passed over unread
                yield _sample(url, key, members, extensions, max_member_bytes)
    finally:
        stream.close()


class Member(NamedTuple):
    key: str
    extension: str  # lower case
    name: str
    read: MemberRead


def _keyed(members: Iterator[tuple[str, MemberRead]]) -> Iterator[Member]:
    """The members that webdataset's key rule gives a key, with their key and extension."""
    for name, read in members:
        key, extension = base_plus_ext(name)
        if key is not None:
            yield Member(key, extension.lower(), name, read)


def _sample(
    url: str, key: str, members: Iterator[Member], extensions: frozenset[str] | None, max_member_bytes: int | None
) -> Sample:
    """One sample from its members: the bytes of those with an extension asked for, or why one was refused."""
    sample: Sample = {"__key__": key, "__url__": url}
    for member in members:
        if extensions is not None and member.extension not in extensions:
            continue
        if max_member_bytes is not None and member.read.size > max_member_bytes:
            shown = member.name if member.name.isprintable() else ascii(member.name)  # a line break: still one line
            sample[REFUSED] = (
                f"member {shown} declares {member.read.size:,} bytes, over data.max_member_bytes ({max_member_bytes:,})"
            )
            continue
        try:
            sample[member.extension] = member.read()
        except READ_ERRORS as error:
            raise ShardError(f"cannot read shard {url}: {error}") from None
    return sample


def _members(stream: IO[bytes], url: str, max_ratio: float | None) -> Iterator[tuple[str, MemberRead]]:
    """(name, read) for each regular member, in tar order; `read` must be called before moving on."""
    try:
        for name, read in tar_members(stream, max_ratio):
            if not META_MEMBER.match(name):
                yield name, read
    except READ_ERRORS as error:
        raise ShardError(f"cannot read shard {url}: {error}") from None


def count_samples(url: str) -> int:
    """Samples (distinct consecutive keys) in one shard, from its tar headers: member data is skipped."""
    return sum(1 for _ in read_samples(url, extensions=frozenset()))
