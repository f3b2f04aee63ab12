"""A tar writer for `prepare`'s hot loop.

webdataset's TarWriter builds every member header through tarfile's PAX code, about 70 µs a member,
which made `prepare` 5x slower than `tar -cf`; a plain ustar header is 512 bytes we can pack directly.
Names that ustar cannot hold (over 100 bytes, or not ASCII) still go through tarfile.
"""

from __future__ import annotations

import tarfile
from typing import IO

BLOCK = 512


def ustar_header(name: str, size: int, mtime: int = 0) -> bytes:
    """The 512-byte header of a regular file member (owner 0:0, mode 0644)."""
    encoded = name.encode("ascii", "strict") if name.isascii() else b""
    if not encoded or len(encoded) > 100:
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = size, mtime, 0o644
        return info.tobuf(tarfile.PAX_FORMAT)
    header = bytearray(BLOCK)
    header[0 : len(encoded)] = encoded
    header[100:108] = b"0000644\0"
    header[108:116] = b"0000000\0"
    header[116:124] = b"0000000\0"
    header[124:136] = b"%011o\0" % size
    header[136:148] = b"%011o\0" % mtime
    header[148:156] = b" " * 8  # the checksum counts its own field as spaces
    header[156] = ord("0")
    header[257:265] = b"ustar\x0000"
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header)


class FastTarWriter:
    """Writes samples {"__key__": key, ext: bytes, ...} as `key.ext` members, extensions in sorted order."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream

    def write(self, sample: dict) -> None:
        key = sample["__key__"]
        parts = []
        for extension in sorted(k for k in sample if k != "__key__"):
            data = sample[extension]
            parts += [ustar_header(f"{key}.{extension}", len(data)), data, b"\0" * (-len(data) % BLOCK)]
        self.stream.write(b"".join(parts))

    def close(self) -> None:
        self.stream.write(b"\0" * (2 * BLOCK))  # end of archive

    def __enter__(self) -> FastTarWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
