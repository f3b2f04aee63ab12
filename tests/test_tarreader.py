"""The fast tar reader gives what tarfile gives, for every tar flavour, and fails where the tar is broken."""

from __future__ import annotations

import io
import tarfile

import pytest

from project.data.tarreader import tar_members

NAMES = ["a.jpg", "dir/" + "long" * 30 + ".jpg", "ünïcode.cls", "x/" * 60 + "deep.txt", "empty.bin"]
USTAR_NAMES = ["a.jpg", "x/" * 60 + "deep.txt", "empty.bin"]  # ascii, and long paths only with a prefix


def make_tar(tar_format: int, compression: str = "", names: list[str] = NAMES) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=f"w:{compression}", format=tar_format) as tar:
        folder = tarfile.TarInfo("dir")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
        for number, name in enumerate(names):
            data = bytes([number]) * (number * 300)
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
            link = tarfile.TarInfo(f"link{number}")
            link.type, link.linkname = tarfile.SYMTYPE, f"target{number}"
            tar.addfile(link)
    return buffer.getvalue()


def expected(data: bytes) -> list[tuple[str, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return [(info.name, tar.extractfile(info).read()) for info in tar if info.isreg()]


class Unseekable(io.RawIOBase):
    def __init__(self, data: bytes) -> None:
        self.inner = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        return self.inner.readinto(buffer)


@pytest.mark.parametrize("compression", ["", "gz", "bz2", "xz"])
@pytest.mark.parametrize("tar_format", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_members_equal_tarfiles_for_every_format(tar_format, compression):
    names = USTAR_NAMES if tar_format == tarfile.USTAR_FORMAT else NAMES
    data = make_tar(tar_format, compression, names)
    truth = expected(data)
    assert len(truth) == len(names) >= 3
    for stream in (io.BytesIO(data), io.BufferedReader(Unseekable(data))):
        assert [(name, read()) for name, read in tar_members(stream)] == truth


@pytest.mark.parametrize("seekable", [True, False])
def test_members_left_unread_are_skipped(seekable):
    data = make_tar(tarfile.PAX_FORMAT)
    stream = io.BytesIO(data) if seekable else io.BufferedReader(Unseekable(data))
    every_other = [(name, read()) for number, (name, read) in enumerate(tar_members(stream)) if number % 2]
    assert every_other == expected(data)[1::2]


def test_webdataset_shards_read_as_tarfile_reads_them(shard_folder):
    folder, _ = shard_folder([7])
    data = (folder / "train-000000.tar").read_bytes()
    assert [(name, read()) for name, read in tar_members(io.BytesIO(data))] == expected(data)


def first_member_offsets(data: bytes) -> tuple[int, int]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        info = next(info for info in tar if info.isreg() and info.size)
        return info.offset, info.offset_data


@pytest.mark.parametrize("seekable", [True, False])
@pytest.mark.parametrize("read_data", [True, False])
@pytest.mark.parametrize("where", ["data", "header"])
def test_truncated_tars_are_read_errors(where, read_data, seekable):
    data = make_tar(tarfile.USTAR_FORMAT, names=["a.jpg", "b.jpg", "c.jpg"])
    header, body = first_member_offsets(data)
    cut = data[: body + 100] if where == "data" else data[: header + 200]
    stream = io.BytesIO(cut) if seekable else io.BufferedReader(Unseekable(cut))
    with pytest.raises(tarfile.ReadError):
        for _, read in tar_members(stream):
            if read_data:
                read()


def test_corrupt_header_and_empty_file_are_read_errors():
    data = bytearray(make_tar(tarfile.USTAR_FORMAT, names=["a.jpg", "b.jpg"]))
    header, _ = first_member_offsets(bytes(data))
    data[header + 5] ^= 0xFF  # a flipped byte in a name: the checksum no longer matches
    with pytest.raises(tarfile.ReadError, match="checksum"):
        list(tar_members(io.BytesIO(bytes(data))))
    with pytest.raises(tarfile.ReadError, match="empty"):
        list(tar_members(io.BytesIO(b"")))
