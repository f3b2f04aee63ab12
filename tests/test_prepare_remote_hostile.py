"""`prepare --out URL` against a stranger who controls the bucket (its manifest, the objects at shard keys, a store
that fails), the staging folder (a planted report or link, a ledger of any size) or the arguments (urls that name
no folder, fsspec chains): each is one line, or a bucket whose every index names only shards it holds, as this run
wrote them. The bucket is an in-process store under the s3 scheme (tests/fake_store.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from project.errors import UserError
from project.shards import publish
from project.shards.prepare import prepare
from project.shards.publish import LEDGER, Remote

from .conftest import run_here
from .fake_store import FakeBucket, StoreDown, install
from .test_prepare import image_bytes

OPTIONS = dict(samples_per_shard=3, workers=1, quiet=True, val_fraction=0.2, test_fraction=0.2)
ARGS = ["--samples_per_shard=3", "--workers=1", "--quiet=true", "--val_fraction=0.2", "--test_fraction=0.2"]


@pytest.fixture
def fake_s3(monkeypatch) -> type[FakeBucket]:
    return install(monkeypatch)


@pytest.fixture
def source(tmp_path, monkeypatch) -> Path:
    """3 classes x 8 images (8 shards of 3 with OPTIONS); the user's cache in the test's folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for label, name in enumerate(("cat", "dog", "eel")):
        for i in range(8):
            path = tmp_path / "images" / name / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(image_bytes(100 * label + i))
    return tmp_path / "images"


def one_line(result, message: str) -> None:
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr[-2000:]
    assert message in result.stderr and "Traceback" not in result.stderr, result.stderr


def consistent(bucket: type[FakeBucket], prefix: str) -> None:
    """Every index in the bucket names only shards the bucket holds, at the size it records."""
    for key in bucket.objects():
        if key.startswith(prefix) and key.endswith("shardindex.json"):
            folder = key.rsplit("/", 1)[0]
            for entry in json.loads(bucket.read(key))["shardlist"]:
                shard = f"{folder}/{entry['url']}"
                assert shard in bucket.objects(), f"{key} names {shard}, which is missing"
                assert len(bucket.read(shard)) == entry["filesize"], f"{key} names {shard} at another size"


def test_a_report_or_link_planted_in_the_staging_folder_never_reaches_the_bucket(source, tmp_path, fake_s3):
    secret = tmp_path / "secret.txt"
    secret.write_text("the user's private key")
    staging = tmp_path / "staging"  # an earlier run's, then copied or shared
    prepare(str(source), out="s3://bucket/ds", staging=staging, dedup="off", **OPTIONS)
    fake_s3.store.clear()
    (staging / "duplicates.csv").symlink_to(secret)
    (staging / "duplicates.png").write_text("a stale sheet")
    (staging / "duplicates.anything").write_text("planted")
    prepare(str(source), out="s3://bucket/ds", staging=staging, dedup="off", **OPTIONS)
    uploaded = {key: fake_s3.read(key) for key in fake_s3.objects()}
    assert not [key for key in uploaded if "duplicates" in key], sorted(uploaded)
    assert not [key for key, data in uploaded.items() if b"private key" in data]
    consistent(fake_s3, "bucket/ds/")


def test_only_the_report_this_run_wrote_goes_up(source, tmp_path, fake_s3):
    staging = tmp_path / "staging"
    prepare(str(source), out="s3://bucket/ds", staging=staging, **OPTIONS)
    fake_s3.store.clear()
    (staging / "duplicates.png").write_text("a stale sheet from another run")
    prepare(str(source), out="s3://bucket/ds", staging=staging, **OPTIONS)  # no duplicates: the csv alone
    assert {key for key in fake_s3.objects() if "duplicates" in key} == {"bucket/ds/duplicates.csv"}


@pytest.mark.parametrize(
    ("out", "message"),
    [
        ("simplecache::s3://bucket/ds", "fsspec chains (::) are not read"),
        ("s3://", "--out: an object store url names a path"),
        ("s3:///", "--out: an object store url names a path"),
        ("s3://bucket/ds?versionId=1", "--out: an object store url names a path"),
        ("s3://bucket/ds#part", "--out: an object store url names a path"),
        ("s3://bucket/../ds", "--out: an object store url names a path"),
        ("s3://bucket/ds/.", "--out: an object store url names a path"),
        ("s3://bucket//ds", "--out: an object store url names a path"),
        ("memory://ds", "--out: prepare writes a local folder or an object store url"),
    ],
)
def test_an_out_url_that_names_no_folder_is_one_line_before_any_work(source, tmp_path, fake_s3, out, message):
    result = run_here("project.shards.prepare", str(source), f"--out={out}", *ARGS, cwd=tmp_path)
    one_line(result, message)
    assert not fake_s3.objects() and not (tmp_path / "cache").exists()
    assert not [p for p in tmp_path.rglob("*") if ":" in p.name]


def test_a_store_that_fails_to_look_up_the_manifest_overwrites_nothing(source, tmp_path, fake_s3, monkeypatch):
    theirs = {"seed": 5, "note": "another run's settings"}
    fake_s3().pipe_file("s3://bucket/ds/.prepare.json", json.dumps(theirs).encode())
    info = FakeBucket.info

    def flaky(self, path, **kwargs):
        if path.endswith(".prepare.json"):
            raise StoreDown("503 Slow Down")  # not a missing object: the manifest may well be there
        return info(self, path, **kwargs)

    monkeypatch.setattr(FakeBucket, "info", flaky)
    result = run_here("project.shards.prepare", str(source), "--out=s3://bucket/ds", *ARGS, cwd=tmp_path)
    one_line(result, "cannot look up s3://bucket/ds/.prepare.json")
    assert json.loads(fake_s3.read("bucket/ds/.prepare.json")) == theirs
    assert not [key for key in fake_s3.objects() if key.endswith(".tar")]


@pytest.mark.parametrize("change", ["manifest", "shard"])
def test_a_bucket_changed_by_another_run_during_this_one_gets_no_index(source, tmp_path, fake_s3, monkeypatch, change):
    """Two runs at once into one url both find no manifest: the later one's manifest (or its shard, at another
    size) replaces the earlier one's while it uploads. The earlier one must not publish an index over them."""
    put, calls = Remote.put, []

    def racing(self, local):
        put(self, local)
        calls.append(local)
        if len(calls) == 4:  # the manifest and 3 shards up: the other run writes
            if change == "manifest":
                fake_s3().pipe_file("s3://bucket/ds/.prepare.json", json.dumps({"seed": 5}).encode())
            else:
                first = next(key for key in fake_s3.puts if key.endswith(".tar"))
                fake_s3().pipe_file(f"s3://{first}", b"another run's shard")

    monkeypatch.setattr(Remote, "put", racing)
    with pytest.raises(UserError, match=r"s3://bucket/ds changed during this run"):
        prepare(str(source), out="s3://bucket/ds", **OPTIONS)
    assert not [key for key in fake_s3.objects() if "shardindex" in key]


def test_a_run_that_uploads_shards_again_takes_the_old_indexes_down_first(source, tmp_path, fake_s3, monkeypatch):
    """A finished dataset, then a run with the same settings from another machine (no ledger) whose source changed
    under the same path: its shards replace the old ones. Interrupted, it must leave no index naming them."""
    prepare(str(source), out="s3://bucket/ds", **OPTIONS)
    assert "bucket/ds/train/shardindex.json" in fake_s3.objects()
    for i in range(8):
        (source / "cat" / f"{i}.png").write_bytes(image_bytes(900 + i))
    fake_s3.puts.clear()
    put, calls = Remote.put, []

    def interrupted(self, local):
        if len(calls) == 2:
            raise UserError("interrupted")
        calls.append(local)
        put(self, local)

    monkeypatch.setattr(Remote, "put", interrupted)
    with pytest.raises(UserError, match="interrupted"):
        prepare(str(source), out="s3://bucket/ds", staging=tmp_path / "other-machine", **OPTIONS)
    replaced = {key for key in fake_s3.puts if key.endswith(".tar")}
    assert replaced, fake_s3.puts
    for key in fake_s3.objects():
        if key.endswith("shardindex.json"):
            folder = key.rsplit("/", 1)[0]
            named = {f"{folder}/{entry['url']}" for entry in json.loads(fake_s3.read(key))["shardlist"]}
            assert not named & replaced, f"{key} names shards replaced since it was written"
    monkeypatch.setattr(Remote, "put", put)
    prepare(str(source), out="s3://bucket/ds", staging=tmp_path / "other-machine", **OPTIONS)
    consistent(fake_s3, "bucket/ds/")


def test_a_ledger_past_its_bound_is_one_line(source, tmp_path, fake_s3, monkeypatch):
    staging = tmp_path / "staging"
    prepare(str(source), out="s3://bucket/ds", staging=staging, **OPTIONS)
    (staging / LEDGER).write_text('{"name": "train/train-000000.tar", "nsamples": 1, "filesize": 1}\n' * 100)
    monkeypatch.setattr(publish, "MAX_LEDGER_BYTES", 1000)
    with pytest.raises(UserError, match=r"is not a ledger of this run \(6,500 bytes\): remove it"):
        prepare(str(source), out="s3://bucket/ds", staging=staging, **OPTIONS)


def test_a_ledger_linked_out_of_the_staging_folder_is_refused(source, tmp_path, fake_s3):
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_text("")
    staging = tmp_path / "staging"
    staging.mkdir()
    (staging / LEDGER).symlink_to(elsewhere)
    with pytest.raises(UserError, match="is a link out of"):
        prepare(str(source), out="s3://bucket/ds", staging=staging, **OPTIONS)
    assert elsewhere.read_text() == "" and not fake_s3.objects()


def test_a_staging_that_is_a_file_is_one_line(source, tmp_path, fake_s3):
    (tmp_path / "staging").write_text("a file")
    result = run_here(
        "project.shards.prepare",
        str(source),
        "--out=s3://bucket/ds",
        f"--staging={tmp_path / 'staging'}",
        *ARGS,
        cwd=tmp_path,
    )
    one_line(result, "a file is in the way")
    assert not fake_s3.objects()


def test_a_staging_folder_that_holds_other_files_is_refused_and_left_as_it_was(source, tmp_path, fake_s3):
    """A folder of the user's shards named as --staging by mistake: taken for finished shards, they would be
    uploaded and removed."""
    staging = tmp_path / "mine"
    (staging / "train").mkdir(parents=True)
    (staging / "train" / "train-000000.tar").write_bytes(b"the user's own shard")
    with pytest.raises(UserError, match=r"^--staging .*mine holds files and no prepare manifest: name an empty"):
        prepare(str(source), out="s3://bucket/ds", staging=staging, **OPTIONS)
    assert (staging / "train" / "train-000000.tar").read_bytes() == b"the user's own shard"
    assert not fake_s3.objects()
