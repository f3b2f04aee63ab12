"""The files the parts of a `prepare --part I/N` run leave for each other (project/shards/stages.py): named numpy
arrays in an uncompressed zip (`np.savez`), written whole or not at all, and read back as a stranger's input.

Reading never unpickles (object arrays are refused) and is bounded: the file at most `MAX_FILE_BYTES`, every member
stored uncompressed and unencrypted (its bytes on disk are its bytes in memory), no member inside another (their
bytes together at most the file's), no member but the expected ones, each of its expected dtype and shape (`Spec`:
a leading dimension shared by the arrays that have one, fixed trailing ones).
Anything else is one line naming the file. Text (keys, class names) is kept as UTF-8 bytes and their end offsets.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

import numpy as np

from project.data.atomic import write_atomically
from project.errors import UserError

MAX_FILE_BYTES = 16 << 30  # a part's hashes: ~250 bytes a near-hashed image, ~550 a text: tens of millions
MAX_MEMBERS = 32
READ_CHUNK = 16 << 20  # bytes of a member read at a time
ENCRYPTED = 0x41  # a zip member's flag bits: encrypted (0x1), strongly encrypted (0x40)


@dataclass(frozen=True)
class Spec:
    """An expected member: its dtype, and its shape with `None` for the leading dimension `rows` names (the
    arrays that share one length) and numbers for fixed ones."""

    dtype: str
    shape: tuple[int | None, ...]
    rows: str = "n"  # which length the leading None is: "n" (records), or a name of its own (text bytes, ...)


def save_arrays(path: str, arrays: dict[str, np.ndarray], root: str | None = None) -> None:
    """Write `arrays` to `path` atomically, as `np.savez` does (stored, not compressed)."""
    write_atomically(path, lambda stream: np.savez(stream, **arrays), root=root)


def load_arrays(stream: IO[bytes], size: int, specs: dict[str, Spec], where: str) -> dict[str, np.ndarray]:
    """The arrays of a file written by `save_arrays` (`size` bytes, opened as a seekable `stream`), each checked
    against `specs` (a missing optional member, a spec whose dtype starts with '?', is left out)."""
    if size > MAX_FILE_BYTES:
        raise UserError(f"{where} is {size:,} bytes, more than a part's file may be ({MAX_FILE_BYTES:,}): not read")
    try:
        with zipfile.ZipFile(stream) as archive:
            return _checked(archive, size, specs, where)
    # zipfile and numpy's header parser raise these for a stranger's bytes (an encrypted member: RuntimeError; a
    # shape past int64: OverflowError; an unknown compression: NotImplementedError)
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError, RuntimeError, ArithmeticError) as error:
        raise UserError(f"{where} is not a part's file of prepare: {type(error).__name__}: {error}") from None


def _checked(archive: zipfile.ZipFile, size: int, specs: dict[str, Spec], where: str) -> dict[str, np.ndarray]:
    members = archive.infolist()
    if len(members) > MAX_MEMBERS:
        raise ValueError(f"{len(members)} members")
    if sum(member.compress_size for member in members) > size:  # one member inside another: read twice
        raise ValueError("its members overlap")
    names = {member.filename.removesuffix(".npy"): member for member in members}
    unknown = sorted(set(names) - set(specs))
    if unknown:
        raise ValueError(f"unexpected member {unknown[0][:60]!r}")
    lengths: dict[str, int] = {}
    arrays = {}
    for name, spec in specs.items():
        member = names.get(name)
        if member is None and spec.dtype.startswith("?"):
            continue
        if member is None:
            raise ValueError(f"no {name!r} array")
        if member.compress_type != zipfile.ZIP_STORED:
            raise ValueError(f"{name!r} is compressed")
        if member.flag_bits & ENCRYPTED:
            raise ValueError(f"{name!r} is encrypted")
        with archive.open(member) as raw:
            arrays[name] = _array(raw, member.file_size, name, spec, lengths)
    return arrays


def _array(raw: IO[bytes], stored: int, name: str, spec: Spec, lengths: dict[str, int]) -> np.ndarray:
    """One member's array, its header checked before its data is read."""
    version = np.lib.format.read_magic(raw)
    read_header: Callable = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}[
        version
    ]
    shape, fortran, dtype = read_header(raw, max_header_size=1024)
    expected = np.dtype(spec.dtype.lstrip("?"))
    if dtype != expected or fortran or len(shape) != len(spec.shape):
        raise ValueError(f"{name!r} is {dtype}{list(shape)}, not {expected}{list(spec.shape)}")
    for got, want in zip(shape, spec.shape, strict=True):
        if want is None:
            if lengths.setdefault(spec.rows, got) != got:
                raise ValueError(f"{name!r} has {got} rows, not {lengths[spec.rows]}")
        elif got != want:
            raise ValueError(f"{name!r} has shape {list(shape)}, not {list(spec.shape)}")
    if any(not 0 <= got < 2**48 for got in shape):  # numpy reads any int; np.prod would wrap or overflow
        raise ValueError(f"{name!r} has shape {list(shape)}")
    count = int(np.prod(shape, dtype=np.int64))
    if count * expected.itemsize > stored:  # the header claims more than the member holds
        raise ValueError(f"{name!r} claims {count:,} values in {stored:,} bytes")
    array = np.empty(count, dtype=expected)
    into, done = memoryview(array).cast("B"), 0
    while done < len(into):  # a chunk at a time, straight into the array: the file's bytes are never held twice
        chunk = raw.read(min(len(into) - done, READ_CHUNK))
        if not chunk:
            raise ValueError(f"{name!r} is cut short")
        into[done : done + len(chunk)] = chunk
        done += len(chunk)
    return array.reshape(shape)


def pack_texts(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """UTF-8 bytes of `texts`, joined, and the end offset of each."""
    encoded = [text.encode("utf-8", "surrogateescape") for text in texts]
    ends = np.cumsum([len(e) for e in encoded], dtype=np.int64) if encoded else np.zeros(0, np.int64)
    return np.frombuffer(b"".join(encoded), dtype=np.uint8).copy(), ends


def unpack_texts(data: np.ndarray, ends: np.ndarray) -> list[str]:
    """The texts `pack_texts` packed; offsets that do not rise within the data are a ValueError."""
    if len(ends) and (ends[-1] != len(data) or (np.diff(ends) < 0).any() or ends[0] < 0):
        raise ValueError("text offsets out of order or out of range")
    raw = data.tobytes()
    starts = [0, *ends[:-1].tolist()]
    return [raw[a:b].decode("utf-8", "surrogateescape") for a, b in zip(starts, ends.tolist(), strict=True)]


def load_bytes(data: bytes, specs: dict[str, Spec], where: str) -> dict[str, np.ndarray]:
    """`load_arrays` of a file read whole (from a store, bounded by its caller)."""
    return load_arrays(io.BytesIO(data), len(data), specs, where)
