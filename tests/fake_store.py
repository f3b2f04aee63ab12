"""An object store in this process under the `s3` scheme (fsspec's memory filesystem with a store of its own), for
fast tests of what the tools write to a url: every put in order, and a put that fails after a count, as a store's
library fails (an error of its own, no OSError). The slow tests use moto's real S3 server (tests/moto_server.py)."""

from __future__ import annotations

import pytest
from fsspec.implementations.memory import MemoryFileSystem
from fsspec.registry import _registry


class StoreDown(Exception):  # noqa: N818 - named as botocore names its errors (EndpointConnectionError)
    """What a store's library raises when it cannot be reached: not an OSError."""


class FakeBucket(MemoryFileSystem):
    """`s3://bucket/key` in memory; `puts` lists the keys put, in order; the put after `fail_after` puts fails."""

    protocol = ("s3", "s3a")
    store: dict = {}  # noqa: RUF012 - fsspec's memory filesystem keeps its files in class attributes
    pseudo_dirs: list = [""]  # noqa: RUF012
    puts: list[str] = []  # noqa: RUF012
    fail_after: int | None = None

    @classmethod
    def _strip_protocol(cls, path):
        text = str(path)
        for prefix in ("s3://", "s3a://"):
            text = text.removeprefix(prefix)
        return super()._strip_protocol(text)

    def put_file(self, lpath, rpath, *args, **kwargs):
        if self.fail_after is not None and len(self.puts) >= self.fail_after:
            raise StoreDown(f"could not connect to the endpoint for {rpath}")
        super().put_file(lpath, rpath, *args, **kwargs)
        type(self).puts.append(self._strip_protocol(rpath).lstrip("/"))

    @classmethod
    def objects(cls) -> set[str]:
        return {path.lstrip("/") for path in cls.store}

    @classmethod
    def read(cls, key: str) -> bytes:
        return bytes(cls.store["/" + key].getvalue())


def install(monkeypatch: pytest.MonkeyPatch) -> type[FakeBucket]:
    """FakeBucket as fsspec's `s3` filesystem for the test (monkeypatch takes it back), empty, with no failure
    planned. Each test module's fixture calls it: a fixture imported from here would be an unused import."""
    monkeypatch.setitem(_registry, "s3", FakeBucket)
    FakeBucket.store, FakeBucket.pseudo_dirs, FakeBucket.puts, FakeBucket.fail_after = {}, [""], [], None
    FakeBucket.clear_instance_cache()
    return FakeBucket
