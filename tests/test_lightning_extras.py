"""Lightning 2.6's extras as configs of configs/callbacks/: `EMAWeightAveraging`, whose checkpoints hold the
average that validation chose them by (with the temperature fitted to it) and resume exactly; and the
learning-rate finder from the command line, which trains at its suggestion from the state and the epoch plan
it started from."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from torch import nn

from project.callbacks.ema import EMAWeightAveraging
from project.callbacks.lr_find import LearningRateFinder
from project.cli import ProjectCLI
from project.errors import UserError

from .conftest import REPO, run_here, run_module, small_run
from .helpers import step_checkpoints

EMA = f"--config={REPO / 'configs/callbacks/ema.yaml'}"
LR_FIND = f"--config={REPO / 'configs/callbacks/lr_find.yaml'}"
# two epochs of 18 batches; threads fixed, so that runs compare bit for bit
TWO_EPOCHS = ("--trainer.max_epochs=2", "--callbacks.threads=null", "--trainer.deterministic=true")
RUN = Path("logs") / "demo" / "version_0"


def checkpoint(folder: Path, name: str) -> dict:
    return torch.load(folder / RUN / "checkpoints" / f"{name}.ckpt", weights_only=True)


def equal(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> bool:
    return first.keys() == second.keys() and all(torch.equal(first[name], second[name]) for name in first)


def printed(table: str, metric: str) -> float:
    """A metric's value in the table Lightning prints after a test."""
    return float(re.search(rf"{re.escape(metric)}\s*│\s*([-0-9.e]+)", table).group(1))


# -- the configs compose with the template's callbacks -------------------------------------------------------


def test_both_configs_add_their_callback_beside_the_templates(tiny_demo):
    args = [f"--data.root={tiny_demo}", "--trainer.logger=false", "--data.num_workers=0", EMA, LR_FIND]
    callbacks = ProjectCLI(args=args).trainer.callbacks
    (ema,) = [c for c in callbacks if isinstance(c, EMAWeightAveraging)]
    assert sum(isinstance(c, LearningRateFinder) for c in callbacks) == 1
    assert {c.filename for c in callbacks if isinstance(c, ModelCheckpoint)} == {"best", "last"}
    assert ema.update_every_n_steps == 1 and ema.update_starting_at_step is None


def test_settings_that_cannot_work_are_one_line():
    with pytest.raises(UserError, match="decay is 1.0: it must be at least 0 and below 1"):
        EMAWeightAveraging(decay=1.0)
    with pytest.raises(UserError, match="min_lr 0.1 and max_lr 0.01"):
        LearningRateFinder(min_lr=0.1, max_lr=0.01)
    with pytest.raises(UserError, match="LightningModule has no lr or learning_rate"):
        LearningRateFinder().lr_name(L.LightningModule())


class Fitted(L.LightningModule):
    """A layer, and a buffer that validation fits (as the classifiers' temperature)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 2)
        self.register_buffer("fitted", torch.ones(()))


def test_validation_sees_the_average_fits_its_buffer_for_both_and_a_save_there_keeps_the_roles():
    model, ema = Fitted(), EMAWeightAveraging(decay=0.5)
    ema.setup(None, model, "fit")
    for step in (1, 2):  # the first update copies the weights, the second averages
        with torch.no_grad():
            model.layer.weight.add_(1.0)
        ema.on_train_batch_end(SimpleNamespace(global_step=step), model, None, None, step - 1)
    live = {name: value.clone() for name, value in model.state_dict().items()}
    average = {name: value.clone() for name, value in ema._average_model.module.state_dict().items()}  # noqa: SLF001
    assert not torch.equal(live["layer.weight"], average["layer.weight"])

    ema.on_validation_epoch_start(None, model)
    assert torch.equal(model.layer.weight, average["layer.weight"])
    model.fitted.fill_(3.0)  # what the model's own validation epoch end fits
    ema.on_validation_epoch_end(None, model)
    assert torch.equal(model.layer.weight, average["layer.weight"])  # still the average's, while it is fitted
    saved = {"state_dict": model.state_dict()}  # a save during validation (a worker died there)
    ema.on_save_checkpoint(None, model, saved)
    assert torch.equal(saved["state_dict"]["layer.weight"], average["layer.weight"])
    assert torch.equal(saved["current_model_state"]["layer.weight"], live["layer.weight"])
    assert int(saved["averaging_state"]["n_averaged"]) == 2

    ema.on_validation_end(None, model)
    assert torch.equal(model.layer.weight, live["layer.weight"])
    assert float(model.fitted) == 3.0 == float(ema._average_model.module.fitted)  # noqa: SLF001


def test_outside_fit_a_checkpoint_keeps_its_average_in_the_model():
    model, ema = Fitted(), EMAWeightAveraging()
    ema.setup(None, model, "fit")
    average = {name: torch.full_like(value, 5.0) for name, value in model.state_dict().items()}
    live = {name: torch.full_like(value, 7.0) for name, value in model.state_dict().items()}
    model.load_state_dict(average)  # what Lightning loads first: the checkpoint's state_dict
    saved = {"state_dict": average, "current_model_state": live, "averaging_state": {"n_averaged": torch.tensor(3)}}
    ema.on_load_checkpoint(SimpleNamespace(state=SimpleNamespace(fn=TrainerFn.TESTING)), model, saved)
    assert torch.equal(model.layer.weight, average["layer.weight"])  # a test after fit measures the average
    ema.on_load_checkpoint(SimpleNamespace(state=SimpleNamespace(fn=TrainerFn.FITTING)), model, saved)
    assert torch.equal(model.layer.weight, live["layer.weight"])  # a resumed fit trains the live weights


# -- EMA on the demo: what its checkpoints hold, and resume -------------------------------------------------


@pytest.fixture(scope="module")
def ema_run(tiny_demo, tmp_path_factory) -> Path:
    """A 2-epoch run with configs/callbacks/ema.yaml (decay 0.9), step checkpoints every 7 steps."""
    folder = tmp_path_factory.mktemp("ema")
    args = small_run(
        tiny_demo, EMA, "--trainer.callbacks.decay=0.9", *TWO_EPOCHS, step_checkpoints(folder / "steps", 7)
    )
    result = run_here("project.train", *args, cwd=folder)
    assert result.returncode == 0, result.stderr[-3000:]
    (folder / "train.out").write_text(result.stdout + result.stderr)
    return folder


@pytest.mark.slow
def test_ema_checkpoints_hold_the_average_that_validated_and_tested(ema_run, tiny_demo):
    best = checkpoint(ema_run, "best")
    average, live = best["state_dict"], best["current_model_state"]
    assert int(best["averaging_state"]["n_averaged"]) == best["global_step"]  # an update after every step
    assert not torch.equal(average["head.weight"], live["head.weight"])
    # fitted to the average as validation ended (Lightning's order left T = 1), and kept by the live weights
    assert float(average["calibration.temperature"]) != 1.0
    assert float(live["calibration.temperature"]) == float(average["calibration.temperature"])

    train = (ema_run / "train.out").read_text()
    # the checkpoint train's test after fit loaded: the first ModelCheckpoint's (here the step checkpoints')
    tested = re.search(r"Loaded model weights from the checkpoint at (\S+)", train).group(1)
    scores = {}
    for split, path in (("val", ema_run / RUN / "checkpoints" / "best.ckpt"), ("test", Path(tested))):
        # the step checkpoints have no run folder to give their settings: the run's own flags give them
        args = small_run(tiny_demo, f"--ckpt_path={path}", f"--split={split}")
        result = run_here("project.evaluate", *args, cwd=ema_run)
        assert result.returncode == 0, result.stderr[-3000:]
        scores.update(json.loads(result.stdout.strip().splitlines()[-1]))
    (chosen_by,) = [s["best_model_score"] for k, s in best["callbacks"].items() if "'monitor': 'val/acc'" in k]
    assert scores["val/acc"] == pytest.approx(float(chosen_by), abs=1e-6)  # the weights it holds are the ones chosen
    # train's test after fit measured the weights its checkpoint holds (Lightning's callback loaded the live ones)
    assert scores["test/loss"] == pytest.approx(printed(train, "test/loss"), abs=1e-6)


@pytest.mark.slow
def test_ema_resumed_mid_epoch_ends_as_the_uninterrupted_run(ema_run, tiny_demo, tmp_path):
    step = ema_run / "steps" / "step=7.ckpt"
    result = run_here(
        "project.train",
        *small_run(tiny_demo, EMA, "--trainer.callbacks.decay=0.9", *TWO_EPOCHS),
        f"--ckpt_path={step}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    resumed, whole = checkpoint(tmp_path, "last"), checkpoint(ema_run, "last")
    assert equal(resumed["state_dict"], whole["state_dict"])  # the average, restored and updated alike
    assert equal(resumed["current_model_state"], whole["current_model_state"])
    assert int(resumed["averaging_state"]["n_averaged"]) == whole["global_step"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        ("shape", "the checkpoint's current_model_state.'head.weight' is (1, 1), this model's (10, "),
        ("nan", "the checkpoint's current_model_state: head.weight holds NaN or infinite values"),
        ("count", "the checkpoint's averaging_state holds no count of updates"),
    ],
)
def test_a_damaged_ema_checkpoint_is_one_line(ema_run, tiny_demo, tmp_path, damage, expected):
    saved = checkpoint(ema_run, "last")
    live = saved["current_model_state"]
    if damage == "shape":
        live["head.weight"] = torch.zeros(1, 1)
    elif damage == "nan":
        live["head.weight"] = torch.full_like(live["head.weight"], float("nan"))
    else:
        saved["averaging_state"] = {"n_averaged": torch.tensor(0.5)}
    torch.save(saved, tmp_path / "damaged.ckpt")
    args = small_run(tiny_demo, EMA, *TWO_EPOCHS, "--trainer.max_epochs=3", f"--ckpt_path={tmp_path / 'damaged.ckpt'}")
    result = run_here("project.train", *args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert expected in result.stderr and "Traceback" not in result.stderr


# -- the learning-rate finder from the command line ---------------------------------------------------------

FINDER = (LR_FIND, "--trainer.callbacks.num_training_steps=25", "--trainer.callbacks.early_stop_threshold=null")


@pytest.mark.slow
def test_lr_find_trains_at_its_suggestion_as_a_plain_run_at_that_lr_would(tiny_demo, tmp_path):
    for folder in ("found", "plain"):
        (tmp_path / folder).mkdir()
    found = run_here("project.train", *small_run(tiny_demo, *FINDER, *TWO_EPOCHS), cwd=tmp_path / "found")
    assert found.returncode == 0, found.stderr[-3000:]
    line = re.search(
        r"lr_find: the loss fell fastest at lr (\S+); training at it \(model lr\); the curve: (\S+)", found.stderr
    )
    assert line, found.stderr[-3000:]
    assert (tmp_path / "found" / line.group(2)).stat().st_size > 0 and line.group(2).endswith("lr_find.png")
    assert not list((tmp_path / "found").glob(".lr_find_*"))  # Lightning's own saved state, removed
    last = checkpoint(tmp_path / "found", "last")
    lr = last["hyper_parameters"]["lr"]
    assert lr != 0.004 and f"{lr:.3g}" == line.group(1)
    # the schedule peaks at it: Lightning set it in the optimizer only, where the schedule put 0.004 back
    assert set(last["lr_schedulers"][0]["base_lrs"]) == {lr}

    # the finder's 25 batches (into epoch 1, validation included) took nothing from the epoch plan: its run equals
    # one at that lr from the start
    plain = run_here("project.train", *small_run(tiny_demo, f"--model.lr={lr!r}", *TWO_EPOCHS), cwd=tmp_path / "plain")
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert equal(last["state_dict"], checkpoint(tmp_path / "plain", "last")["state_dict"])

    args = small_run(tiny_demo, *FINDER, *TWO_EPOCHS, "--trainer.max_epochs=3", "--ckpt_path=last")
    resumed = run_here("project.train", *args, cwd=tmp_path / "found")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "lr_find: a resumed run keeps the learning rate its checkpoint holds" in resumed.stderr
    assert "Finding best initial lr" not in resumed.stderr
    assert set(checkpoint(tmp_path / "found", "last")["lr_schedulers"][0]["base_lrs"]) == {lr}


@pytest.mark.slow
def test_lr_find_and_ema_under_ddp_find_one_lr_for_both_ranks(tiny_demo, tmp_path):
    ddp = ("--config", str(REPO / "configs/trainer/ddp_cpu.yaml"), "--data.batch_size=16")
    args = small_run(tiny_demo, EMA, *FINDER, "--trainer.callbacks.num_training_steps=15", *TWO_EPOCHS, *ddp)
    result = run_module("project.train", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(re.findall("lr_find: the loss fell fastest", result.stderr)) == 1  # rank zero's line
    assert (tmp_path / RUN / "lr_find.png").is_file()
    last = checkpoint(tmp_path, "last")
    assert set(last["lr_schedulers"][0]["base_lrs"]) == {last["hyper_parameters"]["lr"]} != {0.004}
    assert int(last["averaging_state"]["n_averaged"]) == last["global_step"]
