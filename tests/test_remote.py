"""Remote shards over HTTP from a server on 127.0.0.1: streaming, dropped connections resumed without
duplicating or losing samples, the size-bounded cache, and no shell for plain urls."""

from __future__ import annotations

import functools
import http.server
import json
import threading
from collections import Counter
from pathlib import Path

import pytest

from project.data.remote import cache_name, cached, open_url
from project.data.samples import read_samples
from project.data.specs import resolve_shards
from project.data.stream import ShardStream
from project.tasks.image.demo import make_demo

from .conftest import image_task, run_here
from .helpers import load_records
from .test_pipeline import epoch_batches, keys_of


class FlakyHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files with Range support; the first request for each .tar sends half its body, then hangs up."""

    cut: set[str]  # paths already cut once
    requests: list[tuple[str, str | None]]

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        path = Path(self.translate_path(self.path))
        if not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        header = self.headers.get("Range")
        self.requests.append((self.path, header))
        start = int(header.split("=")[1].rstrip("-")) if header else 0
        self.send_response(206 if header else 200)
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        body = data[start:]
        if self.path.endswith(".tar") and self.path not in self.cut:
            self.cut.add(self.path)
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)  # the connection drops mid-shard
            return
        self.wfile.write(body)


@pytest.fixture
def server(tmp_path):
    handler = type("Handler", (FlakyHandler,), {"cut": set(), "requests": []})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(tmp_path)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_port}", handler
    httpd.shutdown()


def test_a_dropped_connection_resumes_from_the_byte_it_reached(server, shard_folder):
    url, handler = server
    folder, keys = shard_folder([30], name="val")
    with open_url(f"{url}/val/val-000000.tar") as stream:
        assert stream.read() == (folder / "val-000000.tar").read_bytes()
    ranges = [header for path, header in handler.requests if path.endswith(".tar")]
    assert ranges[0] is None and ranges[1].startswith("bytes=") and len(ranges) == 2


@pytest.mark.parametrize("num_workers", [0, 2])
def test_streaming_through_dropped_connections_reads_every_sample_exactly_once(server, shard_folder, num_workers):
    url, handler = server
    folder, keys = shard_folder([12, 7, 9], name="val")
    index = resolve_shards(f"{url}/val/shardindex.json")
    stream = ShardStream(shards=index.shards, task=image_task(), stage="val", batch_size=5)
    seen = Counter(keys_of(epoch_batches(stream, num_workers)))
    assert set(seen) == set(keys) and set(seen.values()) == {1}
    assert len(handler.cut) == 3  # every shard's connection was cut once


def test_the_cache_keeps_copies_under_its_size_bound(server, shard_folder, tmp_path):
    url, _ = server
    folder, _ = shard_folder([20, 20, 20], name="val")
    size = (folder / "val-000000.tar").stat().st_size
    cache = tmp_path / "cache"
    for n in range(3):
        copy = cached(f"{url}/val/val-{n:06d}.tar", cache, max_bytes=int(2.5 * size))
        assert copy.read_bytes() == (folder / f"val-{n:06d}.tar").read_bytes()
    held = sorted(p.name for p in cache.iterdir())
    assert len(held) == 2 and cache_name(f"{url}/val/val-000002.tar") in held
    assert sum(p.stat().st_size for p in cache.iterdir()) <= 2.5 * size


def test_plain_urls_never_reach_a_shell(server, tmp_path):
    url, _ = server
    evidence = tmp_path / "shell-ran"
    with pytest.raises(Exception):  # noqa: B017 - only the absence of the file matters
        list(read_samples(f"{url}/x.tar;touch {evidence}"))
    with pytest.raises(Exception):  # noqa: B017
        list(read_samples(f"{url}/$(touch {evidence})"))
    assert not evidence.exists()


def test_an_explicit_pipe_url_runs_its_command(shard_folder):
    folder, keys = shard_folder([4], name="val")
    samples = list(read_samples(f"pipe:cat {folder / 'val-000000.tar'}"))
    assert [s["__key__"] for s in samples] == keys


@pytest.mark.slow
def test_training_from_a_flaky_http_server_sees_the_exact_samples(server, tmp_path):
    url, handler = server
    make_demo(tmp_path / "d", train=120, val=30, test=30, image_size=16, samples_per_shard=40, workers=1, quiet=True)
    recorder = {
        "class_path": "tests.helpers.RecordBatches",
        "init_args": {"folder": str(tmp_path / "records")},
    }
    args = [
        *(f"--data.{split}={url}/d/{split}/shardindex.json" for split in ("train", "val", "test")),
        *("--data.image_size=16", "--data.batch_size=16", "--data.num_workers=2", "--trainer.max_epochs=1"),
        "--trainer.enable_progress_bar=false",
        f"--trainer.callbacks+={json.dumps(recorder)}",
    ]
    result = run_here("project.train", *args, cwd=tmp_path / "d")
    assert result.returncode == 0, result.stderr[-3000:]
    records = load_records(tmp_path / "records")[0]
    train = [key for batch in records["train"]["0"] for key in batch]
    assert len(train) == len(set(train)) == 112  # 120 // 16 = 7 full batches
    val = [key for batch in records["val"]["0"] for key in batch]
    assert sorted(val) == [f"val-{i:08d}" for i in range(30)]
    assert len(handler.cut) == 3 + 1 + 1  # every shard's first connection dropped mid-shard
