"""What a Lightning user knows works here: the template's callbacks stand in the config (seen, changed in one
line, removed), a user's own progress bar and callbacks compose with them, and CSV and MLflow loggers get the
hyperparameters, the `hp/` results and the pictures TensorBoard gets."""

from __future__ import annotations

import csv
import functools
from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint, TQDMProgressBar

from project.callbacks.template import SECTIONS
from project.callbacks.threads import ThreadPolicy
from project.cli import ProjectCLI

from .conftest import REPO, run_here

FAST = [
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=3",
    "--trainer.limit_val_batches=2",
    "--trainer.limit_test_batches=2",
    "--trainer.log_every_n_steps=1",
    "--data.image_size=16",
    "--data.num_workers=0",
    "--trainer.enable_progress_bar=false",
]


def trainer_of(tiny_demo: Path, *args: str):
    cli = ProjectCLI(args=[f"--data.root={tiny_demo}", "--trainer.logger=false", "--data.num_workers=0", *args])
    return cli.trainer


def test_print_config_shows_every_template_callback(tmp_path):
    result = run_here("project.train", "--print_config", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    config = yaml.safe_load(result.stdout)
    assert set(config["callbacks"]) == set(SECTIONS)
    assert config["callbacks"]["threads"]["class_path"] == "project.callbacks.threads.ThreadPolicy"
    assert config["callbacks"]["best_checkpoint"]["init_args"]["monitor"] == "val/acc"


def test_one_line_changes_one_callback_and_null_removes_one(tiny_demo):
    trainer = trainer_of(tiny_demo, "--callbacks.last_checkpoint.every_n_train_steps=7", "--callbacks.threads=null")
    last = [c for c in trainer.callbacks if isinstance(c, ModelCheckpoint) and c.filename == "last"]
    assert len(last) == 1 and last[0]._every_n_train_steps == 7
    assert not any(isinstance(c, ThreadPolicy) for c in trainer.callbacks)
    spot = trainer_of(tiny_demo, f"--config={REPO / 'configs/trainer/spot.yaml'}")
    (last,) = [c for c in spot.callbacks if isinstance(c, ModelCheckpoint) and c.filename == "last"]
    assert last._every_n_train_steps == 200 and any(isinstance(c, ThreadPolicy) for c in spot.callbacks)


def test_a_step_save_on_an_epochs_last_batch_holds_what_its_validation_changed(tiny_demo, tmp_path):
    """configs/trainer/spot.yaml's step saves (here every 3 steps, an epoch of 3): last.ckpt is written after the
    epoch's validation, so it holds the temperature that validation fitted (and a resumed run does not lack it)."""
    from lightning.pytorch.callbacks import ModelCheckpoint as Lightnings

    from project.callbacks.last_checkpoint import LastCheckpoint

    spot = trainer_of(tiny_demo, f"--config={REPO / 'configs/trainer/spot.yaml'}")
    assert sum(isinstance(c, LastCheckpoint) for c in spot.callbacks) == 1  # a ModelCheckpoint, options and all
    assert issubclass(LastCheckpoint, Lightnings)
    result = run_here(
        "project.train",
        f"--data.root={tiny_demo}",
        *FAST,
        "--callbacks.last_checkpoint.every_n_train_steps=3",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "logs" / "demo" / "version_0"
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 3
    fitted = float(
        torch.load(run / "checkpoints" / "best.ckpt", weights_only=True)["state_dict"]["calibration.temperature"]
    )
    assert fitted != 1.0 and float(checkpoint["state_dict"]["calibration.temperature"]) == fitted


def test_a_users_progress_bar_and_callbacks_compose_with_the_templates(tiny_demo, tmp_path):
    trainer = trainer_of(tiny_demo, "--trainer.callbacks+=lightning.pytorch.callbacks.TQDMProgressBar")
    assert sum(isinstance(c, TQDMProgressBar) for c in trainer.callbacks) == 1
    assert sum(isinstance(c, ModelCheckpoint) for c in trainer.callbacks) == 2
    result = run_here(
        "project.train",
        f"--data.root={tiny_demo}",
        *FAST[:-1],
        "--trainer.callbacks+=lightning.pytorch.callbacks.TQDMProgressBar",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]  # Lightning refused two progress bars before


def test_a_config_that_restates_the_old_callback_list_keeps_working(tiny_demo, tmp_path):
    old = tmp_path / "old.yaml"  # the default config's callback list, as configs/trainer/spot.yaml had it
    old.write_text(
        yaml.safe_dump(
            {
                "trainer": {
                    "callbacks": [
                        {
                            "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                            "init_args": {"filename": "best", "monitor": "val/acc", "mode": "max"},
                        },
                        {
                            "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                            "init_args": {
                                "filename": "last",
                                "enable_version_counter": False,
                                "every_n_train_steps": 200,
                            },
                        },
                        {
                            "class_path": "lightning.pytorch.callbacks.LearningRateMonitor",
                            "init_args": {"logging_interval": "step"},
                        },
                    ]
                }
            }
        )
    )
    trainer = trainer_of(tiny_demo, f"--config={old}")
    checkpoints = sorted(c.filename for c in trainer.callbacks if isinstance(c, ModelCheckpoint))
    assert checkpoints == ["best", "last"] and sum(isinstance(c, LearningRateMonitor) for c in trainer.callbacks) == 1
    assert any(isinstance(c, ThreadPolicy) for c in trainer.callbacks)  # the sections it did not restate stay


@pytest.mark.slow
def test_csv_and_mlflow_loggers_get_hyperparameters_results_and_pictures(tiny_demo, tmp_path):
    result = run_here(
        "project.train", f"--config={REPO / 'configs/logger/csv.yaml'}", f"--data.root={tiny_demo}", *FAST, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "logs" / "demo" / "version_0"
    with open(run / "metrics.csv", newline="") as stream:
        columns = set(next(csv.reader(stream)))
    assert {"train/loss", "val/acc", "hp/best_val_acc", "hp/test_acc", "hp/val_loss"} <= columns
    hparams = yaml.safe_load((run / "hparams.yaml").read_text())
    assert hparams["model.backbone"] == "SmallCNN" and hparams["model.backbone.width"] == 16
    assert hparams["data.image_size"] == 16
    assert {p.name for p in (run / "media").iterdir()} == {
        "train_first_batch-step000000.png",
        "test_confusion_matrix-step000000.png",
    }
    assert (run / "config.yaml").is_file() and (run / "checkpoints" / "best.ckpt").is_file()

    pytest.importorskip("mlflow")
    result = run_here(
        "project.train",
        f"--config={REPO / 'configs/logger/mlflow.yaml'}",
        f"--data.root={tiny_demo}",
        *FAST,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'logs' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("demo").experiment_id])
    assert run.data.params["model.backbone"] == "SmallCNN"
    assert {"hp/best_val_acc", "hp/test_acc", "val/acc"} <= set(run.data.metrics)
    assert {a.path for a in client.list_artifacts(run.info.run_id, "media")} == {
        "media/train_first_batch-step000000.png",
        "media/test_confusion_matrix-step000000.png",
    }
    folder = tmp_path / "logs" / run.info.experiment_id / run.info.run_id
    assert (folder / "config.yaml").is_file() and (folder / "checkpoints" / "best.ckpt").is_file()
    assert f"run folder: logs/{run.info.experiment_id}/{run.info.run_id}" in result.stdout


AUGMENT = """
data:
  init_args:
    augment:
      class_path: torchvision.transforms.v2.Compose
      init_args:
        transforms:
          - class_path: torchvision.transforms.v2.RandomResizedCrop
            init_args: {size: 16, scale: [0.5, 1.0]}
          - class_path: torchvision.transforms.v2.RandomHorizontalFlip
          - class_path: torchvision.transforms.v2.ColorJitter
            init_args: {brightness: 0.2}
"""


def test_an_augmentation_pipeline_from_the_config_runs_on_the_fast_path_where_it_can(tiny_demo, tmp_path):
    from torchvision.transforms import v2

    from project.tasks.image.data import ImageShards

    config = tmp_path / "augment.yaml"
    config.write_text(AUGMENT)
    cli = ProjectCLI(
        args=[
            f"--config={config}",
            f"--data.root={tiny_demo}",
            "--data.image_size=16",
            "--trainer.logger=false",
            "--data.num_workers=0",
        ]
    )
    data = cli.datamodule
    crop_flip, rest = data.task.crop_flip, data.task.train_rest
    assert crop_flip is not None and crop_flip.scale == (0.5, 1.0) and crop_flip.flip == 0.5
    assert [type(step).__name__ for step in rest.transforms] == ["ColorJitter"]
    assert data.augmentation() == (
        "RandomResizedCrop, RandomHorizontalFlip (batched, crops.py), then ColorJitter (torchvision v2, per sample)"
    )
    batch = next(iter(data.train_dataloader()))
    assert batch.image.shape[1:] == (3, 16, 16) and batch.image.dtype == torch.uint8
    other = ImageShards(
        root=str(tiny_demo),
        image_size=16,
        num_workers=0,
        classes=["a"],
        augment=v2.Compose([v2.ColorJitter(0.2), v2.Resize(16), v2.CenterCrop(16)]),
    )
    assert (
        other.task.crop_flip is None
        and other.augmentation() == "ColorJitter, Resize, CenterCrop (torchvision v2, per sample)"
    )


def test_timm_backbones_build_offline_and_take_a_local_weights_file(tmp_path):
    timm = pytest.importorskip("timm")
    from project.errors import UserError
    from project.tasks.image.backbones import TimmBackbone
    from project.tasks.image.model import ImageClassifier

    model = ImageClassifier(num_classes=3, backbone=functools.partial(TimmBackbone, name="resnet18"), image_size=32)
    assert model(torch.zeros(2, 3, 32, 32, dtype=torch.uint8)).shape == (2, 3)
    published = timm.create_model("convnext_atto", num_classes=3)  # a timm checkpoint, saved as its users do
    torch.save(published.state_dict(), tmp_path / "convnext.pth")
    weights = str(tmp_path / "convnext.pth")
    loaded = ImageClassifier(
        num_classes=3, backbone=functools.partial(TimmBackbone, name="convnext_atto", weights=weights)
    )
    assert torch.equal(loaded.head.weight, published.head.fc.weight)
    assert torch.equal(loaded.backbone.stem[0].weight, published.stem[0].weight)
    with pytest.raises(UserError, match="timm has no such model"):
        ImageClassifier(num_classes=3, backbone=functools.partial(TimmBackbone, name="no_such_net"))
