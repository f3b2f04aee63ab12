"""One trial of the Ray Tune backend (a project.train run that reports to Ray and restores Ray's checkpoints),
and the search space file in Ray's terms: its distributions and schedulers."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback

from project.errors import UserError, one_line, user_error_in
from project.redact import redact_text
from project.tune.space import as_flags, trial_flags

SCHEDULERS = ("asha", "pbt", "fifo")
CHECKPOINT = "checkpoint.ckpt"


def require_ray() -> None:
    try:
        import ray.tune  # noqa: F401
    except ImportError:
        raise UserError('--backend ray needs Ray Tune: pip install -e ".[ray]"') from None


def tune_name(metric: str) -> str:
    """Ray reads a "/" in a metric name as nesting: val/acc is reported as val_acc."""
    return metric.replace("/", "_")


def parse_resources(text: str | None) -> dict[str, float]:
    """`cpu=2,gpu=0.5` -> {"cpu": 2.0, "gpu": 0.5}; one CPU and no GPU by default."""
    resources = {"cpu": 1.0, "gpu": 0.0}
    for part in filter(None, (text or "").split(",")):
        name, _, value = part.partition("=")
        try:
            resources[name.strip()] = float(value)
        except ValueError:
            raise UserError(f"--resources_per_trial: expected pairs such as cpu=1,gpu=0, got {part!r}") from None
        if name.strip() not in ("cpu", "gpu") or resources[name.strip()] < 0:
            raise UserError(f"--resources_per_trial: {part!r}: only cpu and gpu, each 0 or more")
    return resources


def space(params: dict[str, dict]) -> dict[str, Any]:
    """The search space file's distributions as Ray's (checked by project.tune.space.load_search first)."""
    from ray import tune

    result = {}
    for key, spec in params.items():
        low, high, step, log = spec.get("low"), spec.get("high"), spec.get("step"), spec.get("log", False)
        if spec["type"] == "categorical":
            result[key] = tune.choice(list(spec["choices"]))
        elif log and step is not None:
            raise UserError(f"{key}: log and step together have no Ray equivalent; keep one")
        elif spec["type"] == "float":
            low, high = float(low), float(high)
            result[key] = (
                tune.loguniform(low, high)
                if log
                else tune.quniform(low, high, float(step))
                if step is not None
                else tune.uniform(low, high)
            )
        elif log:
            result[key] = tune.lograndint(int(low), int(high) + 1)  # Ray's upper bound is exclusive
        elif step is not None:
            result[key] = tune.qrandint(int(low), int(high), int(step))  # inclusive, as Optuna's
        else:
            result[key] = tune.randint(int(low), int(high) + 1)
    return result


def make_scheduler(name: str, params: dict[str, dict], max_epochs: int):  # noqa: ANN201
    """The scheduler; it takes the metric and mode from the TuneConfig."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, PopulationBasedTraining

    if name == "asha":
        return ASHAScheduler(max_t=max(1, max_epochs), grace_period=1, reduction_factor=2)
    if name == "pbt":
        floats = {key: value for key, value in space(params).items() if params[key]["type"] == "float"}
        if not floats:
            raise UserError("--scheduler pbt perturbs float parameters, and the search space has none")
        return PopulationBasedTraining(
            time_attr="training_iteration",
            perturbation_interval=1,
            synch=True,
            hyperparam_mutations=floats,
            quantile_fraction=0.5,
        )
    return FIFOScheduler()


class NewHyperparameters(Callback):
    """A trial restored from another's checkpoint (PBT's exploit) keeps that trial's optimizer state, and with
    it the old learning rate and weight decay: give the optimizer and the schedule this trial's values."""

    def __init__(self) -> None:
        self.saved: dict[str, Any] = {}

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:  # noqa: ANN001
        self.saved = dict(checkpoint.get("hyper_parameters") or {})

    def on_train_start(self, trainer, pl_module) -> None:  # noqa: ANN001
        old_lr, new = self.saved.get("lr"), pl_module.hparams
        if not self.saved or "lr" not in new:
            return
        ratio = float(new["lr"]) / float(old_lr) if old_lr else 1.0
        for optimizer in trainer.optimizers:
            for group in optimizer.param_groups:
                for name in ("lr", "initial_lr"):
                    if name in group:
                        group[name] *= ratio
                if group.get("weight_decay") and "weight_decay" in new:
                    group["weight_decay"] = float(new["weight_decay"])
        for config in trainer.lr_scheduler_configs:
            config.scheduler.base_lrs = [lr * ratio for lr in config.scheduler.base_lrs]


def trainable(
    config: dict[str, Any],
    *,
    overrides: list[str],
    versioned: bool,
    folder: str,
    metric: str,
    cwd: str,
) -> None:
    """One trial: a project.train run with the trial's values, restored from a checkpoint where Ray gives one
    (PBT's exploit, or a trial resumed after an interruption). A restore is noted in the trial's folder, in
    restored.txt."""
    os.chdir(cwd)  # Ray starts a trial in a folder of its own; the command's relative paths are the user's
    try:
        _run_trial(config, overrides, versioned, folder, metric)
    except Exception as error:
        found = user_error_in(error)  # the cause chain is lost once Ray carries the error to the driver
        if found is None:
            raise
        raise UserError(redact_text(one_line(found))) from None


def _run_trial(config: dict[str, Any], overrides: list[str], versioned: bool, folder: str, metric: str) -> None:
    """The body of `trainable`."""
    from ray import tune
    from ray.tune.integration.pytorch_lightning import TuneReportCheckpointCallback

    from project.cli import ProjectCLI

    number = int(tune.get_context().get_trial_id().rsplit("_", 1)[-1])
    flags = trial_flags(overrides, versioned, Path(folder), number) + as_flags(config)
    report = TuneReportCheckpointCallback(metrics={tune_name(metric): metric}, filename=CHECKPOINT)
    cli = ProjectCLI(args=flags, trainer_defaults={"callbacks": [report, NewHyperparameters()]})
    checkpoint = tune.get_checkpoint()
    if checkpoint is None:
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        return
    with checkpoint.as_directory() as directory:
        run = Path(folder) / f"trial_{number}"
        run.mkdir(parents=True, exist_ok=True)
        with open(run / "restored.txt", "a") as stream:
            stream.write(f"{directory}\n")
        cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=str(Path(directory) / CHECKPOINT))
