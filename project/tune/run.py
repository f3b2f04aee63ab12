"""Search hyperparameters with Optuna; every trial is a normal training run.

    python -m project.tune [train overrides...] --n_trials N [--search FILE] [--storage URL] [--study_name NAME]

The train overrides are project.train's own (`--config FILE`, `--section.key VALUE`). Each trial adds the
values the TPE sampler drew for the keys of the search space, fits without testing, and reports the
validation metric after every epoch, so that a bad trial is pruned early (optuna-integration's
PyTorchLightningPruningCallback). Trial N logs to logs/<study>/trial_N/. The search space is --search, or
else the task's own, configs/tune/<task>.yaml for a model of project/tasks/<task>/ where that file exists
(configs/tune/text.yaml for the text task), or else configs/tune/default.yaml (the image task's).

The study is stored in logs/<study>/study.db (SQLite) unless --storage names another database. It runs
until the study holds N finished (complete or pruned) trials. A study that exists is continued only with
`--resume true`: after an interruption, with a larger N to add trials, or on several machines against one
RDB url (PostgreSQL, MySQL) to share the work (each with --resume true). Without it the command stops in one
line before it reads the study: a study folder copied from someone else is trusted like code once resumed
(Ray's records are pickles; a study's stored configuration becomes best.yaml). At the end it prints a
table of the trials and writes the best trial's configuration to logs/<study>/best.yaml, for
`python -m project.train --config`.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Literal

import optuna
from lightning.pytorch.utilities.exceptions import SIGTERMException
from rich.console import Console

from project.cli import ConfigOnlyCLI, print_train_help
from project.commands import command_line, parse_tool_arguments
from project.data.paths import check_output
from project.errors import UserError, run_main
from project.redact import redact
from project.tune.space import (
    default_search,
    has_key,
    load_search,
)
from project.tune.study import existing_study, make_pruner, open_study, optimize, trials_table, write_best


def options(
    *,
    n_trials: int,
    search: Path | None = None,
    storage: str | None = None,
    study_name: str | None = None,
    backend: Literal["optuna", "ray"] = "optuna",
    scheduler: Literal["asha", "pbt", "fifo"] = "asha",
    address: str | None = None,
    resources_per_trial: str | None = None,
    resume: bool = False,
) -> SimpleNamespace:
    """Search hyperparameters with Optuna or Ray Tune; every trial is a project.train run.

    Args:
        n_trials: the finished trials the study should hold.
        search: the search space YAML (default: the task's, else configs/tune/default.yaml).
        storage: Optuna's storage url (default: sqlite:///<logs>/<study>/study.db).
        study_name: the study's name (default: <experiment>-tune).
        backend: the search backend.
        scheduler: ray: the trial scheduler.
        address: ray: a running cluster (auto, or HOST:PORT); default: a local Ray.
        resources_per_trial: ray: cpu=N,gpu=N for each trial (default cpu=1,gpu=0).
        resume: continue the study if it exists (else start it). Resuming trusts the study's folder (or
            storage) like code: Ray's records in it are unpickled. Without it, an existing study is refused.
    """
    if backend == "optuna" and (address or resources_per_trial):
        raise UserError("--address and --resources_per_trial are for --backend ray")
    if backend == "ray" and storage:
        raise UserError("--storage is Optuna's: with --backend ray the experiment lives in logs/<study>/ray")
    if backend == "ray":
        from project.tune.ray_backend import parse_resources, require_ray

        require_ray()  # before the config is read
        parse_resources(resources_per_trial)
    if n_trials < 1:
        raise UserError(f"--n_trials must be at least 1, got {n_trials}")
    return SimpleNamespace(
        n_trials=n_trials,
        search=Path(search) if search else None,
        storage=storage,
        study_name=study_name,
        backend=backend,
        scheduler=scheduler,
        address=address,
        resources_per_trial=resources_per_trial,
        resume=resume,
    )


def parse_args(args: list[str]) -> tuple[SimpleNamespace, list[str]]:
    """(tune options, train overrides): every argument tune does not know goes to the trials."""
    given, overrides = parse_tool_arguments(options, "project.tune", args, on_help=print_train_help)
    if "--ckpt_path" in overrides or any(arg.startswith("--ckpt_path=") for arg in overrides):
        raise UserError("--ckpt_path: every trial trains from scratch; tune does not resume checkpoints")
    return options(**given), overrides


def refuse_existing(options: SimpleNamespace, folder: Path, name: str) -> None:
    """Stop, in one line, where the study's folder already holds a study and --resume was not given.

    Ray's `Tuner.restore` unpickles the folder's tuner.pkl and trial states, so resuming runs whatever code
    the folder's author put there; only its existence is looked at here (no file in it is opened), and whether
    it is a link or holds trials' folders (a new study's trials would write through links left in them). Optuna's
    storage holds no pickles, but the one rule holds for both backends. A study in a --storage of the
    user's own is found by `open_study`, which asks that database."""
    if options.resume:
        return
    if options.backend == "ray":
        found = [path for path in (folder / "ray", folder / "ray_experiment.yaml") if os.path.lexists(path)]
    else:
        found = [folder / "study.db"] if options.storage is None and os.path.lexists(folder / "study.db") else []
    # a study folder that is a link, or trials' folders from before (only their names are listed): the new
    # study's trials would write through the links a stranger left there (trial_0/checkpoints -> elsewhere)
    found += [folder] if os.path.islink(folder) else sorted(folder.glob("trial_*"))[:1]
    if found:
        raise UserError(existing_study(name, str(found[0])))


def main(args: list[str] | None = None) -> optuna.Study | None:
    options, overrides = parse_args(command_line(args))
    checked = ConfigOnlyCLI(args=overrides)  # checks the overrides before any trial
    config = checked.config
    logger = getattr(config.trainer.logger, "init_args", None)
    save_dir = Path(getattr(logger, "save_dir", None) or "logs")
    name = options.study_name or f"{getattr(logger, 'name', None) or 'study'}-tune"
    folder = save_dir / name
    refuse_existing(options, folder, name)  # first: before anything in the study's folder is read
    check_output(folder, save_dir)  # a study folder planted as a link out of logs/ is written nowhere
    checked.check_data()  # and the data: a missing split is one line here, for both backends
    options.search = options.search or default_search(config)
    search = load_search(options.search)
    unknown = [key for key in search["params"] if not has_key(config, key)]
    if unknown:
        raise UserError(f"search space {options.search}: {unknown[0]!r} is not a config key (see project.train --help)")
    if options.backend == "ray":  # project/tune/ray_backend.py: the same search space, trial folders and best.yaml
        from project.tune.ray_backend import run

        started, best = time.perf_counter(), run(options, overrides, config, search, folder)
        minutes = (time.perf_counter() - started) / 60
        none = f"no trial reported {search['metric']} in {minutes:.1f} min, so there is no best configuration"
        print(f"best config: {best}\ntrain it:    python -m project.train --config {best}" if best else none)
        return None
    folder.mkdir(parents=True, exist_ok=True)
    storage = options.storage or f"sqlite:///{folder / 'study.db'}"
    sampler, pruner = optuna.samplers.TPESampler(), make_pruner(search.get("pruner"))
    study = open_study(storage, name, search, sampler, pruner, resume=options.resume)
    print(f"study {name} in {redact(storage)}", file=sys.stderr)
    started = time.perf_counter()
    try:
        optimize(study, options.n_trials, search=search, overrides=overrides, config=config, folder=folder)
    except SIGTERMException:
        print(f"stopped by SIGTERM: add --resume true to the same command to continue study {name}", file=sys.stderr)
        raise SystemExit(143) from None
    finally:
        Console(width=max(Console().width, 120)).print(trials_table(study, search["metric"]))
        print(f"trial run folders: {folder}/trial_N (tensorboard --logdir {folder})")
    best = write_best(study, folder / "best.yaml")
    minutes = (time.perf_counter() - started) / 60
    if best is None:
        print(f"no trial completed in {minutes:.1f} min, so there is no best configuration yet")
    else:
        print(f"best trial {study.best_trial.number}: {search['metric']} = {study.best_value:.4f} ({minutes:.1f} min)")
        print(f"best config: {best}\ntrain it:    python -m project.train --config {best}")
    return study


def console() -> None:
    """The `shards-tune` console script."""
    run_main(main)


if __name__ == "__main__":
    console()
