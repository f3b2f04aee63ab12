"""End to end through the command line, as a user runs it: train, evaluate, print_config, help, errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from .conftest import REPO, run_here, run_module, small_run
from .test_run_folders import record_run_config

pytestmark = pytest.mark.slow


def assert_user_error(result, *fragments: str) -> None:
    """Exit code 2, one line on stderr that names the problem, no traceback."""
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1, lines[-5:]
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


def test_fast_dev_run(tiny_demo, tmp_path):
    result = run_here("project.train", *small_run(tiny_demo, "--trainer.fast_dev_run=true"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "test/acc" in result.stdout


def test_a_short_run_writes_its_run_folder_and_evaluate_reproduces_its_test_metric(tiny_demo, tmp_path):
    args = small_run(tiny_demo, "--trainer.max_epochs=2", "--trainer.limit_train_batches=5")
    result = run_here("project.train", *args, "--trainer.logger.init_args.name=short", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "logs" / "short" / "version_0"
    assert {p.name for p in (run / "checkpoints").iterdir()} == {"best.ckpt", "last.ckpt"}
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["data"]["init_args"]["root"] == str(tiny_demo)
    assert "num_classes" not in config["model"]["init_args"]  # linked from the data, not configured
    hparams = torch.load(run / "checkpoints" / "best.ckpt", weights_only=True)["hyper_parameters"]
    assert hparams["num_classes"] == 10 and hparams["class_names"][0] == "circle"
    events = EventAccumulator(str(run))
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert {"train/loss", "train/acc", "val/loss", "val/acc", "test/loss", "test/acc"} <= scalars
    assert len(events.Scalars("val/acc")) == 2  # one per epoch
    test_acc = events.Scalars("test/acc")[-1].value
    assert f"run folder: logs{Path('/')}short{Path('/')}version_0" in result.stdout + result.stderr

    ckpt = run / "checkpoints" / "best.ckpt"
    # the model comes from the run folder; the data, from the user's flags
    evaluated = run_here(
        "project.evaluate",
        f"--ckpt_path={ckpt}",
        f"--data.root={tiny_demo}",
        "--split=test",
        "--trainer.enable_progress_bar=false",
        cwd=tmp_path,
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    metrics = json.loads(evaluated.stdout.strip().splitlines()[-1])
    assert metrics["test/acc"] == pytest.approx(test_acc, abs=1e-6)
    assert not (tmp_path / "logs" / "short" / "version_1").exists(), "evaluate made a new run folder"
    unsaid = run_here("project.evaluate", f"--ckpt_path={ckpt}", cwd=tmp_path)
    assert_user_error(unsaid, f"read its data from data.root='{tiny_demo}'", "give yours with --data.root")

    # a stranger's run folder whose config.yaml asks for a model larger than any machine: one line, no traceback
    config["model"]["init_args"]["backbone"]["init_args"]["width"] = 10**11
    record_run_config(ckpt, yaml.safe_dump(config))
    huge = run_here("project.evaluate", f"--ckpt_path={ckpt}", f"--data.root={tiny_demo}", cwd=tmp_path)
    assert_user_error(huge, "ran out of memory", "GB in one piece", "model.backbone.width=100000000000")


def test_a_size_setting_that_asks_for_more_memory_than_there_is_is_one_line(tiny_demo, tmp_path):
    result = run_here("project.train", *small_run(tiny_demo, "--model.backbone.width=100000000000"), cwd=tmp_path)
    assert_user_error(result, "building the model and data ran out of memory", "model.backbone.width=100000000000")


def test_training_builds_the_missing_demo_data_first(tmp_path):
    args = ["--trainer.fast_dev_run=true", "--trainer.enable_progress_bar=false", "--data.num_workers=0"]
    result = run_here("project.train", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "demo data not found in data/demo: building it" in result.stderr
    for split in ("train", "val", "test"):
        assert (tmp_path / "data" / "demo" / split / "shardindex.json").exists()


def test_print_config_shows_the_resolved_defaults_from_any_directory(tmp_path):
    result = run_here("project.train", "--print_config", "--data.batch_size=7", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    config = yaml.safe_load(result.stdout)
    assert config["data"]["class_path"] == "project.tasks.image.ImageShards"
    assert config["data"]["init_args"]["batch_size"] == 7 and config["data"]["init_args"]["root"] == "data/demo"
    backbone = config["model"]["init_args"]["backbone"]
    assert backbone == {
        "class_path": "project.tasks.image.backbones.SmallCNN",
        "init_args": {"width": 16, "weights": None},
    }
    assert config["trainer"]["logger"]["init_args"]["save_dir"] == "logs"


def test_help_documents_options_from_docstrings():
    result = run_here("project.train", "--help", cwd=REPO)
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "encoded training samples held in the shuffle buffer" in text
    assert "peak learning rate" in text
    assert "--ckpt_path" in text


def test_data_path_matching_no_shards(tmp_path):
    result = run_module("project.train", "--data.root=nowhere", cwd=tmp_path)
    assert_user_error(result, "data path not found", "nowhere")


def test_index_naming_a_missing_shard(tiny_demo, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(tiny_demo, root)
    (root / "val" / "val-000001.tar").unlink()
    result = run_here("project.train", *small_run(root), cwd=tmp_path)
    assert_user_error(result, "names a missing shard", "val-000001.tar")


def test_unreadable_shard_in_a_worker(tiny_demo, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(tiny_demo, root)
    (root / "val" / "val-000000.tar").write_bytes(b"\x00garbage" * 2000)
    # a subprocess: after a worker's error, torch shuts its workers down slowly (20 s) when the iterator is
    # garbage-collected in a longer-lived process; a run that ends with the error exits at once
    result = run_module("project.train", *small_run(root, "--data.num_workers=2"), cwd=tmp_path)
    assert_user_error(result, "cannot read shard", "val-000000.tar")


def test_misspelled_config_key(tmp_path):
    result = run_here("project.train", "--model.widht=3", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "widht" in result.stderr


def test_evaluate_needs_an_existing_checkpoint(tmp_path):
    assert_user_error(run_here("project.evaluate", cwd=tmp_path), "--ckpt_path is required")
    result = run_here("project.evaluate", "--ckpt_path=missing.ckpt", cwd=tmp_path)
    assert_user_error(result, "checkpoint not found: missing.ckpt")
    # one parser: the checkpoint named in a --config file is the one, as a flag's is
    (tmp_path / "evaluate.yaml").write_text("ckpt_path: other.ckpt\nsplit: val\n")
    result = run_here("project.evaluate", "--config=evaluate.yaml", cwd=tmp_path)
    assert_user_error(result, "checkpoint not found: other.ckpt")
    assert_user_error(run_here("project.predict", "--ckpt_path=missing.ckpt", cwd=tmp_path), "checkpoint not found")
    help_shown = run_here("project.evaluate", "--help", cwd=tmp_path)  # no checkpoint needed for the help
    assert help_shown.returncode == 0 and "--split" in help_shown.stdout


def test_a_bad_data_setting_stops_before_the_demo_is_built(tmp_path):
    result = run_here("project.train", "--data.batch_size=0", cwd=tmp_path)
    assert_user_error(result, "data.batch_size must be positive, got 0")
    assert not (tmp_path / "data").exists(), "the demo was built before the settings were checked"


def test_checkpointing_can_be_turned_off_from_the_command_line(tiny_demo, tmp_path):
    args = small_run(
        tiny_demo,
        "--trainer.enable_checkpointing=false",
        "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=2",
        "--trainer.limit_val_batches=1",
    )
    result = run_here("project.train", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "checkpointing off" in result.stderr and "test/acc" in result.stdout
    assert not list(tmp_path.rglob("*.ckpt"))
