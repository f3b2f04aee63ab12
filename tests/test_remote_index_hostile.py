"""Remote shards without an index, attacked: secrets in the urls (never in a journal, a cached index or a line), a
journal or cached index planted by a stranger (never trusted for its counts), two runs indexing the same shards at
once (each shard read once), a run killed by SIGKILL (goes on), a local `_info.json` whose counts its files cannot
hold, and a shard whose bytes change after it was indexed (the epoch stays exact, the loss counted)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from braceexpand import braceexpand

from project.data.index_cache import cached_index, cached_path
from project.data.journal import Journal
from project.data.scanning import Scanned
from project.data.shard_index import Shard, read_index, write_index
from project.data.specs import resolve_shards
from project.data.stream import ShardStream
from project.errors import UserError
from project.shards.index import command
from project.shards.index_out import journal_path
from project.tasks.image.data import ImageShards
from project.tasks.scan import LABELS, label_indexer

from . import test_remote_index
from .test_hub_layout import DIGITS, make_hub
from .test_pipeline import epoch_batches, keys_of
from .test_remote_index import pattern, shard_gets

SECRET = "s3cr3tSIGNATUREvalue"
served = test_remote_index.served  # the tiny demo over http, the user's cache folder in tmp_path


def signed(base: str) -> str:
    """The served pattern with a password and a signature in its url."""
    return pattern(base.replace("http://", f"http://reader:{SECRET}pw@")) + f"?sig={SECRET}"


def test_no_secret_reaches_the_journal_the_cached_index_or_a_line(served, tmp_path, capsys):
    base, handler = served
    urls = list(braceexpand(signed(base)))
    handler.fail_once.add("/train/train-000003.tar")
    with pytest.raises(UserError) as raised:
        cached_index(urls, LABELS, tmp_path, workers=1)
    journals = list((tmp_path / "indexes").glob("*.journal"))
    assert len(journals) == 1 and journals[0].read_text().count("\n") >= 4  # its first line, 3 shards or more
    assert SECRET not in journals[0].read_text() and SECRET not in str(raised.value)
    index = cached_index(urls, LABELS, tmp_path, workers=1)
    assert index.nsamples == 600 and [s.url for s in index.shards] == urls  # the real urls
    cached = list((tmp_path / "indexes").glob("*.json"))
    assert len(cached) == 1 and SECRET not in cached[0].read_text() and SECRET not in cached[0].name
    again = cached_index(urls, LABELS, tmp_path)
    assert again.shards == index.shards
    assert SECRET not in capsys.readouterr().err


def test_the_index_tool_keeps_no_secret_in_its_journal_or_its_problems(served, tmp_path, capsys):
    base, handler = served
    handler.fail_once.add("/train/train-000002.tar")
    out = tmp_path / "index.json"
    with pytest.raises(UserError):
        command([signed(base)], out=str(out), workers=1)
    assert SECRET not in journal_path(str(out)).read_text()
    command([signed(base)], out=str(out), workers=1)
    assert read_index(str(out)).nsamples == 600 and SECRET not in capsys.readouterr().err


def as_stranger(monkeypatch, tmp_path: Path) -> None:
    """What follows runs as another user: their own cache folder (and key)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "stranger-cache"))


def test_a_journal_planted_beside_the_index_is_not_trusted_for_its_counts(served, tmp_path, monkeypatch):
    base, handler = served
    out = tmp_path / "handed-over" / "shardindex.json"
    out.parent.mkdir()
    urls = [f"{base}/train/train-{n:06d}.tar" for n in range(6)]
    user_cache = os.environ["XDG_CACHE_HOME"]
    as_stranger(monkeypatch, tmp_path)
    planted = Journal(journal_path(str(out)), urls, label_indexer(True).name)
    for url in urls[:5]:
        planted.add(Scanned(Shard(url, 999_999, 1_000_000), Counter({"7": 999_999}), []))
    monkeypatch.setenv("XDG_CACHE_HOME", user_cache)
    command([pattern(base)], out=str(out), workers=2)
    index = read_index(str(out))
    assert [s.nsamples for s in index.shards] == [100] * 6 and len(shard_gets(handler)) == 6  # each one read


def test_a_cached_index_planted_in_a_shared_cache_folder_is_not_read(served, tmp_path, monkeypatch):
    base, handler = served
    shared = tmp_path / "shared-cache"
    urls = [f"{base}/train/train-{n:06d}.tar" for n in range(6)]
    user_cache = os.environ["XDG_CACHE_HOME"]
    as_stranger(monkeypatch, tmp_path)
    write_index(cached_path(urls, LABELS, shared), [Shard(url, 999_999) for url in urls], name="cached")
    monkeypatch.setenv("XDG_CACHE_HOME", user_cache)
    index = cached_index(urls, LABELS, shared)
    assert index.nsamples == 600 and len(shard_gets(handler)) == 6


def test_two_runs_indexing_the_same_shards_at_once_read_each_shard_once(served, tmp_path, monkeypatch):
    base, handler = served
    urls = [f"{base}/train/train-{n:06d}.tar" for n in range(6)]
    slow = handler.do_GET

    def do_get(self) -> None:
        time.sleep(0.05)  # both runs under way at once
        slow(self)

    monkeypatch.setattr(handler, "do_GET", do_get)
    results, errors = [], []

    def run() -> None:
        try:
            results.append(cached_index(urls, LABELS, tmp_path, workers=1))
        except Exception as error:  # noqa: BLE001 - the test reports it
            errors.append(error)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors and len(results) == 2 and results[0].shards == results[1].shards
    assert results[0].nsamples == 600 and set(shard_gets(handler).values()) == {1}


def test_two_index_tools_writing_the_same_index_at_once_both_finish(served, tmp_path, monkeypatch):
    base, handler = served
    slow = handler.do_GET
    monkeypatch.setattr(handler, "do_GET", lambda self: (time.sleep(0.05), slow(self)))
    out = tmp_path / "index.json"
    errors = []

    def run() -> None:
        try:
            command([pattern(base)], out=str(out), workers=1)
        except BaseException as error:  # noqa: BLE001 - the test reports it
            errors.append(error)

    threads = [threading.Thread(target=run) for _ in range(2)]
    threads[0].start()
    journal, deadline = journal_path(str(out)), time.monotonic() + 30
    while time.monotonic() < deadline and not (journal.exists() and journal.read_text().count("\n") >= 3):
        time.sleep(0.01)
    threads[1].start()  # the first one under way, its journal begun
    for thread in threads:
        thread.join(60)
    assert not errors and read_index(str(out)).nsamples == 600


@pytest.mark.slow
def test_an_index_run_killed_by_sigkill_goes_on_without_reading_finished_shards(served, tmp_path):
    base, handler = served
    held, release = "/train/train-000003.tar", threading.Event()
    slow = handler.do_GET

    def do_get(self) -> None:
        if self.path == held and not release.is_set():
            release.wait(60)  # the fourth shard hangs until the run is killed
        slow(self)

    handler.do_GET = do_get
    out = tmp_path / "index.json"
    env = dict(os.environ)
    process = subprocess.Popen(  # noqa: S603 - this interpreter, the project's module
        [sys.executable, "-m", "project.shards.index", pattern(base), f"--out={out}", "--workers=1"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    journal = journal_path(str(out))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (journal.exists() and journal.read_text().count("\n") == 4):
        time.sleep(0.1)
    process.send_signal(signal.SIGKILL)
    process.wait(30)
    release.set()
    assert journal.read_text().count("\n") == 4 and not out.exists()
    command([pattern(base)], out=str(out), workers=2)
    gets = shard_gets(handler)
    assert all(gets[f"train-{n:06d}.tar"] == 1 for n in (0, 1, 2, 4, 5)) and gets["train-000003.tar"] == 2
    assert read_index(str(out)).nsamples == 600 and not journal.exists()


@pytest.mark.parametrize(("length", "message"), [(2**31, "cannot hold"), (None, "not there")])
def test_a_local_info_whose_files_cannot_hold_its_counts_is_one_line(tiny_demo, tmp_path, length, message):
    hub = tmp_path / "hub"
    info = make_hub(tiny_demo, hub)
    split = info["splits"]["train"]
    if length is None:
        (hub / split["filenames"][0]).unlink()
    else:
        split["shard_lengths"][0], split["num_samples"] = length, length + sum(split["shard_lengths"][1:])
    (hub / "_info.json").write_text(json.dumps(info))
    with pytest.raises(UserError, match=message) as raised:
        ImageShards(root=str(hub), image_size=16, classes=DIGITS, num_workers=0).index("train")
    assert "\n" not in str(raised.value) and "_info.json" in str(raised.value)


def keep_first(shard: Path, samples: int) -> None:
    """Rewrite a shard with its first `samples` samples only (its bytes changed after indexing)."""
    with tarfile.open(shard) as source:
        members = [(member, source.extractfile(member).read()) for member in source.getmembers()]
    keys = list(dict.fromkeys(member.name.split(".")[0] for member, _ in members))[:samples]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as target:
        for member, data in members:
            if member.name.split(".")[0] in keys:
                target.addfile(member, io.BytesIO(data))
    shard.write_bytes(buffer.getvalue())


def test_a_shard_that_shrank_after_indexing_keeps_the_epoch_exact_and_counts_the_loss(served, tiny_demo, tmp_path):
    base, _ = served
    index = resolve_shards(pattern(base), index_remote=lambda urls, sizes: cached_index(urls, LABELS, tmp_path))
    shard = tiny_demo / "train" / "train-000002.tar"
    original = shard.read_bytes()  # the demo is shared by other tests: put back
    keep_first(shard, 40)
    try:
        task = ImageShards(root=None, image_size=16, classes=DIGITS, num_workers=0).task
        stream = ShardStream(shards=index.shards, task=task, stage="val", batch_size=100, skip_corrupt=True)
        batches = epoch_batches(stream, 0)
        skipped = [s for batch in batches for s in batch.skipped]
        assert len(keys_of(batches)) == 540 and len(skipped) == 60  # 600 places, the lost ones counted
    finally:
        shard.write_bytes(original)
