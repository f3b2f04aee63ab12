"""Corrupt data: unreadable samples are skipped and counted exactly, warned about at a bounded rate,
and fatal past data.max_skipped_fraction."""

from __future__ import annotations

import io
import json
import logging
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from project.data.health import SkipCount, SkipLedger
from project.data.specs import resolve_shards
from project.data.stream import ShardStream
from project.errors import ShardError

from .conftest import image_task, run_here, write_shards
from .test_pipeline import epoch_batches


def truncate_inside(path: Path, member: str) -> None:
    """Cut a tar in the middle of one member's data, as an interrupted copy would."""
    with tarfile.open(path) as tar:
        info = tar.getmember(member)
    data = path.read_bytes()
    path.write_bytes(data[: info.offset_data + info.size // 2])


def replace_member(path: Path, member: str, data: bytes | None) -> None:
    """Rewrite a tar with one member's bytes replaced (or the member removed, for None)."""
    with tarfile.open(path) as tar:
        members = [(info, tar.extractfile(info).read()) for info in tar.getmembers()]
    with tarfile.open(path, "w") as tar:
        for info, content in members:
            if info.name == member:
                if data is None:
                    continue
                content, info.size = data, len(data)
            tar.addfile(info, io.BytesIO(content))


@pytest.fixture
def corrupt_split(tmp_path) -> tuple[Path, list[str], set[str]]:
    """4 shards of 10: one truncated inside sample 6's image, one bad JPEG, one sample without a label."""
    folder = tmp_path / "val"
    keys = write_shards(folder, [10, 10, 10, 10], prefix="val")
    truncate_inside(folder / "val-000000.tar", "val0_00006.jpg")
    replace_member(folder / "val-000001.tar", "val1_00003.jpg", b"\xff\xd8 not really a jpeg")
    replace_member(folder / "val-000002.tar", "val2_00005.cls", None)
    bad = {f"val0_{i:05d}" for i in range(6, 10)} | {"val1_00003", "val2_00005"}
    return folder, keys, bad


@pytest.mark.parametrize("num_workers", [0, 2])
def test_each_unreadable_sample_is_skipped_and_counted_once(corrupt_split, num_workers):
    folder, keys, bad = corrupt_split
    stream = ShardStream(
        shards=resolve_shards(str(folder)).shards, task=image_task(), stage="val", batch_size=4, skip_corrupt=True
    )
    batches = epoch_batches(stream, num_workers)
    seen = [key for batch in batches for key in batch.keys]
    skipped = [entry for batch in batches for entry in batch.skipped]
    assert sorted(seen) == sorted(set(keys) - bad)
    assert len(skipped) == len(bad) == 6
    reasons = " | ".join(reason for _, _, reason in skipped)
    assert "cannot read shard" in reasons and "cannot identify image" in reasons and "no label member" in reasons
    assert {"val1_00003", "val2_00005"} <= {key for _, key, _ in skipped}


def test_without_skipping_the_first_unreadable_sample_is_an_error(corrupt_split):
    folder, _, _ = corrupt_split
    stream = ShardStream(shards=resolve_shards(str(folder)).shards, task=image_task(), stage="val", batch_size=4)
    with pytest.raises(ShardError, match="val-000000.tar"):
        epoch_batches(stream, 0)


def test_warnings_are_rate_limited_and_name_the_shard_and_key(caplog):
    ledger = SkipLedger("train", epoch=0, planned=10_000, max_fraction=0.01, warn_every=60)
    with caplog.at_level(logging.WARNING, logger="project.data"):
        for i in range(5):
            ledger.record([("s3.tar", f"key{i}", "cannot identify image")])
    assert ledger.skipped == 5
    assert len(caplog.records) == 1
    assert "key0" in caplog.text and "s3.tar" in caplog.text


def test_too_many_skips_stop_the_epoch_naming_the_worst_shards():
    ledger = SkipLedger("train", epoch=0, planned=200, max_fraction=0.01)
    ledger.record([("good.tar", "a", "x")])
    ledger.record([("good.tar", "b", "x")])  # 2 of 200 = 1%: still allowed
    with pytest.raises(ShardError, match=r"3 of the 200 train samples .* worst shards: good.tar \(2\), bad.tar \(1\)"):
        ledger.record([("bad.tar", "c", "x")])


def test_the_skip_count_keeps_a_ledger_per_stage_and_pass_and_the_sanity_check_its_own():
    trainer = SimpleNamespace(
        training=True, validating=False, sanity_checking=False, predicting=False, current_epoch=0, world_size=2
    )
    asked: list[str] = []

    def samples(stage: str) -> int:
        asked.append(stage)
        return 400  # 200 a rank: 2 skips are 1%, a third is past it

    count = SkipCount(max_fraction=0.01)
    count.record([("a.tar", "k1", "x"), ("a.tar", "k2", "x")], trainer, samples)
    assert count.ledgers["train"].planned == 200 and count.ledgers["train"].skipped == 2
    trainer.current_epoch = 1  # a new pass: a new ledger, counting from 0
    count.record([("a.tar", "k3", "x")], trainer, samples)
    assert count.ledgers["train"].skipped == 1 and count.ledgers["train"].epoch == 1
    trainer.training, trainer.sanity_checking = False, True
    count.record([("v.tar", "k", "x")] * 2, trainer, samples)
    trainer.sanity_checking, trainer.validating = False, True  # the first validation reads those batches again
    count.record([("v.tar", "k", "x")] * 2, trainer, samples)
    assert count.ledgers["sanity"].skipped == count.ledgers["val"].skipped == 2 and asked == [
        "train",
        "train",
        "val",
        "val",
    ]
    with pytest.raises(ShardError, match="3 of the 200 val samples of this epoch are unreadable"):
        count.record([("v.tar", "k", "x")], trainer, samples)


def cli_args(folder: Path, *extra: str) -> list[str]:
    return [
        *(
            f"--data.train={folder}",
            f"--data.val={folder}",
            f"--data.test={folder}",
            "--data.classes=[a,b,c]",
        ),
        *("--data.image_size=8", "--data.batch_size=4", "--trainer.max_epochs=1"),
        "--trainer.enable_progress_bar=false",
        *extra,
    ]


def test_training_stops_with_a_clear_error_past_the_limit(corrupt_split, tmp_path):
    folder, _, _ = corrupt_split
    args = cli_args(folder, "--data.num_workers=0", "--trainer.num_sanity_val_steps=0")
    result = run_here("project.train", *args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    error = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1, result.stderr[-3000:]
    assert "of the 40 train samples of this epoch are unreadable, more than data.max_skipped_fraction=0.01" in error[0]
    assert "worst shards: " in error[0] and ".tar (" in error[0]


def test_evaluation_reports_how_many_samples_it_skipped(corrupt_split, tmp_path):
    folder, _, _ = corrupt_split
    args = cli_args(folder, "--data.num_workers=2", "--data.max_skipped_fraction=0.5")
    trained = run_here("project.train", *args, cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    ckpt = tmp_path / "logs" / "demo" / "version_0" / "checkpoints" / "last.ckpt"
    # the data and its bounds are the user's to give, never the run folder's
    evaluate = ("project.evaluate", f"--ckpt_path={ckpt}", f"--data.test={folder}", "--data.max_skipped_fraction=0.5")
    result = run_here(*evaluate, "--split=test", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads(result.stdout.strip().splitlines()[-1])
    assert metrics["test/skipped"] == 6
