"""A shard index is a stranger's input: it never runs a command, names only storage, and its counts are checked
against its files before anything is planned from them (docs/DESIGN.md, "Threat model")."""

from __future__ import annotations

import functools
import http.server
import json
import threading
import tracemalloc
from pathlib import Path

import pytest

from project.data import shard_index as shards_module
from project.data.plan import eval_plan, train_plan
from project.data.shard_index import INDEX_NAME, MAX_SHARD_SAMPLES, Shard, read_index, write_index
from project.data.specs import resolve_shards
from project.errors import UserError
from project.tasks.labels import MAX_CLASSES, index_classes

from .conftest import CLASSES, run_here, write_shards


def hostile_index(folder: Path, url: str, nsamples: int = 4, **extra: object) -> Path:
    """`folder`/shardindex.json listing the folder's real shard, then an entry with `url`."""
    real = sorted(folder.glob("*.tar"))[0]
    entries = [{"url": real.name, "nsamples": 4, "filesize": real.stat().st_size}, {"url": url, "nsamples": nsamples}]
    index = {"__kind__": "wids-shard-index-v1", "wids_version": 1, "shardlist": entries, "classes": CLASSES, **extra}
    path = folder / INDEX_NAME
    path.write_text(json.dumps(index))
    return path


@pytest.fixture
def served(tmp_path):
    """An http server for tmp_path/served: (folder, base url)."""
    folder = tmp_path / "served"
    folder.mkdir()
    handler = functools.partial(QuietHandler, directory=str(folder))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield folder, f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def test_an_index_that_lists_a_command_is_refused_on_every_path_that_reads_one(tmp_path, served):
    marker = tmp_path / "MARKER"
    data = tmp_path / "data"
    for split in ("train", "val", "test"):
        write_shards(data / split, [4], prefix=split)
        hostile_index(data / split, f"pipe:touch {marker}; cat /dev/null")
    part = tmp_path / "part.json"
    part.write_text(
        (data / "train" / INDEX_NAME).read_text().replace('"train-000000.tar"', f'"{data}/train/train-000000.tar"')
    )
    index = str(data / "train" / INDEX_NAME)
    runs = {
        "inspect": ("project.shards.inspect", index),
        "index": ("project.shards.index", str(part), "--out", str(tmp_path / "new" / INDEX_NAME)),
        "prepare": ("project.shards.prepare", str(data / "train"), "--out", str(tmp_path / "re"), "--workers", "1"),
        "train": ("project.train", f"--data.root={data}", "--trainer.max_epochs=1", "--data.num_workers=0"),
        "active": (
            "project.active",
            "--pool",
            str(data / "train"),
            "--labeled",
            str(tmp_path / "labeled"),
            "--budget",
            "1",
            "--rounds",
            "1",
        ),
    }
    for name, (module, *args) in runs.items():
        result = run_here(module, *args, cwd=tmp_path)
        assert result.returncode == 2, (name, result.stderr[-2000:])
        (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert "shell command (pipe:)" in line and "entry 1" in line, (name, line)
        assert not marker.exists(), name
    assert not (tmp_path / "new" / INDEX_NAME).exists()
    # the same index fetched over http
    folder, base = served
    write_shards(folder / "train", [4], prefix="train")
    hostile_index(folder / "train", f"pipe:touch {marker}")
    with pytest.raises(UserError, match=r"entry 1 .*shell command"):
        resolve_shards(f"{base}/train/{INDEX_NAME}")
    assert not marker.exists()


def test_a_pipe_read_index_cannot_turn_a_relative_entry_into_a_command(tmp_path):
    marker = tmp_path / "MARKER"
    write_shards(tmp_path / "d", [4], prefix="d")
    hostile_index(tmp_path / "d", f"x.tar; touch {marker}")
    # the user's own pipe: reads the index; joined to it, the relative entry would be a command of the stranger's
    with pytest.raises(UserError, match="shell command"):
        resolve_shards(f"pipe:curl -s file://{tmp_path / 'd' / INDEX_NAME}")
    with pytest.raises(UserError, match="local file"):  # no "://" to join under: a bare relative path
        resolve_shards(f"pipe:cat {tmp_path / 'd' / INDEX_NAME}")
    assert not marker.exists()


def test_the_index_writer_refuses_to_write_a_command(tmp_path):
    with pytest.raises(UserError, match="refusing to write a shell command"):
        write_index(tmp_path / INDEX_NAME, [Shard("a.tar", 1), Shard("pipe:curl -u me:secret https://h/b.tar", 1)])
    assert not (tmp_path / INDEX_NAME).exists()


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ("/etc/passwd", "local file, which a remote index may not name"),
        ("file:///etc/passwd", "local file, which a remote index may not name"),
        ("simplecache::https://example.com/a.tar", "chains fsspec filesystems"),
        ("ftp://example.com/a.tar", "scheme ftp:"),
        ("memory://a.tar", "scheme memory:"),
    ],
)
def test_a_remote_index_names_only_storage(served, entry, problem):
    folder, base = served
    write_shards(folder / "train", [4], prefix="train")
    hostile_index(folder / "train", entry)
    with pytest.raises(UserError, match=problem) as error:
        read_index(f"{base}/train/{INDEX_NAME}")
    assert "\n" not in str(error.value)


BAD_ENTRIES = {
    "negative count": ({"url": "train-000000.tar", "nsamples": -1}, "'nsamples' must be an integer"),
    "true as a count": ({"url": "train-000000.tar", "nsamples": True}, "'nsamples' must be an integer"),
    "a string count": ({"url": "train-000000.tar", "nsamples": "10"}, "'nsamples' must be an integer"),
    "a float count": ({"url": "train-000000.tar", "nsamples": 1e12}, "'nsamples' must be an integer"),
    "a count past the cap": ({"url": "train-000000.tar", "nsamples": MAX_SHARD_SAMPLES + 1}, "must be an integer"),
    "a count its file cannot hold": ({"url": "train-000000.tar", "nsamples": 10**9}, "more than its .* bytes can"),
    "more samples than declared bytes": ({"url": "https://h/a.tar", "nsamples": 900, "filesize": 800}, "cannot fit"),
    "a negative size": ({"url": "train-000000.tar", "nsamples": 1, "filesize": -5}, "'filesize' must be"),
    "a list as an entry": (["train-000000.tar", 4], "expected an object"),
    "a number as the url": ({"url": 123, "nsamples": 4}, "'url' must be 1 to"),
    "an empty url": ({"url": "", "nsamples": 4}, "'url' must be 1 to"),
    "a url of a megabyte": ({"url": "a" * (1 << 20), "nsamples": 4}, "'url' must be 1 to"),
}


@pytest.mark.parametrize("case", sorted(BAD_ENTRIES))
def test_each_bad_entry_is_one_line_naming_it(tmp_path, case):
    entry, problem = BAD_ENTRIES[case]
    write_shards(tmp_path, [4], prefix="train", index=False)
    path = tmp_path / INDEX_NAME
    path.write_text(json.dumps({"shardlist": [entry]}))
    with pytest.raises(UserError, match=problem) as error:
        resolve_shards(str(tmp_path))
    assert "\n" not in str(error.value) and "entry 0" in str(error.value) or "holds" in str(error.value)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[" * 100_000 + "]" * 100_000, "not JSON"),
        ('{"shardlist": ' + "[" * 50_000 + "]" * 50_000 + "}", "not JSON"),
        ("\xff\xfe not utf-8", "not JSON"),
        ('{"shardlist": {"url": "a.tar"}}', "a 'shardlist' list"),
        ("[1, 2, 3]", "a 'shardlist' list"),
    ],
)
def test_an_index_that_is_no_index_is_one_line(tmp_path, text, problem):
    (tmp_path / INDEX_NAME).write_bytes(text.encode("utf-8", "surrogateescape") if text[0] != "\xff" else b"\xff\xfe")
    with pytest.raises(UserError, match=problem) as error:
        read_index(str(tmp_path / INDEX_NAME))
    assert "\n" not in str(error.value)


def test_an_index_larger_than_the_bound_is_refused_unread(tmp_path, monkeypatch):
    monkeypatch.setattr(shards_module, "MAX_INDEX_BYTES", 1000)
    write_shards(tmp_path, [4], prefix="train", index=False)
    entries = [{"url": "train-000000.tar", "nsamples": 4}] * 100
    (tmp_path / INDEX_NAME).write_text(json.dumps({"shardlist": entries}))
    with pytest.raises(UserError, match="larger than 1,000 bytes"):
        read_index(str(tmp_path / INDEX_NAME))


def test_a_huge_declared_split_is_planned_without_memory():
    """The plans keep batch sizes as counts, not lists: an index declaring 2**32 samples a shard (what a remote
    index without sizes may say) is planned in a few kilobytes."""
    counts = [MAX_SHARD_SAMPLES] * 64
    tracemalloc.start()
    try:
        evaluation = eval_plan(counts, world_size=2, rank=1, num_workers=3, batch_size=1)
        training = train_plan(counts, epoch=0, seed=0, world_size=2, rank=0, num_workers=3, batch_size=7)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
    assert sum(plan.batch_sizes.total for plan in evaluation) == sum(counts) // 2
    assert sum(plan.nsamples for plan in evaluation) == sum(counts) // 2
    assert all(plan.batch_sizes.total == plan.nsamples for plan in training)
    first = evaluation[0].batch_sizes
    assert list(first[:3]) == [first[0]] * 3 and first[-1] == first[len(first) - 1]


def test_class_names_and_the_tokenizer_file_are_bounded(tmp_path):
    write_shards(tmp_path / "train", [4], prefix="train", index=False)
    shard = tmp_path / "train" / "train-000000.tar"
    write_index(
        tmp_path / "train" / INDEX_NAME,
        [Shard(str(shard), 4)],
        extra={"classes": [f"c{i}" for i in range(MAX_CLASSES + 1)]},
    )
    with pytest.raises(UserError, match="more than 100,000"):
        index_classes(read_index(str(tmp_path / "train" / INDEX_NAME)))
    from project.tasks.text.data import TextShards

    extra = {"classes": CLASSES, "tokenizer": {"file": "../../../etc/passwd", "sha256": "0" * 64}}
    write_index(tmp_path / "train" / INDEX_NAME, [Shard(str(shard), 4)], extra=extra)
    data = TextShards(root=str(tmp_path), num_workers=0)
    with pytest.raises(UserError, match="expected a file name beside it"):
        data.tokenizer_path  # noqa: B018
