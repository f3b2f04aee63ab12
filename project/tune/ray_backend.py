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

Ray keeps the experiment in logs/<study>/ray/; the same command with `--resume true` after an interruption
continues it (`Tuner.restore`) to N trials in all. `Tuner.restore` unpickles the folder's tuner.pkl and trial
states, so resuming trusts the folder like code: without --resume an existing folder is refused before anything
in it is read (project.tune.run.refuse_existing). At the end: a table of the trials, and logs/<study>/best.yaml
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

from project.data.atomic import write_text_atomically
from project.errors import UserError
from project.tune.ray_trials import (
    make_scheduler,
    parse_resources,
    require_ray,
    space,
    trainable,
    tune_name,
)
from project.tune.space import best_config, short, versioned_logger
from project.tune.study import existing_study


def ray_address(address: str | None) -> str:
    """Where `ray.init` goes: the cluster given (`--address`, else `RAY_ADDRESS`), else a new local Ray. Not Ray's
    own default: given no address, it joins the cluster named in /tmp/ray/ray_current_cluster, which a head stopped
    without `ray stop` leaves behind, and waits there for a server that is gone."""
    return address or os.environ.get("RAY_ADDRESS") or "local"


def run(options: Any, overrides: list[str], config: Any, search: dict, folder: Path) -> Path | None:
    """Run (or, with --resume, resume) the experiment to --n_trials trials; print the table; write best.yaml
    (its path)."""
    require_ray()
    import logging

    import ray
    from ray import tune

    metric, mode = tune_name(search["metric"]), "max" if search["direction"] == "maximize" else "min"
    resources = parse_resources(options.resources_per_trial)
    scheduler = make_scheduler(options.scheduler, search["params"], int(config.trainer.max_epochs or 1))
    settings = {
        "n_trials": options.n_trials,
        "scheduler": options.scheduler,
        "metric": search["metric"],
        "direction": search["direction"],
    }
    storage = (folder / "ray").resolve()
    experiment = storage / folder.name
    stored = folder / "ray_experiment.yaml"
    if not options.resume and (os.path.lexists(storage) or os.path.lexists(stored)):  # run.py said so first
        raise UserError(existing_study(folder.name, str(folder / "ray")))
    if stored.is_file() and (previous := stored_settings(stored)) != settings:
        changed = ", ".join(sorted(key for key in settings if previous.get(key) != settings[key]))
        raise UserError(
            f"experiment {folder.name} was started with other settings ({changed}): "
            "Ray cannot change them; pick another --study_name"
        )
    function = tune.with_resources(
        tune.with_parameters(
            trainable,
            overrides=overrides,
            versioned=versioned_logger(config),
            folder=str(folder.resolve()),
            metric=search["metric"],
            cwd=os.getcwd(),
        ),
        resources,
    )
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # the older reporter, silent at verbose=0: our table follows
    ray.init(
        address=ray_address(options.address),
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.WARNING,
        ignore_reinit_error=True,
    )
    try:
        # can_restore only looks for tuner.pkl; restore unpickles it, and only --resume lets it
        if options.resume and tune.Tuner.can_restore(str(experiment)):
            print(f"resuming experiment {experiment}", file=sys.stderr)
            tuner = tune.Tuner.restore(str(experiment), trainable=function, resume_errored=True)
        else:
            folder.mkdir(parents=True, exist_ok=True)
            write_text_atomically(stored, yaml.safe_dump(settings))
            tuner = tune.Tuner(
                function,
                param_space=space(search["params"]),
                tune_config=tune.TuneConfig(
                    metric=metric, mode=mode, scheduler=scheduler, num_samples=options.n_trials
                ),
                run_config=tune.RunConfig(name=folder.name, storage_path=str(storage), verbose=0),
            )
        with warnings.catch_warnings():  # PBT's advice to reuse actors: a trial here is a whole training run
            warnings.filterwarnings("ignore", message="Consider boosting PBT performance")
            results = tuner.fit()
    finally:
        ray.shutdown()
    return report_results(results, search, folder, metric, mode)


def stored_settings(path: Path) -> dict:
    """The settings the experiment was started with (ray_experiment.yaml); a file that holds none is one line."""
    try:
        previous = yaml.safe_load(path.read_bytes())
    except (yaml.YAMLError, ValueError, RecursionError):
        previous = None
    if not isinstance(previous, dict):
        raise UserError(f"{path} holds no experiment's settings: remove it, or pick another --study_name")
    return previous


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
        table.add_row(
            f"{number}{mark}",
            state,
            "" if value is None else f"{value:.4f}",
            str(epochs),
            *(short(values.get(key, "")) for key in keys),
            f"{seconds / 60:.1f}",
        )
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
    best_config(
        yaml.safe_load(trial_config.read_text()),
        path,
        f"the best trial ({best[0]}) of experiment {folder.name}: {best[2]:.4f}, with {values}",
    )
    print(f"best trial {best[0]}: {search['metric']} = {best[2]:.4f}")
    return path
