"""data.max_member_bytes: a tar member whose header declares more bytes is refused before it is read, its
sample skipped and counted with the reason; a header declaring gigabytes over a short file costs only the
bytes that exist."""

from __future__ import annotations

import functools
import gzip
import io
import tarfile
import tracemalloc
from pathlib import Path

import pytest

from project.data.samples import REFUSED, read_samples
from project.data.shard_index import Shard
from project.data.stream import ShardStream
from project.data.tarreader import tar_members
from project.errors import ShardError, UserError
from tests.conftest import image_data, image_task, jpeg

EIGHT_GIB = 8 << 30


def member(name: str, data: bytes, declared: int | None = None, kind: bytes = tarfile.REGTYPE) -> bytes:
    """One member's header (GNU format: base-256 sizes for 8 GiB and more) and its padded data."""
    info = tarfile.TarInfo(name)
    info.size, info.type = len(data) if declared is None else declared, kind
    header = info.tobuf(format=tarfile.GNU_FORMAT)
    return header + data + bytes(-len(data) % 512)


def shard(tmp_path: Path, members: list[bytes], name: str = "s.tar", gzipped: bool = False) -> str:
    data = b"".join(members) + bytes(1024)
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if gzipped else data)
    return str(path)


def labelled(key: str, image: bytes) -> list[bytes]:
    return [member(f"{key}.jpg", image), member(f"{key}.cls", b"1")]


@pytest.mark.parametrize("gzipped", [False, True])
def test_an_oversized_member_is_skipped_with_its_reason_and_the_rest_is_read(tmp_path, gzipped):
    big = jpeg(200, size=64) + bytes(5000)  # a valid JPEG followed by padding: 5 kB and more
    url = shard(tmp_path, [*labelled("a", jpeg(10)), *labelled("b", big), *labelled("c", jpeg(30))], gzipped=gzipped)
    samples = list(read_samples(url, max_member_bytes=4096))
    assert [s["__key__"] for s in samples] == ["a", "b", "c"]
    assert "jpg" not in samples[1] and "over data.max_member_bytes (4,096)" in samples[1][REFUSED]
    assert REFUSED not in samples[0] and samples[2]["jpg"] == jpeg(30)

    stream = ShardStream(
        shards=[Shard(url, 3)], task=image_task(), stage="val", batch_size=3, skip_corrupt=True, max_member_bytes=4096
    )
    (batch,) = list(stream)
    assert batch.keys == ["a", "c"]
    (skipped,) = batch.skipped
    assert skipped.key == "b" and "b.jpg declares" in skipped.reason and "data.max_member_bytes" in skipped.reason


def test_without_skipping_an_oversized_member_stops_with_one_line_naming_the_shard(tmp_path):
    url = shard(tmp_path, [*labelled("a", jpeg(10) + bytes(5000))])
    stream = ShardStream(shards=[Shard(url, 1)], task=image_task(), stage="val", batch_size=1, max_member_bytes=4096)
    with pytest.raises(ShardError, match=rf"sample 'a' in shard {url}: member a.jpg declares") as error:
        list(stream)
    assert "\n" not in str(error.value)


def test_a_header_declaring_eight_gib_refuses_the_member_and_allocates_nothing(tmp_path):
    url = shard(tmp_path, [*labelled("a", jpeg(10)), member("b.jpg", b"x" * 1000, declared=EIGHT_GIB)])
    tracemalloc.start()
    try:
        samples = []
        with pytest.raises(ShardError, match="unexpected end of data"):  # the 8 GiB the header promised are not there
            for sample in read_samples(url):
                samples.append(sample)
        _, refused_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        with pytest.raises(ShardError, match="unexpected end of data"):  # no bound: read, in chunks, what exists
            list(read_samples(url, max_member_bytes=None))
        _, unbounded_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [s["__key__"] for s in samples] == ["a"]  # b is cut off with its shard, as any truncation
    assert refused_peak < 4 << 20 and unbounded_peak < 64 << 20, (refused_peak, unbounded_peak)


@pytest.mark.parametrize("kind", [tarfile.GNUTYPE_LONGNAME, tarfile.XHDTYPE])
def test_a_long_name_or_pax_header_of_gigabytes_is_a_read_error(kind):
    data = member("././@LongLink", b"n" * 600, declared=EIGHT_GIB, kind=kind) + member("a.jpg", b"x")
    with pytest.raises(tarfile.ReadError, match="long-name or pax header of 8,589,934,592 bytes"):
        list(tar_members(io.BytesIO(data)))


def test_the_bound_is_a_checked_data_setting():
    with pytest.raises(UserError, match="data.max_member_bytes must be positive, got 0"):
        image_task(max_member_bytes=0)
    assert image_data().max_member_bytes == 1 << 29


def test_inspect_and_the_index_tool_name_an_oversized_member_without_reading_it(tmp_path, monkeypatch):
    from project.data.specs import resolve_shards
    from project.shards import index, inspect
    from project.tasks import scan

    big = jpeg(20) + bytes(5000)
    url = shard(tmp_path, [*labelled("a", jpeg(10)), *labelled("b", big)])
    bounded = functools.partial(read_samples, max_member_bytes=4096)  # the tools use the default bound
    monkeypatch.setattr(scan, "read_samples", bounded)  # the index tool's scan
    monkeypatch.setattr(inspect, "read_samples", bounded)
    reason = f"member b.jpg declares {len(big):,} bytes, over data.max_member_bytes (4,096)"
    summary, _ = inspect.summarize(resolve_shards(url), 0)
    assert summary["unreadable"] == [f"b: {reason}"]
    assert index.scan_shard(url).problems == [f"b: {reason}"]
