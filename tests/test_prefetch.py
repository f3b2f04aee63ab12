"""Remote shards fetched ahead of the reader (project/data/prefetch.py): the next shard's request goes out while
the current one is read; the samples, their order, resume and errors are those of reading without it; the
bytes held and the responses open stay bounded, and a pass that stops early leaves nothing running."""

from __future__ import annotations

import functools
import http.server
import io
import threading
import time
from pathlib import Path

import pytest
import torch

from project.data.prefetch import CHUNK, FETCHES, READ_AHEAD_BYTES, ShardOpener
from project.data.remote import open_url
from project.data.samples import read_samples
from project.data.shard_index import Shard
from project.data.specs import resolve_shards
from project.data.stream import ShardStream
from project.errors import ShardError, UserError

from .conftest import image_data, image_task
from .test_pipeline import epoch_batches, keys_of

EXTENSIONS = frozenset({"jpg", "cls"})


class DelayingHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files `delay` seconds after each request arrives (its arrival logged); `missing` paths are 404s."""

    delay: float
    missing: set[str]
    arrivals: dict[str, float]

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        self.arrivals.setdefault(self.path, time.monotonic())
        time.sleep(self.delay)
        if self.path in self.missing:
            self.send_error(404)
            return
        super().do_GET()


@pytest.fixture
def server(tmp_path):
    """(base url, handler class): set `handler.delay` and `handler.missing` before reading."""
    handler = type("Handler", (DelayingHandler,), {"delay": 0.0, "missing": set(), "arrivals": {}})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(tmp_path)))
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_port}", handler
    httpd.shutdown()


def read_all(urls: list[str], opener: ShardOpener, pause: float = 0.0) -> tuple[list[dict], dict[str, float]]:
    """Every sample of `urls` in order, as the stream reads a plan's segments, `pause` seconds a sample (a
    worker decoding it), and when each shard's last byte was consumed (its samples read, its stream closed)."""
    samples, done = [], {}
    for url in urls:
        for sample in read_samples(url, extensions=EXTENSIONS, open_stream=opener):
            samples.append(sample)
            time.sleep(pause)
        done[url] = time.monotonic()
    return samples, done


def test_the_next_shards_request_goes_out_before_the_current_shard_is_read(server, shard_folder):
    base, handler = server
    shard_folder([6, 6, 6, 6], name="val")
    urls = [f"{base}/val/val-{n:06d}.tar" for n in range(4)]
    handler.delay = 0.15  # each response waits, as a distant store's first byte does
    results = {}
    for budget in (READ_AHEAD_BYTES, 0):
        handler.arrivals = {}
        opener = ShardOpener(urls, open_url, budget)
        samples, done = read_all(urls, opener, pause=0.02)
        opener.close()
        arrivals = [handler.arrivals[f"/val/val-{n:06d}.tar"] for n in range(4)]
        results[budget] = samples, [arrivals[n + 1] < done[urls[n]] for n in range(3)]
    assert results[READ_AHEAD_BYTES][1] == [True, True, True]
    assert results[0][1] == [False, False, False]  # without it each request waits for the shard before
    assert results[READ_AHEAD_BYTES][0] == results[0][0]  # the same samples, bytes and order


@pytest.mark.parametrize(("stage", "mix_shards"), [("train", 1), ("train", 4), ("val", 1)])
def test_batches_and_resumed_batches_are_the_same_with_and_without_read_ahead(server, shard_folder, stage, mix_shards):
    base, handler = server
    handler.delay = 0.01
    shard_folder([13, 6, 9, 11], name="split")
    shards = resolve_shards(f"{base}/split/shardindex.json").shards
    epochs = {}
    cut = []  # segments that stop before their shard's end: their fetch is closed early
    for rank in (0, 1):
        for budget in (READ_AHEAD_BYTES, 3 * 4096, 0):  # 3 * 4096: less than a shard, a fetch holds a chunk
            stream = ShardStream(
                shards=shards,
                task=image_task(),
                stage=stage,
                batch_size=4,
                shuffle_buffer=10,
                seed=3,
                read_ahead_bytes=budget,
                mix_shards=mix_shards,  # 4: the four shards read side by side, a lane (and an opener) each
            )
            stream.set_topology(world_size=2, rank=rank)
            epochs[rank, budget] = epoch_batches(stream, num_workers=0, epoch=1)
            stream.resume_after(2)  # as a restored checkpoint does (the loader would start the epoch over)
            epochs[rank, budget, "resumed"] = list(stream)
        cut += [s for s in stream.plans()[0].segments if s.stop < shards[s.shard].nsamples]
        for budget in (READ_AHEAD_BYTES, 3 * 4096):
            assert keys_of(epochs[rank, budget]) == keys_of(epochs[rank, 0])
            assert all(
                torch.equal(a.image, b.image) for a, b in zip(epochs[rank, budget], epochs[rank, 0], strict=True)
            )
            assert keys_of(epochs[rank, budget, "resumed"]) == keys_of(epochs[rank, 0][2:])
    assert cut, "some segment should stop mid-shard"


def test_a_prefetched_shard_that_fails_to_open_is_reported_against_that_shard(server, shard_folder):
    base, handler = server
    _, keys = shard_folder([5, 5, 5], name="val")
    handler.missing = {"/val/val-000001.tar"}
    shards = resolve_shards(f"{base}/val/shardindex.json").shards
    broken = shards[1].url

    skipping = ShardStream(shards=shards, task=image_task(), stage="val", batch_size=10, skip_corrupt=True)
    batches = epoch_batches(skipping, num_workers=0)
    assert keys_of(batches) == keys[:5] + keys[10:]
    assert [skipped.url for batch in batches for skipped in batch.skipped] == [broken] * 5
    assert all("404" in skipped.reason for batch in batches for skipped in batch.skipped)

    errors = []
    for budget in (READ_AHEAD_BYTES, 0):
        stream = ShardStream(shards=shards, task=image_task(), stage="val", batch_size=5, read_ahead_bytes=budget)
        reader = iter(stream)
        assert next(reader).keys == keys[:5]  # the shard before is read whole, although the next one failed
        with pytest.raises(ShardError) as error:
            next(reader)
        errors.append(str(error.value))
    assert broken in errors[0] and "404" in errors[0]
    assert errors[0] == errors[1]  # the same line as without read-ahead


class Source(io.RawIOBase):
    """A shard's bytes as a remote stream would give them: it counts the streams open at once and the bytes
    handed out, and fails with `OSError` after `fail_after` bytes."""

    def __init__(self, data: bytes, counters: dict, fail_after: int | None = None) -> None:
        self.data, self.position, self.counters, self.fail_after = data, 0, counters, fail_after
        with counters["lock"]:
            counters["open"] += 1
            counters["most_open"] = max(counters["most_open"], counters["open"])

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.fail_after is not None and self.position >= self.fail_after:
            raise OSError("connection reset by peer")
        end = len(self.data) if self.fail_after is None else self.fail_after
        count = min(len(buffer), 64 << 10, end - self.position)
        buffer[:count] = self.data[self.position : self.position + count]
        self.position += count
        with self.counters["lock"]:
            self.counters["sent"] += count
        return count

    def close(self) -> None:
        if not self.closed:
            with self.counters["lock"]:
                self.counters["open"] -= 1
        super().close()


def fake_store(folder: Path, fail: dict[str, int] | None = None) -> tuple[list[str], dict, callable]:
    """http urls of `folder`'s shards, the counters, and an opener that serves them from memory."""
    files = {f"http://store.invalid/{path.name}": path.read_bytes() for path in sorted(folder.glob("*.tar"))}
    counters = {"lock": threading.Lock(), "open": 0, "most_open": 0, "sent": 0}
    fail = fail or {}

    def open_stream(url: str) -> io.BufferedReader:
        return io.BufferedReader(Source(files[url], counters, fail.get(url)))

    return list(files), counters, open_stream


def test_a_read_error_reaches_the_reader_after_the_bytes_before_it_naming_the_shard(shard_folder):
    folder, _ = shard_folder([8, 8, 8], name="val")
    urls, _, _ = fake_store(folder)
    outcomes = []
    for budget in (READ_AHEAD_BYTES, 0):
        _, _, open_stream = fake_store(folder, fail={urls[1]: 16000})  # shard 1 breaks in its fourth sample
        opener, keys = ShardOpener(urls, open_stream, budget), []
        with pytest.raises(ShardError) as error:
            for url in urls:
                keys.extend(
                    sample["__key__"] for sample in read_samples(url, extensions=EXTENSIONS, open_stream=opener)
                )
        opener.close()
        outcomes.append((keys, str(error.value)))
    (ahead, message), (direct, direct_message) = outcomes
    assert message == direct_message and urls[1] in message and "connection reset" in message
    # every sample whose bytes came before the error; reading directly may lose the last of them with the
    # bytes its BufferedReader held when the error came
    assert ahead == [f"val0_{i:05d}" for i in range(8)] + [f"val1_{i:05d}" for i in range(3)]
    assert ahead[: len(direct)] == direct and len(direct) >= 10


def test_the_bytes_held_and_the_responses_open_stay_bounded(tmp_path):
    from .conftest import write_shards

    write_shards(tmp_path / "big", [3, 3, 3, 3], extra_members={"bin": bytes(1 << 20)})  # about 3 MB a shard
    urls, counters, open_stream = fake_store(tmp_path / "big")
    budget = 2 << 20
    opener = ShardOpener(urls, open_stream, budget)

    def held() -> int:
        with opener.condition:
            return sum(ahead.buffered for ahead in opener.live)

    bound = 2 * budget + FETCHES * CHUNK
    stream = opener(urls[0])  # opened, not read: the fetches must stop at the budget
    time.sleep(0.3)
    assert held() <= bound and counters["sent"] <= bound + FETCHES * CHUNK
    assert counters["sent"] < 12 << 20  # not the whole set
    sizes, fetching = [], []
    while stream.read(256 << 10):
        sizes.append(held())
        fetching.append(opener.fetching)
        time.sleep(0.002)
    stream.close()
    for url in urls[1:]:
        with opener(url) as stream:
            while stream.read(256 << 10):
                sizes.append(held())
                fetching.append(opener.fetching)
    opener.close()
    assert max(sizes) <= bound and max(fetching) <= FETCHES
    assert counters["most_open"] <= FETCHES + 1  # and one closed by its reader, for the time of its last read


def test_a_pass_that_stops_early_leaves_no_fetch_running(shard_folder):
    folder, _ = shard_folder([8, 8, 8, 8], name="val")
    urls, counters, open_stream = fake_store(folder)
    opener = ShardOpener(urls, open_stream, READ_AHEAD_BYTES)
    samples = read_samples(urls[0], extensions=EXTENSIONS, open_stream=opener)
    next(samples)
    samples.close()  # the reader stops mid-shard, as a worker does at the end of its plan
    opener.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (
        counters["open"] or any(t.name == "shard-read-ahead" for t in threading.enumerate())
    ):
        time.sleep(0.01)
    assert counters["open"] == 0
    assert not [t for t in threading.enumerate() if t.name == "shard-read-ahead"]


def test_local_shards_are_opened_as_they_are_needed(shard_folder):
    folder, keys = shard_folder([4, 4], name="val")
    urls = [str(folder / f"val-{n:06d}.tar") for n in range(2)]
    opener = ShardOpener(urls, open_url, READ_AHEAD_BYTES)
    samples, _ = read_all(urls, opener)
    assert [s["__key__"] for s in samples] == keys and not opener.live


def test_a_shard_other_than_the_plans_next_is_a_bug():
    opener = ShardOpener(["http://store.invalid/a.tar"], open_url, READ_AHEAD_BYTES)
    with pytest.raises(RuntimeError, match="not the next shard"):
        opener("http://store.invalid/b.tar")


def test_the_data_module_hands_its_setting_to_its_streams_and_refuses_a_negative_one(shard_folder):
    folder, _ = shard_folder([4], name="val")
    assert (
        ShardStream(shards=[Shard("x.tar", 1)], task=image_task(), stage="val", batch_size=1).read_ahead_bytes
        == READ_AHEAD_BYTES
    )
    assert image_data(val=str(folder)).stream("val").read_ahead_bytes == READ_AHEAD_BYTES
    assert image_data(val=str(folder), read_ahead_mb=0).stream("val").read_ahead_bytes == 0
    with pytest.raises(UserError, match=r"^data.read_ahead_mb must be 0 or more, got -1$"):
        image_task(read_ahead_mb=-1)


def test_a_mixed_group_reads_its_remote_shards_side_by_side_within_the_read_ahead_budget(
    server, shard_folder, monkeypatch
):
    base, _ = server
    shard_folder([3, 3, 3, 3], name="split", extra_members={"bin": bytes(1 << 20)})  # about 3 MB a shard
    shards = resolve_shards(f"{base}/split/shardindex.json").shards
    budget = 2 << 20
    openers: list[ShardOpener] = []

    class Recorded(ShardOpener):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            openers.append(self)

    def held() -> int:
        return sum(ahead.buffered for opener in openers for ahead in list(opener.live))

    monkeypatch.setattr("project.data.reading.ShardOpener", Recorded)
    task = image_task()
    task.extensions = frozenset({"jpg", "cls", "bin"})  # the big members are read: the bytes held are real
    stream = ShardStream(
        shards=shards, task=task, stage="train", batch_size=2, shuffle_buffer=4, read_ahead_bytes=budget, mix_shards=4
    )
    peaks, keys = [], []
    for batch in stream:
        time.sleep(0.1)  # a worker decoding: the fetches run ahead meanwhile
        peaks.append(held())
        keys += batch.keys
    assert len(openers) == 4  # a lane per shard of the group, each with its share of the budget
    assert max(peaks) <= 2.5 * budget
    assert max(peaks) > 0  # it did read ahead
    plain = ShardStream(
        shards=shards, task=task, stage="train", batch_size=2, shuffle_buffer=4, read_ahead_bytes=0, mix_shards=4
    )
    assert keys == [key for batch in plain for key in batch.keys]


def test_a_mixed_groups_lanes_request_their_shards_together_not_one_after_another(server, shard_folder):
    base, handler = server
    shard_folder([8, 8, 8, 8], name="split")
    shards = resolve_shards(f"{base}/split/shardindex.json").shards
    handler.delay = 0.3  # a distant store's first byte
    handler.arrivals = {}
    stream = ShardStream(shards=shards, task=image_task(), stage="train", batch_size=4, shuffle_buffer=4, mix_shards=4)
    started = time.monotonic()
    next(iter(stream))  # the first batch needs a sample of every lane
    arrivals = sorted(time - started for path, time in handler.arrivals.items() if path.endswith(".tar"))
    assert len(arrivals) == 4
    assert arrivals[-1] - arrivals[0] < 0.2  # all requested at once: one after another would take 0.3 s each
