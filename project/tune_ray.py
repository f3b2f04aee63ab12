"""The Ray Tune backend of `project.tune`: ASHA, Population Based Training or FIFO over trials that run at the
same time, on this machine or a Ray cluster.

    python -m project.tune --backend ray [train overrides...] --n_trials N [--scheduler asha|pbt|fifo]
        [--address auto|HOST:PORT] [--resources_per_trial cpu=1,gpu=0] [--search FILE] [--study_name NAME]

The search space file is the Optuna backend's: each distribution maps to Ray's (float: uniform, loguniform,
quniform; int: randint, lograndint, qrandint; categorical: choice). Each trial is a normal training run in
logs/<study>/trial_N/, reporting the metric after every validation through Ray's Lightning callback
(`ray.tune.integration.pytorch_lightning.TuneReportCheckpointCallback`), with a full Lightning checkpoint of
this project: the weights, the optimizer and the exact data position.

- asha: stops the trials that trail at each epoch (grace period 1 epoch, reduction factor 2).
- pbt: after every epoch (all trials wait for each other: synchronous PBT, which exploits at every step even
  with two trials) the worse half of the trials copy the better half's checkpoint and configuration,
  then perturb its float parameters (x0.8 or x1.2, or a fresh draw); the other parameters (widths, batch
  sizes: they would not fit the copied weights or data position) stay the donor's. A restored trial takes
  its new learning rate and weight decay (`NewHyperparameters`).
- fifo: runs every trial to its end.

Ray keeps the experiment in logs/<study>/ray/; running the same command again after an interruption
continues it (`Tuner.restore`) to N trials in all. At the end: a table of the trials, and logs/<study>/best.yaml
for `python -m project.train --config`, as with Optuna.
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from pathlib import Path
from typing import Any

import yaml
from lightning.pytorch import Callback

from project.data.atomic import write_text_atomically
from project.data.redact import redact_text
from project.errors import UserError, one_line, user_error_in
from project.tune_common import as_flags, best_config, short, trial_flags, versioned_logger

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
    """The search space file's distributions as Ray's (checked by project.tune.load_search first)."""
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
            result[key] = (tune.loguniform(low, high) if log else tune.quniform(low, high, float(step))
                           if step is not None else tune.uniform(low, high))  # fmt: skip
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
        return PopulationBasedTraining(time_attr="training_iteration", perturbation_interval=1, synch=True,
                                       hyperparam_mutations=floats, quantile_fraction=0.5)  # fmt: skip
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


def trainable(config: dict[str, Any], overrides: list[str], versioned: bool, folder: str, metric: str, cwd: str,
              ) -> None:  # fmt: skip
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


def run(options: Any, overrides: list[str], config: Any, search: dict, folder: Path) -> Path | None:
    """Run (or resume) the experiment to --n_trials trials; print the table; write best.yaml (its path)."""
    require_ray()
    import logging

    import ray
    from ray import tune

    metric, mode = tune_name(search["metric"]), "max" if search["direction"] == "maximize" else "min"
    resources = parse_resources(options.resources_per_trial)
    scheduler = make_scheduler(options.scheduler, search["params"], int(config.trainer.max_epochs or 1))
    settings = {"n_trials": options.n_trials, "scheduler": options.scheduler, "metric": search["metric"],
                "direction": search["direction"]}  # fmt: skip
    storage = (folder / "ray").resolve()
    experiment = storage / folder.name
    stored = folder / "ray_experiment.yaml"
    if stored.is_file() and (previous := yaml.safe_load(stored.read_text())) != settings:
        changed = ", ".join(sorted(key for key in settings if previous.get(key) != settings[key]))
        raise UserError(f"experiment {folder.name} was started with other settings ({changed}): "
                        "Ray cannot change them; pick another --study_name")  # fmt: skip
    function = tune.with_resources(
        tune.with_parameters(trainable, overrides=overrides, versioned=versioned_logger(config),
                             folder=str(folder.resolve()), metric=search["metric"], cwd=os.getcwd()),
        resources,
    )  # fmt: skip
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # the older reporter, silent at verbose=0: our table follows
    ray.init(address=options.address, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING,
             ignore_reinit_error=True)  # fmt: skip
    try:
        if tune.Tuner.can_restore(str(experiment)):
            print(f"resuming experiment {experiment}", file=sys.stderr)
            tuner = tune.Tuner.restore(str(experiment), trainable=function, resume_errored=True)
        else:
            folder.mkdir(parents=True, exist_ok=True)
            write_text_atomically(stored, yaml.safe_dump(settings))
            tuner = tune.Tuner(
                function,
                param_space=space(search["params"]),
                tune_config=tune.TuneConfig(metric=metric, mode=mode, scheduler=scheduler,
                                            num_samples=options.n_trials),
                run_config=tune.RunConfig(name=folder.name, storage_path=str(storage), verbose=0),
            )  # fmt: skip
        with warnings.catch_warnings():  # PBT's advice to reuse actors: a trial here is a whole training run
            warnings.filterwarnings("ignore", message="Consider boosting PBT performance")
            results = tuner.fit()
    finally:
        ray.shutdown()
    return report_results(results, search, folder, metric, mode)


def trial_error(error: BaseException) -> str:
    """The line a trial's error would have printed: the trial's own exception, which Ray keeps as `cause` of its
    wrapping (a `trainable` turned a user's mistake into a plain UserError), or else the last line of the
    traceback Ray's error carries in its text."""
    seen = 0
    while getattr(error, "cause", None) is not None and seen < 10:
        error, seen = error.cause, seen + 1
    if isinstance(error, UserError) and error.args:
        return str(error.args[0]).splitlines()[-1].strip()
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


def report_results(results: Any, search: dict, folder: Path, metric: str, mode: str) -> Path | None:
    from rich.console import Console
    from rich.table import Table

    keys = sorted(search["params"])
    rows = []
    for index, result in enumerate(results):
        # the trial's folder, trainable_<experiment>_<NNNNN>_...: a trial that copied another's checkpoint (PBT)
        # reports that trial's id among its metrics
        found = re.search(r"_[0-9a-f]{5}_(\d{5})_", Path(result.path).name) if result.path else None
        number = int(found.group(1)) if found else index
        value = (result.metrics or {}).get(metric)
        epochs = (result.metrics or {}).get("training_iteration", 0)
        state = "error" if result.error else "done"
        rows.append((number, state, value, epochs, result.config, (result.metrics or {}).get("time_total_s", 0)))
    rows.sort()
    finished = [row for row in rows if row[2] is not None]
    best = (max if mode == "max" else min)(finished, key=lambda row: row[2]) if finished else None
    table = Table(title=f"experiment {folder.name}: {len(rows)} trials")
    for column in ("trial", "state", search["metric"], "epochs", *keys, "minutes"):
        table.add_column(column, justify="left" if column == "state" else "right")
    for number, state, value, epochs, values, seconds in rows:
        mark = " *" if best is not None and number == best[0] else ""
        table.add_row(f"{number}{mark}", state, "" if value is None else f"{value:.4f}", str(epochs),
                      *(short(values.get(key, "")) for key in keys), f"{seconds / 60:.1f}")  # fmt: skip
    Console(width=max(Console().width, 120)).print(table)
    print(f"trial run folders: {folder}/trial_N (tensorboard --logdir {folder}); Ray's records: {folder}/ray")
    exploits = list((folder / "ray").glob("*/pbt_global.txt"))
    if exploits:
        steps = len(exploits[0].read_text().splitlines())
        print(f"PBT: {steps} exploit steps (a trial took a better one's checkpoint, then perturbed): {exploits[0]}")
    if best is None:
        failed = next((result.error for result in results if result.error), None)
        if failed is not None:  # every trial failed: the first one's error, as a trial would have said it
            raise UserError(f"every trial failed; the first: {trial_error(failed)}")
        return None
    trial_config = folder / f"trial_{best[0]}" / "config.yaml"
    values = ", ".join(f"{key}={short(best[4][key])}" for key in keys)
    path = folder / "best.yaml"
    best_config(yaml.safe_load(trial_config.read_text()), path,
                f"the best trial ({best[0]}) of experiment {folder.name}: {best[2]:.4f}, with {values}")  # fmt: skip
    print(f"best trial {best[0]}: {search['metric']} = {best[2]:.4f}")
    return path
