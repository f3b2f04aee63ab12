"""Object stores without a network: an fsspec filesystem registered in this process under a store's scheme
(gs, gcs, az, abfs, hf, ...), serving a local folder as its buckets, for every test that reads or lists one.

Its files are fsspec's `AbstractBufferedFile`, read by byte ranges (`_fetch_range`) through fsspec's read-ahead
cache, as gcsfs', adlfs' and huggingface_hub's files are; it knows each object's size, raises FileNotFoundError
for a missing one, as they do, and lists folders (`ls`, hence fsspec's `find` and `glob`). A test may plant a
fault: a library's own error (no OSError, as google.api_core's or azure.core's) when a file is opened, or when
a read goes past its first range (at once, when that range is the whole object).

The registration is this process's: DataLoader workers started by forkserver or spawn (as the project starts
them) import fsspec afresh and know only the real libraries, so tests read through streams in this process
(`num_workers=0`). `register` undoes it with the test's monkeypatch.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fsspec.registry import _registry
from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

BLOCK = 16 << 10  # bytes per range request: a shard of the tiny demo takes several


class LibraryError(Exception):
    """A store library's own error, which is no OSError (botocore's, google.api_core's, azure.core's)."""


class StandInFile(AbstractBufferedFile):
    """A stored object's bytes, fetched by range as a store's client fetches them."""

    def _fetch_range(self, start: int, end: int) -> bytes:
        self.fs.fetches.append((self.path, start, end))
        if start > 0 or end >= self.size:  # all but a first range short of the end: a reader gets some bytes first
            self.fs.fault(self.path, "read")
        with open(self.fs.local(self.path), "rb") as file:
            file.seek(start)
            return file.read(end - start)


class StandIn(AbstractFileSystem):
    """A store whose buckets are the folders of `root` (a class attribute, set by `stand_in`)."""

    protocol = ("standin",)
    root_marker = ""
    root: Path
    faults: dict[tuple[str, str], Exception]  # (path, "open" or "read") -> the error raised there
    fetches: list[tuple[str, int, int]]  # every range fetched: (path, start, end)

    def local(self, path: str) -> Path:
        return self.root / self._strip_protocol(path)

    def fault(self, path: str, when: str) -> None:
        error = self.faults.get((self._strip_protocol(path), when))
        if error is not None:
            raise error

    def info(self, path: str, **kwargs) -> dict:
        name, local = self._strip_protocol(path), self.local(path)
        if local.is_file():
            return {"name": name, "size": local.stat().st_size, "type": "file"}
        if local.is_dir():
            return {"name": name, "size": 0, "type": "directory"}
        raise FileNotFoundError(f"No such object: {name}")

    def ls(self, path: str, detail: bool = True, **kwargs) -> list:
        name, local = self._strip_protocol(path), self.local(path)
        if not local.is_dir():
            entries = [self.info(name)]
        else:
            entries = [self.info(f"{name}/{child.name}" if name else child.name) for child in sorted(local.iterdir())]
        return entries if detail else [entry["name"] for entry in entries]

    def _open(self, path: str, mode: str = "rb", block_size: int | None = None, **kwargs) -> StandInFile:
        if mode != "rb":
            raise PermissionError(f"the stand-in store is read-only: {path}")
        self.fault(path, "open")
        kwargs.pop("autocommit", None)
        return StandInFile(self, path, mode, block_size=block_size or BLOCK, **kwargs)


def stand_in(scheme: str, root: Path) -> type[StandIn]:
    """A stand-in store class for `scheme`, its buckets the folders of `root`, with faults and fetches of its own."""
    attributes = {"protocol": (scheme,), "root": root, "faults": {}, "fetches": []}
    return type(f"StandIn_{scheme}", (StandIn,), attributes)


def register(monkeypatch: pytest.MonkeyPatch, scheme: str, root: Path) -> type[StandIn]:
    """Register a stand-in for `scheme` in fsspec's registry (what `fsspec.register_implementation(scheme, cls,
    clobber=True)` does), undone with the test's monkeypatch: the real library comes back afterwards."""
    cls = stand_in(scheme, root)
    monkeypatch.setitem(_registry, scheme, cls)
    return cls
