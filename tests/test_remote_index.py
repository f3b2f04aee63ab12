"""Remote shards without an index, over http from a server on 127.0.0.1: `shards.index` on a brace pattern (each
shard read once, in parallel), a run stopped by a failing shard that goes on reading none of the finished ones,
and a data spec that is indexed once, cached, and read from the cache with no shard read; epochs stay exact."""

from __future__ import annotations

import functools
import http.server
import json
import shutil
import threading
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlsplit

import pytest

from project.data.index_cache import cached_index, cached_path
from project.data.journal import Journal
from project.data.samples import read_samples
from project.data.scanning import Scanned
from project.data.shard_index import Shard, read_index
from project.data.specs import resolve_shards
from project.data.stream import ShardStream
from project.errors import UserError
from project.shards.index import command
from project.tasks.image.data import ImageShards
from project.tasks.scan import LABELS

from .conftest import run_here
from .helpers import load_records, recorder
from .moto_server import BUCKET, start_moto
from .stores_standin import register
from .test_pipeline import epoch_batches, keys_of

DIGITS = [str(i) for i in range(10)]  # the demo's labels, as a scan records them


class Counting(http.server.SimpleHTTPRequestHandler):
    """Serves files; counts the GETs of each path, and answers 503 once to those in `fail_once`."""

    gets: Counter
    fail_once: set[str]

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        self.gets[path] += 1
        if path in self.fail_once:
            self.fail_once.discard(path)
            self.send_error(503)
            return
        super().do_GET()


@pytest.fixture
def served(tiny_demo, tmp_path, monkeypatch):
    """The tiny demo over http: (base url, handler); the user's cache folder in tmp_path."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    handler = type("Handler", (Counting,), {"gets": Counter(), "fail_once": set()})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(tiny_demo)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_port}", handler
    httpd.shutdown()


def shard_gets(handler, split: str = "train") -> dict[str, int]:
    return {Path(path).name: count for path, count in handler.gets.items() if path.endswith(".tar") and split in path}


def pattern(base: str, split: str = "train", last: int = 5) -> str:
    return f"{base}/{split}/{split}-{{000000..{last:06d}}}.tar"


def test_the_index_tool_reads_each_http_shard_once_and_records_its_counts_sizes_and_classes(
    served, tiny_demo, tmp_path, capsys
):
    base, handler = served
    command([pattern(base)], out=str(tmp_path / "index.json"), workers=3)
    index = read_index(str(tmp_path / "index.json"))
    local = read_index(str(tiny_demo / "train" / "shardindex.json"))
    assert [(s.nsamples, s.filesize) for s in index.shards] == [(s.nsamples, s.filesize) for s in local.shards]
    assert [s.url for s in index.shards] == [f"{base}/train/train-{n:06d}.tar" for n in range(6)]
    assert index.extra["classes"] == DIGITS
    assert set(shard_gets(handler).values()) == {1} and len(shard_gets(handler)) == 6
    assert "wrote" in capsys.readouterr().out and not (tmp_path / "index.json.journal").exists()


def test_an_http_folder_cannot_be_listed_and_says_what_to_give(served, tmp_path):
    base, _ = served
    with pytest.raises(UserError, match=r"http\(s\) has no listing; give a brace pattern") as raised:
        command([f"{base}/train/"], out=str(tmp_path / "index.json"))
    assert "\n" not in str(raised.value)


def test_a_stopped_run_goes_on_without_reading_a_finished_shard_again(served, tiny_demo, tmp_path, capsys):
    base, handler = served
    handler.fail_once.add("/train/train-000003.tar")
    out = tmp_path / "index.json"
    with pytest.raises(UserError, match=r"train-000003.tar.*run it again to go on") as raised:
        command([pattern(base)], out=str(out), workers=1)
    assert "\n" not in str(raised.value) and not out.exists()
    first = shard_gets(handler)
    assert first["train-000003.tar"] == 1 and all(first[f"train-{n:06d}.tar"] == 1 for n in range(3))
    command([pattern(base)], out=str(out), workers=2)
    again = shard_gets(handler)
    assert all(again[f"train-{n:06d}.tar"] == 1 for n in range(3))  # the finished ones: not read again
    assert again["train-000003.tar"] == 2 and again["train-000005.tar"] == 1
    assert "going on from" in capsys.readouterr().err and not (tmp_path / "index.json.journal").exists()
    assert read_index(str(out)).nsamples == 600


def test_a_spec_of_remote_shards_is_indexed_once_cached_and_read_with_exact_epochs(served, tiny_demo, tmp_path, capsys):
    base, handler = served
    index = resolve_shards(pattern(base), index_remote=lambda urls, sizes: cached_index(urls, LABELS, tmp_path))
    err = capsys.readouterr().err
    assert "indexed 6 remote shards, 600 samples, in " in err and str(tmp_path / "indexes") in err
    assert index.nsamples == 600 and index.extra["classes"] == DIGITS
    reads = sum(shard_gets(handler).values())
    again = resolve_shards(pattern(base), index_remote=lambda urls, sizes: cached_index(urls, LABELS, tmp_path))
    assert sum(shard_gets(handler).values()) == reads == 6  # the cache: no shard read
    assert again.shards == index.shards and capsys.readouterr().err == ""
    task = ImageShards(root=None, image_size=16, classes=DIGITS, num_workers=0).task
    stream = ShardStream(shards=index.shards, task=task, stage="val", batch_size=32)
    keys = keys_of(epoch_batches(stream, 0))
    expected = [s["__key__"] for n in range(6) for s in read_samples(str(tiny_demo / f"train/train-{n:06d}.tar"))]
    assert len(keys) == len(set(keys)) == 600 and set(keys) == set(expected)


def test_prepare_data_indexes_remote_splits_once_and_other_processes_read_the_cache(served, tmp_path):
    base, handler = served

    def data(**kwargs) -> ImageShards:
        splits = {"train": pattern(base), "val": pattern(base, "val", 1)}
        return ImageShards(root=None, image_size=16, cache_dir=str(tmp_path / "c"), num_workers=0, **splits, **kwargs)

    first = data()
    first.trainer = SimpleNamespace(state=SimpleNamespace(fn=SimpleNamespace(value="fit")))
    first.prepare_data()  # what Lightning runs on local rank 0
    reads = dict(handler.gets)
    assert len(shard_gets(handler)) == 6 and len(shard_gets(handler, "val")) == 2
    other = data()  # another rank: its own process, the same settings
    assert other.index("train").nsamples == 600 and other.index("val").nsamples == 130
    assert other.classes == DIGITS and dict(handler.gets) == reads


def test_a_store_folder_without_an_index_is_listed_one_level_indexed_once_and_cached(tiny_demo, tmp_path, monkeypatch):
    store = register(monkeypatch, "gs", tmp_path / "store")  # gs:// served from a local folder, in-process
    folder = tmp_path / "store" / "bucket" / "train"
    folder.mkdir(parents=True)
    for shard in sorted((tiny_demo / "train").glob("*.tar")):
        shutil.copy(shard, folder)
    (folder / "notes.txt").write_text("not a shard")
    (folder / "deeper").mkdir()
    shutil.copy(tiny_demo / "val" / "val-000000.tar", folder / "deeper")  # one level only
    data = ImageShards(root=None, train="gs://bucket/train/", image_size=16, num_workers=0, cache_dir=str(tmp_path))
    index = data.index("train")
    assert [s.url for s in index.shards] == [f"gs://bucket/train/train-{n:06d}.tar" for n in range(6)]
    assert index.nsamples == 600 and data.classes == DIGITS
    assert [s.filesize for s in index.shards] == [p.stat().st_size for p in sorted(folder.glob("*.tar"))]
    fetched = len(store.fetches)
    again = ImageShards(root=None, train="gs://bucket/train/", image_size=16, num_workers=0, cache_dir=str(tmp_path))
    assert again.index("train").shards == index.shards and len(store.fetches) == fetched  # the cache: no shard read


@pytest.mark.parametrize(
    ("write", "message"),
    [
        ("not json", "not JSON"),
        ('{"kind": "other"}\n', "not a journal of shards.index"),
        ("HEADER" + '{"url": "elsewhere.tar", "nsamples": 1, "filesize": 9, "labels": {}, "problems": []}\n', "shard"),
        (
            "HEADER" + '{"shard": 0, "url": "URL", "nsamples": -1, "filesize": 9, "labels": {}, "problems": []}\n',
            "integers",
        ),
        (
            "HEADER"
            + '{"shard": 0, "url": "URL", "nsamples": 1, "filesize": 9, "labels": {"a": "x"}, "problems": []}\n',
            "count",
        ),
        (
            "HEADER" + '{"shard": 0, "url": "URL", "nsamples": 1, "filesize": 9, "labels": {}, "problems": [1]}\n',
            "problem",
        ),
        (
            "HEADER" + '{"shard": 0, "url": "URL", "nsamples": 1, "filesize": 9, "labels": {}, "problems": []}\n' * 2,
            "more lines than shards",
        ),
    ],
)
def test_a_hostile_journal_is_one_line(tmp_path, write, message):
    url = "s3://bucket/a.tar"
    journal = Journal(tmp_path / "j.journal", [url], LABELS.name)
    journal.add(one_scanned(url))  # the header of this run
    header = (tmp_path / "j.journal").read_text().splitlines()[0] + "\n"
    (tmp_path / "j.journal").write_text(
        write.replace("HEADER", header).replace("URL", url) + "\n" * (not write.endswith("\n"))
    )
    with pytest.raises(UserError, match=message) as raised:
        Journal(tmp_path / "j.journal", [url], LABELS.name).finished()
    assert "\n" not in str(raised.value) and "remove it" in str(raised.value)


def one_scanned(url: str) -> Scanned:
    return Scanned(Shard(url, 3, 3000), Counter({"1": 3}), [])


def test_a_journal_cut_by_a_kill_or_of_other_shards_is_read_as_far_as_it_goes(tmp_path):
    urls = ["s3://bucket/a.tar", "s3://bucket/b.tar"]
    journal = Journal(tmp_path / "j.journal", urls, LABELS.name)
    journal.add(one_scanned(urls[0]))
    with open(tmp_path / "j.journal", "a") as stream:
        stream.write('{"url": "s3://bucket/b.tar", "nsa')  # the kill
    finished = Journal(tmp_path / "j.journal", urls, LABELS.name).finished()
    assert list(finished) == [urls[0]] and finished[urls[0]].labels == Counter({"1": 3})
    assert Journal(tmp_path / "j.journal", urls[:1], LABELS.name).finished() == {}  # another run's: started over


def test_a_cached_index_that_names_other_shards_or_is_no_index_is_one_line(tmp_path):
    urls = ["s3://bucket/a.tar", "s3://bucket/b.tar"]
    path = cached_path(urls, LABELS, tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"shardlist": [{"url": "s3://bucket/other.tar", "nsamples": 1}]}))
    with pytest.raises(UserError, match="is not of the shards it is named for: remove it"):
        cached_index(urls, LABELS, tmp_path)
    path.write_text(json.dumps({"shardlist": [{"url": "/etc/passwd", "nsamples": 1}]}))
    with pytest.raises(UserError):
        cached_index(urls, LABELS, tmp_path)
    path.write_text("[1, 2")
    with pytest.raises(UserError, match="not JSON"):
        cached_index(urls, LABELS, tmp_path)


@pytest.mark.slow
def test_training_on_http_shards_without_an_index_sees_every_sample_once_an_epoch(served, tmp_path):
    base, handler = served
    args = [
        f"--data.train={pattern(base)}",
        f"--data.val={pattern(base, 'val', 1)}",
        f"--data.test={pattern(base, 'test', 1)}",
        *("--data.image_size=16", "--data.batch_size=50", "--data.num_workers=2", "--trainer.max_epochs=2"),
        *("--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"),
        recorder(tmp_path / "records"),
    ]
    result = run_here("project.train", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "indexed 6 remote shards, 600 samples" in result.stderr
    records = load_records(tmp_path / "records")[0]
    for epoch in ("0", "1"):
        keys = [key for batch in records["train"][epoch] for key in batch]
        assert len(keys) == len(set(keys)) == 600
        val = [key for batch in records["val"][epoch] for key in batch]
        assert len(val) == len(set(val)) == 130


@pytest.mark.slow
def test_a_bucket_folder_is_listed_indexed_into_the_bucket_and_a_root_without_an_index_trains(
    tiny_demo, tmp_path, monkeypatch
):
    s3fs = pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    bucket = tmp_path / "bucket"
    for prefix, split in ((p, s) for p in ("raw", "ds") for s in ("train", "val", "test")):
        (bucket / prefix / split).mkdir(parents=True)
        for shard in (tiny_demo / split).glob("*.tar"):  # the shards, no index
            shutil.copy(shard, bucket / prefix / split)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    server = start_moto(bucket, tmp_path, monkeypatch)
    try:
        monkeypatch.chdir(tmp_path)
        command([f"s3://{BUCKET}/raw/train/"], out=f"s3://{BUCKET}/raw/train/shardindex.json", workers=4)
        assert not (tmp_path / "s3:").exists()  # a url is never a local folder
        text = s3fs.S3FileSystem().cat(f"{BUCKET}/raw/train/shardindex.json").decode()
        assert '"url": "train-000000.tar"' in text  # relative to the index, beside the shards
        index = resolve_shards(f"s3://{BUCKET}/raw/train/")  # the folder's index, read: nothing scanned
        assert index.nsamples == 600 and index.shards[0].url == f"s3://{BUCKET}/raw/train/train-000000.tar"
        assert not list((tmp_path / "user-cache").rglob("*.json*"))  # no cached index, no journal left
        args = [
            f"--data.root=s3://{BUCKET}/ds",  # workers 0: the session's forkserver has none of the AWS variables
            *("--data.image_size=16", "--data.batch_size=50", "--data.num_workers=0", "--trainer.max_epochs=1"),
            *("--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"),
            recorder(tmp_path / "records"),
        ]
        result = run_here("project.train", *args, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "indexed 6 remote shards, 600 samples" in result.stderr
        records = load_records(tmp_path / "records")[0]
        train = [key for batch in records["train"]["0"] for key in batch]
        assert len(train) == len(set(train)) == 600
        test = [key for batches in records["test"].values() for batch in batches for key in batch]
        assert len(test) == len(set(test)) == 150
    finally:
        server.kill()
        s3fs.S3FileSystem.clear_instance_cache()
