"""`prepare --out URL`: the dataset written to an object store, shards first and each split's index last, an
interrupted upload continued, the settings check and what is read back from the bucket bounded. Fast tests use an
in-process store under the s3 scheme (tests/fake_store.py); the slow ones moto's S3 server in its own process,
read back with the project's own readers and trained on."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from project.data.samples import read_samples
from project.data.specs import resolve_shards
from project.errors import UserError
from project.shards.prepare import prepare
from project.shards.publish import LEDGER, Remote, staging_folder

from .conftest import run_here
from .fake_store import FakeBucket, install
from .moto_server import BUCKET, KEY_ID, SECRET, start_moto
from .test_prepare import image_bytes


@pytest.fixture
def fake_s3(monkeypatch) -> type[FakeBucket]:
    """An in-process store as fsspec's s3 filesystem (tests/fake_store.py)."""
    return install(monkeypatch)


OPTIONS = dict(samples_per_shard=3, workers=1, quiet=True, val_fraction=0.2, test_fraction=0.2)


@pytest.fixture
def source(tmp_path, monkeypatch) -> Path:
    """An image folder of 3 classes x 8 images (8 shards of 3 with OPTIONS); the cache in the test's folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for label, name in enumerate(("cat", "dog", "eel")):
        for i in range(8):
            path = tmp_path / "images" / name / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(image_bytes(100 * label + i))
    return tmp_path / "images"


def local_files(folder: Path) -> dict[str, bytes]:
    """A local prepare's files, as the bucket should hold them (the hash cache stays in the staging folder)."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def bucket_files(bucket, prefix: str) -> dict[str, bytes]:
    return {key.removeprefix(prefix): bucket.read(key) for key in bucket.objects() if key.startswith(prefix)}


def test_prepare_out_url_uploads_every_shard_before_any_index(source, tmp_path, fake_s3):
    result = prepare(str(source), out="s3://bucket/ds", **OPTIONS)
    prepare(str(source), out=tmp_path / "local", **OPTIONS)
    expected = {k: v for k, v in local_files(tmp_path / "local").items() if k != ".dedup-hashes.npz"}
    assert bucket_files(fake_s3, "bucket/ds/") == expected  # the same bytes as a local run's, indexes included
    puts = [key.removeprefix("bucket/ds/") for key in fake_s3.puts]
    shards = [i for i, key in enumerate(puts) if key.endswith(".tar")]
    indexes = [i for i, key in enumerate(puts) if key.endswith("shardindex.json")]
    assert puts[0] == ".prepare.json"  # the settings, before any shard: checked by every later run
    assert len(shards) == len([key for key in expected if key.endswith(".tar")]) == 8, puts
    assert len(indexes) == 3 and max(shards) < min(indexes), puts
    assert sum(s.nsamples for shards in result.shards.values() for s in shards) == 24
    staging = staging_folder("s3://bucket/ds")
    assert staging.is_relative_to(tmp_path / "cache") and not list(staging.rglob("*.tar")), "staged shards kept"
    assert len((staging / LEDGER).read_text().splitlines()) == 8
    assert not [p for p in tmp_path.rglob("*") if ":" in p.name]


def test_an_interrupted_upload_continues_without_uploading_shards_in_the_bucket_again(source, tmp_path, fake_s3):
    fake_s3.fail_after = 6  # the manifest and 5 shards, then the store is unreachable
    args = [str(source), "--out=s3://bucket/ds", "--samples_per_shard=3", "--workers=2", "--quiet=true"]
    args += ["--val_fraction=0.2", "--test_fraction=0.2"]
    failed = run_here("project.shards.prepare", *args, cwd=tmp_path)
    assert failed.returncode == 2 and len(failed.stderr.splitlines()) == 1, failed.stderr
    assert "cannot upload to s3://bucket/ds/" in failed.stderr and "StoreDown" in failed.stderr
    first = {key for key in fake_s3.objects() if key.endswith(".tar")}
    assert len(first) == 5 and not [key for key in fake_s3.objects() if "shardindex" in key], (
        "an index before its shards"
    )
    damaged = sorted(first)[0]
    fake_s3.store["/" + damaged].truncate(100)  # a shard in the bucket at the wrong size is uploaded again
    fake_s3.fail_after, fake_s3.puts = None, []
    again = run_here("project.shards.prepare", *args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    uploaded = {key for key in fake_s3.puts if key.endswith(".tar")}
    assert uploaded == ({key for key in fake_s3.objects() if key.endswith(".tar")} - first) | {damaged}
    prepare(str(source), out=tmp_path / "local", **OPTIONS)
    expected = {k: v for k, v in local_files(tmp_path / "local").items() if k != ".dedup-hashes.npz"}
    assert bucket_files(fake_s3, "bucket/ds/") == expected


def test_other_settings_into_the_same_url_are_refused_from_any_staging_folder(source, tmp_path, fake_s3):
    prepare(str(source), out="s3://bucket/ds", **OPTIONS)
    args = [str(source), "--out=s3://bucket/ds", "--samples_per_shard=3", "--val_fraction=0.2", "--test_fraction=0.2"]
    args += ["--seed=5", f"--staging={tmp_path / 'new'}"]
    result = run_here("project.shards.prepare", *args, cwd=tmp_path)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert "error: s3://bucket/ds holds a prepare run with other settings (seed): use another --out" in result.stderr


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        (b"[" * 200_000, "is not a prepare manifest"),  # nested past the recursion limit
        (b"{" + b" " * (2 << 20) + b"}", "is not a prepare manifest (2,097,154 bytes)"),  # past the bound: unread
        (b"\xff\xfe not json", "is not a prepare manifest"),
        (b"[1, 2]", "s3://bucket/ds/.prepare.json is not a prepare manifest"),
    ],
)
def test_a_strangers_manifest_in_the_bucket_is_one_line(source, tmp_path, fake_s3, manifest, message):
    fake_s3().pipe_file("s3://bucket/ds/.prepare.json", manifest)
    result = run_here("project.shards.prepare", str(source), "--out=s3://bucket/ds", "--quiet=true", cwd=tmp_path)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr[-2000:]
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not [key for key in fake_s3.objects() if key.endswith(".tar")]


def test_parts_into_a_url_upload_their_shards_and_part_indexes(source, tmp_path, fake_s3):
    """Each part on its own machine (its own staging folder): the parts meet in the bucket's .parts/."""
    for stage, parts in (("hash", [0, 1]), ("match", [0]), ("write", [0, 1])):
        for part in parts:
            staging = tmp_path / f"staging-{part}-{stage}"  # nothing shared but the bucket
            prepare(str(source), out="s3://bucket/parts", part=(part, 2), stage=stage, staging=staging, **OPTIONS)
    prepare(str(source), out=tmp_path / "whole", **OPTIONS)
    for split in ("train", "val", "test"):
        keys = []
        for part in range(2):
            key = f"bucket/parts/{split}/shardindex.part-{part}-of-2.json"
            if key in fake_s3.objects():
                for entry in json.loads(fake_s3.read(key))["shardlist"]:
                    shard = fake_s3.read(f"bucket/parts/{split}/{entry['url']}")
                    samples = read_samples(entry["url"], open_stream=lambda url, data=shard: io.BytesIO(data))
                    keys += [sample["__key__"] for sample in samples]
        whole = [s["__key__"] for p in (tmp_path / "whole" / split).glob("*.tar") for s in read_samples(str(p))]
        assert sorted(keys) == sorted(whole)  # disjoint, and together the whole split
        assert f"bucket/parts/{split}/shardindex.json" not in fake_s3.objects()  # shards.index merges the parts


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--out=http://host/ds"], "--out: prepare writes a local folder or an object store url (s3://, gs://, az://"),
        (["--out=pipe:cat > x"], "--out: prepare writes a local folder or an object store url"),
        (["--out={tmp}/out", "--staging={tmp}/s"], "--staging is for an --out url: a local --out is written directly"),
        (["--out=s3://bucket/ds", "--staging=s3://bucket/s"], "--staging: prepare stages its shards in a local folder"),
        (["--out=nosuchscheme://bucket/ds"], "cannot open nosuchscheme://bucket/ds"),
    ],
)
def test_an_output_prepare_cannot_write_is_one_line_before_any_work(source, tmp_path, fake_s3, arguments, message):
    given = [arg.replace("{tmp}", str(tmp_path)) for arg in arguments]
    result = run_here("project.shards.prepare", str(source), *given, cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.startswith(f"error: {message}"), result.stderr
    assert len(result.stderr.splitlines()) == 1 and not fake_s3.objects() and not (tmp_path / "cache").exists()
    assert not [p for p in tmp_path.rglob("*") if ":" in p.name]


def test_urls_are_redacted_in_every_line(source, tmp_path, fake_s3):
    token = "AbCdEfGhIjKlMnOpQrStUv0123"  # a token-like path segment
    args = [str(source), f"--out=s3://bucket/{token}/ds", "--workers=1", "--samples_per_shard=3"]
    result = run_here("project.shards.prepare", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert token not in result.stdout + result.stderr
    assert "staging s3://bucket/***/ds in " in result.stderr and "wrote s3://bucket/***/ds: " in result.stdout
    assert f"bucket/{token}/ds/train/shardindex.json" in fake_s3.objects()


@pytest.fixture
def moto(tmp_path, monkeypatch):
    """moto's S3 server in its own process with an empty bucket (tests/moto_server.py)."""
    s3fs = pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    (tmp_path / "empty").mkdir()
    server = start_moto(tmp_path / "empty", tmp_path, monkeypatch)
    yield server
    server.kill()
    s3fs.S3FileSystem.clear_instance_cache()


def puts_in_log(log: str) -> list[str]:
    """The keys moto's log shows PUT, in order (`"PUT /bucket/key HTTP/1.1" 200`)."""
    return re.findall(rf'"PUT /{BUCKET}/(\S+) HTTP/[\d.]+" 200', log)


def samples_of(index_url: str) -> list[tuple]:
    """(key, members) of every sample, read through the project's own readers (over s3 for a bucket's index)."""
    found = []
    for shard in resolve_shards(index_url).shards:
        for sample in read_samples(shard.url):
            sample.pop("__url__", None)  # the shard's own url: a path here, the bucket's there
            found.append(tuple(sorted(sample.items())))
    return found


@pytest.mark.slow
def test_prepare_into_s3_continues_after_an_interruption_reads_back_and_trains(source, tmp_path, monkeypatch, moto):
    url = f"s3://{BUCKET}/ds"
    calls, put = [], Remote.put

    def interrupted(self, local):
        if len(calls) == 4:  # the manifest and 3 shards are in the bucket
            raise UserError("interrupted")
        calls.append(local)
        put(self, local)

    monkeypatch.setattr(Remote, "put", interrupted)
    with pytest.raises(UserError, match="interrupted"):
        prepare(str(source), out=url, **OPTIONS)
    monkeypatch.setattr(Remote, "put", put)
    import boto3

    client = boto3.client("s3")  # the endpoint and keys from start_moto's environment
    listed = [item["Key"] for item in client.list_objects_v2(Bucket=BUCKET, Prefix="ds/").get("Contents", [])]
    first = sorted(key for key in listed if key.endswith(".tar"))
    assert len(first) == 3 and not [key for key in listed if "shardindex" in key]
    before = len(moto.log.read_text(errors="replace"))
    prepare(str(source), out=url, **OPTIONS)
    log = moto.log.read_text(errors="replace")
    again = [key for key in puts_in_log(log[before:]) if key.endswith(".tar")]
    assert not set(again) & set(first) and len(again) == 8 - 3, again  # none uploaded twice
    every = puts_in_log(log)
    shards = [i for i, key in enumerate(every) if key.endswith(".tar")]
    indexes = [i for i, key in enumerate(every) if key.endswith("shardindex.json")]
    assert len(indexes) == 3 and max(shards) < min(indexes), every  # each index after every shard
    listed = [item["Key"] for item in client.list_objects_v2(Bucket=BUCKET, Prefix="ds/")["Contents"]]
    assert sum(key.endswith(".tar") for key in listed) == 8
    prepare(str(source), out=tmp_path / "local", **OPTIONS)
    for split in ("train", "val", "test"):  # the same samples, read over s3, as a local run's with the same seed
        local = samples_of(str(tmp_path / "local" / split / "shardindex.json"))
        assert samples_of(f"{url}/{split}/shardindex.json") == local and local
    args = ["--data.image_size=16", "--data.batch_size=4", "--data.num_workers=0", "--trainer.max_epochs=1"]
    args += ["--trainer.enable_progress_bar=false", "--trainer.enable_checkpointing=false"]
    result = run_here("project.train", f"--data.root={url}", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "test/acc" in result.stdout
    assert KEY_ID not in result.stdout + result.stderr and SECRET not in result.stdout + result.stderr
