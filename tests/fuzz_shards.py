"""Hostile shards for tests/test_fuzz.py: hypothesis strategies that mutate a valid small shard.

A base shard holds NSAMPLES samples (an 8 px JPEG and a .cls each) in three flavours: ustar, GNU with long
names ('L' headers) and pax with long unicode names (as webdataset's TarWriter writes). A case flips bytes
(in headers too: size fields, checksums, type flags, with the checksum fixed or not), cuts the shard, makes
a header declare a huge size (octal and GNU base-256, up to 2**88), duplicates, drops or swaps members,
inserts a long-name or pax header that lies, makes a header a GNU sparse one or a zero block, then maybe
gzips it and damages the gzip; or it is no tar at all (random bytes, empty, a gzip of garbage, a cut gzip).
"""

from __future__ import annotations

import gzip
import io
import itertools
import tarfile
from typing import NamedTuple

from hypothesis import strategies as st

from tests.conftest import jpeg

NSAMPLES, BLOCK = 3, 512


class Case(NamedTuple):
    why: str
    data: bytes

    def __repr__(self) -> str:
        return f"Case({self.why!r}, {len(self.data)} bytes)"


def base_tar(flavour: str) -> bytes:
    """NSAMPLES samples (an 8 px JPEG and a .cls each): "ustar" short names; "gnu" names past 100 bytes
    (GNU 'L' headers); "pax" long unicode names and float mtimes, as webdataset's TarWriter writes them."""
    folder = "" if flavour == "ustar" else "dåta/" + "d" * 100 + "/"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=FORMATS[flavour]) as tar:
        for i, extension in itertools.product(range(NSAMPLES), ("jpg", "cls")):
            data = jpeg(i) if extension == "jpg" else str(i % 3).encode()
            info = tarfile.TarInfo(f"{folder}s{i}.{extension}")
            info.size, info.mtime = len(data), 1_700_000_000.5 if flavour == "pax" else 1_700_000_000
            tar.addfile(info, io.BytesIO(data))
    data = buffer.getvalue()
    return data[: -(-len(data.rstrip(b"\0")) // BLOCK) * BLOCK + 2 * BLOCK]  # no padding to 10 kB records


def layout(data: bytes) -> tuple[list[int], list[range]]:
    """Every header's offset (long-name and pax ones too), and each member's bytes, headers and padding."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        infos = list(tar)
    headers = sorted({offset for info in infos for offset in (info.offset, info.offset_data - BLOCK)})
    return headers, [range(info.offset, info.offset_data + -(-info.size // BLOCK) * BLOCK) for info in infos]


FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}
BASES = {flavour: base_tar(flavour) for flavour in FORMATS}
HEADERS, SPANS = {}, {}
for _flavour, _data in BASES.items():
    HEADERS[_flavour], SPANS[_flavour] = layout(_data)
FIELDS = [(0, 100), (100, 8), (124, 12), (148, 8), (156, 1), (257, 8), (345, 155)]  # name mode size sum type magic
BYTES = st.sampled_from(b"01234567\0 89\x80\xffxLKgS5Z-") | st.integers(0, 255)
HUGE = [(1 << 24) + 1, (1 << 29) + 1, 8 << 30, 8**11 - 1, 8**11, 1 << 40, 1 << 62, 1 << 63, (1 << 88) - 1]
SIZES = st.sampled_from([0, 1, 511, 512, 513, 4096, *HUGE]) | st.integers(0, (1 << 88) - 1)
XZ_MAGIC = b"\xfd7zXZ\x00"


def fix_checksum(data: bytearray, header: int) -> None:
    block = data[header : header + BLOCK]
    if len(block) == BLOCK:
        block[148:156] = b" " * 8
        data[header + 148 : header + 156] = b"%06o\0 " % sum(block)


def size_field(size: int) -> bytes:
    return b"%011o\0" % size if size < 8**11 else b"\x80" + size.to_bytes(11, "big")  # octal, or GNU base-256


def raw_header(kind: bytes, name: bytes, size: int) -> bytes:
    header = bytearray(BLOCK)
    header[: len(name)], header[124:136], header[156:157], header[257:265] = name, size_field(size), kind, b"ustar\0 0"
    fix_checksum(header, 0)
    return bytes(header)


def anywhere(draw, flavour: str) -> int:
    """An offset in a member drawn evenly (sampled_from: hypothesis draws small integers far more often)."""
    return draw(st.sampled_from(draw(st.sampled_from(SPANS[flavour]))))


def flip(draw, data: bytearray, flavour: str) -> str:
    spots = [anywhere(draw, flavour) for _ in range(draw(st.integers(1, 4)))]
    for spot in spots:
        if spot < len(data):
            data[spot] ^= draw(st.integers(1, 255))
    return f"flip {spots}"


def field(draw, data: bytearray, flavour: str) -> str:
    """One byte of a header field (name, mode, size, checksum, type, magic, prefix), its checksum fixed or not."""
    header, (start, length) = draw(st.sampled_from(HEADERS[flavour])), draw(st.sampled_from(FIELDS))
    spot, value, fixed = header + start + draw(st.sampled_from(range(length))), draw(BYTES), draw(st.booleans())
    if spot < len(data):
        data[spot] = value
        if fixed:  # a header that passes its checksum, so that the field itself is what the reader meets
            fix_checksum(data, header)
    return f"byte {spot}={value}{' checksum fixed' if fixed else ''}"


def huge(draw, data: bytearray, flavour: str) -> str:
    header, size, fixed = draw(st.sampled_from(HEADERS[flavour])), draw(SIZES), draw(st.sampled_from([1, 1, 1, 0]))
    if header + BLOCK <= len(data):
        data[header + 124 : header + 136] = size_field(size)
        if fixed:
            fix_checksum(data, header)
    return f"header {header} declares {size}"


def truncate(draw, data: bytearray, flavour: str) -> str:
    cut = min(len(data), anywhere(draw, flavour) if draw(st.booleans()) else draw(st.integers(0, len(data))))
    del data[cut:]
    return f"cut at {cut}"


def shuffle(draw, data: bytearray, flavour: str) -> str:
    """Duplicate, drop or swap whole members (with their long-name or pax headers)."""
    members, order = [data[span.start : span.stop] for span in SPANS[flavour]], list(range(len(SPANS[flavour])))
    for _ in range(draw(st.integers(1, 3))):
        i, j = draw(st.sampled_from(range(len(order)))), draw(st.sampled_from(range(len(order) + 1)))
        action = draw(st.sampled_from(["duplicate", "drop", "swap"]))
        if action == "duplicate":
            order.insert(j, order[i])
        elif action == "drop" and len(order) > 1:
            del order[i]
        else:
            order[i], order[j - 1] = order[j - 1], order[i]
    data[: SPANS[flavour][-1].stop] = b"".join(members[i] for i in order)
    return f"members {order}"


@st.composite
def pax_record(draw) -> bytes:
    key = draw(st.sampled_from(["path", "size", "linkpath", "mtime", "GNU.sparse.size", "hdrcharset", "uid"]))
    value = draw(st.sampled_from(["s1.jpg", "s0.cls", "", "-1", "abc", "9" * 20, str(8 << 30)]) | st.text(max_size=9))
    text = f"{key}={value}\n".encode()
    length = next(n for n in itertools.count(len(text) + 2) if n == len(str(n)) + 1 + len(text))  # counts itself
    lie = st.sampled_from(["0", "-5", "x", "99999999999", "1" * 25])
    return draw(st.just(str(length)) | lie).encode() + b" " + text


def liar(draw, data: bytearray, flavour: str) -> str:
    """A long-name ('L') or pax ('x') header before a member, its declared size or its records lying."""
    kind = draw(st.sampled_from([b"L", b"x"]))
    payload = draw(st.lists(pax_record(), max_size=4).map(b"".join) if kind == b"x" else st.binary(max_size=700))
    declared = draw(st.just(len(payload)) | st.integers(0, 2 * len(payload) + 600) | SIZES)
    start = draw(st.sampled_from(SPANS[flavour])).start
    data[start:start] = raw_header(kind, b"././@LongLink", declared) + payload + bytes(-len(payload) % BLOCK)
    return f"{kind.decode()} header declaring {declared} over {payload[:60]!r}"


def sparse_or_zero(draw, data: bytearray, flavour: str) -> str:
    """A header made an old GNU sparse one with an extension block to follow, or a zero block (an early end)."""
    header, zero = draw(st.sampled_from(HEADERS[flavour])), draw(st.booleans())
    if header + BLOCK > len(data):
        return "nothing"
    if zero:
        data[header : header + BLOCK] = bytes(BLOCK)
        return f"zero block at {header}"
    data[header + 156], data[header + 482] = ord("S"), 1
    fix_checksum(data, header)
    return f"sparse header at {header}"


@st.composite
def tar_cases(draw) -> Case:
    flavour = draw(st.sampled_from(sorted(BASES)))
    data = bytearray(BASES[flavour])
    mutations = [flip, field, huge, truncate, shuffle, liar, sparse_or_zero]
    steps = [mutate(draw, data, flavour) for mutate in draw(st.lists(st.sampled_from(mutations), max_size=2))]
    if draw(st.booleans()):
        data = bytearray(gzip.compress(bytes(data), mtime=0))
        steps.append("gzip")
        if draw(st.sampled_from([False, False, False, True])) and data:  # damage to the compressed bytes
            spot = draw(st.sampled_from(range(len(data))))
            if draw(st.booleans()):
                data[spot] ^= draw(st.integers(1, 255))
                steps.append(f"gzip byte {spot} flipped")
            else:
                del data[spot:]
                steps.append(f"gzip cut at {spot}")
    return Case(f"{flavour}: {', '.join(steps)}", bytes(data))


NON_TAR = st.one_of(
    st.binary(max_size=2048).map(lambda data: Case("random bytes", data)),
    st.just(Case("empty", b"")),
    st.integers(1, 4).map(lambda blocks: Case("zero blocks", bytes(blocks * BLOCK))),
    st.binary(max_size=2048).map(lambda data: Case("gzip of garbage", gzip.compress(data, mtime=0))),
    st.tuples(st.sampled_from(sorted(BASES)), st.sampled_from(range(1500))).map(
        lambda cut: Case("truncated gzip", gzip.compress(BASES[cut[0]], mtime=0)[: cut[1]])
    ),
    st.tuples(st.sampled_from([b"\x1f\x8b", b"\x1f\x8b\x08\x00", b"BZh9", XZ_MAGIC]), st.binary(max_size=600)).map(
        lambda parts: Case("compression magic and garbage", parts[0] + parts[1])
    ),
)
