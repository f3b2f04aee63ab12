"""s3:// shards read by the real s3fs client over HTTP from moto's S3 server in its own process: training
and evaluation from a bucket with the exact samples of a local run, the server killed and restarted
mid-shard, a server gone for good, and no credential in the run folder or the output.

The server and why it is a process of its own: tests/moto_server.py.
"""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path

import pytest

from project.data.samples import read_samples
from project.errors import ShardError

from .conftest import run_here, run_module
from .helpers import load_records, recorder
from .moto_server import BUCKET, KEY_ID, SECRET, SHARD, start_moto

s3fs = pytest.importorskip("s3fs")
pytest.importorskip("moto.server")


@pytest.fixture
def s3(tiny_demo, tmp_path, monkeypatch):
    """A moto server holding the tiny demo in BUCKET; the AWS variables point s3fs at it with planted keys."""
    server = start_moto(tiny_demo, tmp_path, monkeypatch)
    yield server
    server.kill()
    s3fs.S3FileSystem.clear_instance_cache()


def local_keys(tiny_demo: Path, shard: str = SHARD) -> list[str]:
    return [sample["__key__"] for sample in read_samples(str(tiny_demo / shard), extensions=frozenset())]


def test_a_server_restart_between_reads_of_a_shard_loses_no_sample(s3, tiny_demo):
    expected = local_keys(tiny_demo)
    samples = read_samples(f"s3://{BUCKET}/{SHARD}")
    keys = [next(samples)["__key__"] for _ in range(40)]
    s3.kill()
    s3.start()  # same port, same objects; the reader's pooled connections are dead
    before = s3.shard_reads()
    keys += [sample["__key__"] for sample in samples]
    assert keys == expected
    assert s3.shard_reads() > before  # the rest of the shard came from the new server


def test_a_server_down_while_a_shard_is_read_is_retried_until_it_is_back(s3, tiny_demo, monkeypatch):
    # botocore retries a refused connection (legacy mode: 4 retries, random exponential delays of 0-15 s
    # in all); 10 attempts make the window surely longer than a restart here, so the test is not a gamble
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "10")
    expected = local_keys(tiny_demo)
    samples = read_samples(f"s3://{BUCKET}/{SHARD}")
    keys = [next(samples)["__key__"] for _ in range(40)]
    s3.kill()
    before = s3.shard_reads()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        rest = pool.submit(lambda: [sample["__key__"] for sample in samples])  # reads on, meets no server
        time.sleep(1.0)
        assert not rest.done()
        s3.start()
        keys += rest.result(timeout=240)
    assert keys == expected
    assert s3.shard_reads() > before


def test_a_server_gone_for_good_stops_with_one_line_naming_the_shard(s3, monkeypatch):
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # no botocore retries: fail at once
    url = f"s3://{BUCKET}/{SHARD}"
    samples = read_samples(url)
    next(samples)
    s3.kill()
    with pytest.raises(ShardError) as reading:
        list(samples)
    with pytest.raises(ShardError) as opening:
        next(read_samples(f"s3://{BUCKET}/val/val-000001.tar"))
    for error, shard in ((reading.value, url), (opening.value, f"s3://{BUCKET}/val/val-000001.tar")):
        line = str(error)
        assert "\n" not in line and shard in line and "Could not connect to the endpoint URL" in line, line
        assert KEY_ID not in line and SECRET not in line


def train_args(root: str, records: Path) -> list[str]:
    return [
        *(f"--data.{split}={root}/{split}/shardindex.json" for split in ("train", "val", "test")),
        *("--data.image_size=16", "--data.batch_size=16", "--data.num_workers=2", "--trainer.max_epochs=1"),
        "--trainer.enable_progress_bar=false",
        recorder(records),
    ]


def batches(records: dict, stage: str) -> list[list[str]]:
    return [batch for epoch in sorted(records[stage], key=int) for batch in records[stage][epoch]]


@pytest.mark.slow
def test_training_from_a_bucket_sees_a_local_runs_samples_and_stores_no_credential(s3, tiny_demo, tmp_path):
    (tmp_path / "bucket").mkdir()
    # a user's command: its own process, the credentials and endpoint in its environment only
    remote = run_module("project.train", *train_args(f"s3://{BUCKET}", tmp_path / "records"), cwd=tmp_path / "bucket")
    assert remote.returncode == 0, remote.stderr[-3000:]
    (tmp_path / "local").mkdir()
    local = run_here("project.train", *train_args(str(tiny_demo), tmp_path / "local-records"), cwd=tmp_path / "local")
    assert local.returncode == 0, local.stderr[-3000:]
    records, expected = load_records(tmp_path / "records")[0], load_records(tmp_path / "local-records")[0]
    assert batches(records, "train") == batches(expected, "train")  # the same batches, in the same order
    for stage, split, count in (("val", "val", 130), ("test", "test", 150)):
        keys = [key for batch in batches(records, stage) for key in batch]
        assert len(keys) == len(set(keys)) == count  # every sample exactly once
        assert set(keys) == {k for n in range(2) for k in local_keys(tiny_demo, f"{split}/{split}-{n:06d}.tar")}
    files = [path for path in (tmp_path / "bucket" / "logs").rglob("*") if path.is_file()]
    assert any(p.suffix == ".ckpt" for p in files) and any("tfevents" in p.name for p in files)
    for path in files:  # as bytes: TensorBoard events and checkpoints are binary
        data = path.read_bytes()
        assert KEY_ID.encode() not in data and SECRET.encode() not in data, path
    for output in (remote.stdout, remote.stderr):
        assert KEY_ID not in output and SECRET not in output
