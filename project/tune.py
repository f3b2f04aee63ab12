"""Search hyperparameters with Optuna; every trial is a normal training run.

    python -m project.tune [train overrides...] --n_trials N [--search FILE] [--storage URL] [--study_name NAME]

The train overrides are project.train's own (`--config FILE`, `--section.key VALUE`). Each trial adds the
values the TPE sampler drew for the keys of the search space, fits without testing, and reports the
validation metric after every epoch, so that a bad trial is pruned early (optuna-integration's
PyTorchLightningPruningCallback). Trial N logs to logs/<study>/trial_N/. The search space is --search, or
else the task's own, configs/tune/<task>.yaml for a model of project/tasks/<task>/ where that file exists
(configs/tune/text.yaml for the text task), or else configs/tune/default.yaml (the image task's).

The study is stored in logs/<study>/study.db (SQLite) unless --storage names another database. It runs
until the study holds N finished (complete or pruned) trials: run the same command again to resume it
after an interruption, with a larger N to add trials, or on several machines against one RDB url
(PostgreSQL, MySQL) to share the work. At the end it prints a table of the trials and writes the best
trial's configuration to logs/<study>/best.yaml, for `python -m project.train --config`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import optuna
import sqlalchemy.exc
import torch
import yaml
from lightning.pytorch.utilities.exceptions import SIGTERMException
from optuna.trial import TrialState
from optuna_integration import PyTorchLightningPruningCallback
from rich.console import Console
from rich.table import Table

from project.callbacks.save_config import redacted_config
from project.cli import ConfigOnlyCLI, ProjectCLI, print_train_help
from project.commands import command_parser, parse_tool_arguments
from project.data.redact import redact
from project.errors import UserError, run_main
from project.tune_common import (
    as_flags,
    best_config,
    default_search,
    has_key,
    load_search,
    short,
    trial_flags,
    versioned_logger,
)

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


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
    """
    if backend == "optuna" and (address or resources_per_trial):
        raise UserError("--address and --resources_per_trial are for --backend ray")
    if backend == "ray" and storage:
        raise UserError("--storage is Optuna's: with --backend ray the experiment lives in logs/<study>/ray")
    if backend == "ray":
        from project.tune_ray import parse_resources, require_ray

        require_ray()  # before the config is read
        parse_resources(resources_per_trial)
    if n_trials < 1:
        raise UserError(f"--n_trials must be at least 1, got {n_trials}")
    return SimpleNamespace(n_trials=n_trials, search=Path(search) if search else None, storage=storage,
                           study_name=study_name, backend=backend, scheduler=scheduler, address=address,
                           resources_per_trial=resources_per_trial)  # fmt: skip


def parse_args(args: list[str]) -> tuple[SimpleNamespace, list[str]]:
    """(tune options, train overrides): every argument tune does not know goes to the trials."""
    if "-h" in args or "--help" in args:
        print_train_help(command_parser(options, "project.tune", config=False).format_help())
    given, overrides = parse_tool_arguments(options, "project.tune", args)
    if "--ckpt_path" in overrides or any(arg.startswith("--ckpt_path=") for arg in overrides):
        raise UserError("--ckpt_path: every trial trains from scratch; tune does not resume checkpoints")
    return options(**given), overrides


def make_pruner(spec: dict[str, Any] | None) -> optuna.pruners.BasePruner:
    if not spec:
        return optuna.pruners.NopPruner()
    arguments = dict(spec)
    name = arguments.pop("name", None)
    pruner = getattr(optuna.pruners, str(name), None)
    if not (isinstance(pruner, type) and issubclass(pruner, optuna.pruners.BasePruner)):
        raise UserError(f"pruner {name!r} is not an optuna.pruners class (MedianPruner, HyperbandPruner, ...)")
    try:
        return pruner(**arguments)
    except (TypeError, ValueError) as error:
        raise UserError(f"pruner {name}: {error}") from None


def suggest(trial: optuna.Trial, params: dict[str, dict]) -> dict[str, Any]:
    """One value per config key, drawn by the trial's sampler."""
    values = {}
    for key, spec in params.items():
        options = {name: spec[name] for name in ("step", "log") if name in spec}
        if spec["type"] == "float":
            values[key] = trial.suggest_float(key, float(spec["low"]), float(spec["high"]), **options)
        elif spec["type"] == "int":
            values[key] = trial.suggest_int(key, int(spec["low"]), int(spec["high"]), **options)
        else:
            values[key] = trial.suggest_categorical(key, spec["choices"])
    return values


def run_trial(trial: optuna.Trial, flags: list[str], metric: str) -> float:
    """Fit one trial through the same CLI as project.train; its value is the last validation `metric`."""
    pruning = PyTorchLightningPruningCallback(trial, monitor=metric)
    cli = ProjectCLI(args=flags, trainer_defaults={"callbacks": [pruning]})
    trainer = cli.trainer
    if trainer.world_size > 1:
        raise UserError(
            "project.tune runs each trial in one process: drop the multi-device trainer settings and start "
            "one tune process per GPU (CUDA_VISIBLE_DEVICES) against the same --storage instead"
        )
    log_dir = getattr(trainer.logger, "log_dir", None)
    trial.set_user_attr("run_folder", str(log_dir) if log_dir else "")
    # the study's database is shared and outlives the run: the configuration goes in without its secrets
    trial.set_user_attr("config", cli.parser.dump(redacted_config(cli.config), skip_none=False))
    trainer.fit(cli.model, datamodule=cli.datamodule)
    value = trainer.callback_metrics.get(metric)
    if value is None:
        raise UserError(f"metric {metric} was never logged: is validation on, and is the name right?")
    return float(value)


def optimize(study: optuna.Study, n_trials: int, overrides: list[str], config: Any, search: dict, folder: Path) -> None:
    """Run trials until the study (shared by every process on its storage) holds `n_trials` finished ones."""
    while (done := len(study.get_trials(deepcopy=False, states=FINISHED))) < n_trials:
        trial = study.ask()
        values = suggest(trial, search["params"])
        shown = ", ".join(f"{key}={short(value)}" for key, value in values.items())
        print(f"\ntrial {trial.number} ({done} of {n_trials} finished so far): {shown}", file=sys.stderr)
        flags = trial_flags(overrides, versioned_logger(config), folder, trial.number) + as_flags(values)
        try:
            value = run_trial(trial, flags, search["metric"])
        except optuna.TrialPruned as pruned:
            study.tell(trial, state=TrialState.PRUNED)
            print(f"trial {trial.number} pruned: {pruned}", file=sys.stderr)
            continue
        except torch.OutOfMemoryError:
            study.tell(trial, state=TrialState.FAIL)
            print(f"trial {trial.number} failed: out of memory; the study goes on", file=sys.stderr)
            continue
        except BaseException:  # an error or an interruption: the trial is not left RUNNING
            study.tell(trial, state=TrialState.FAIL)
            raise
        study.tell(trial, value)
        print(f"trial {trial.number}: {search['metric']} = {value:.4f}", file=sys.stderr)


def trials_table(study: optuna.Study, metric: str) -> Table:
    trials = study.get_trials(deepcopy=False)
    keys = sorted({key for trial in trials for key in trial.params})
    best = study.best_trial.number if any(t.state == TrialState.COMPLETE for t in trials) else None
    table = Table(title=f"study {study.study_name}: {len(trials)} trials")
    for column in ("trial", "state", metric, *keys, "minutes"):
        table.add_column(column, justify="left" if column == "state" else "right")
    for trial in trials:
        value = trial.value if trial.value is not None else trial.intermediate_values.get(trial.last_step or 0)
        minutes = f"{trial.duration.total_seconds() / 60:.1f}" if trial.duration else ""
        params = [short(trial.params.get(key, "")) for key in keys]
        number = f"{trial.number}{' *' if trial.number == best else ''}"
        row = [number, trial.state.name.lower(), "" if value is None else f"{value:.4f}", *params, minutes]
        table.add_row(*row)
    return table


def write_best(study: optuna.Study, path: Path) -> Path | None:
    """The best trial's full configuration, logging to a new version folder of the study's experiment."""
    if not any(trial.state == TrialState.COMPLETE for trial in study.get_trials(deepcopy=False)):
        return None
    best = study.best_trial
    values = ", ".join(f"{key}={value}" for key, value in best.params.items())
    title = f"the best trial ({best.number}) of study {study.study_name}: {best.value:.4f}, with {values}"
    return best_config(yaml.safe_load(best.user_attrs["config"]), path, title)


def open_study(storage: str, name: str, search: dict, sampler: optuna.samplers.BaseSampler,
               pruner: optuna.pruners.BasePruner) -> optuna.Study:  # fmt: skip
    """Create the study, or load it to resume: then its metric and direction must be the search space's."""
    try:
        study = optuna.create_study(storage=storage, sampler=sampler, pruner=pruner, study_name=name,
                                    direction=search["direction"], load_if_exists=True)  # fmt: skip
    except (ValueError, ImportError, sqlalchemy.exc.SQLAlchemyError) as error:
        reason = str(error).splitlines()[0]  # a missing driver, a bad url, an unreachable database
        raise UserError(f"--storage {redact(storage)}: {reason}") from None
    metric = study.user_attrs.get("metric")
    if metric is None:
        study.set_user_attr("metric", search["metric"])
    # Optuna loads an existing study with its own direction, whatever this call asked for
    if (metric or search["metric"], study.direction.name.lower()) != (search["metric"], search["direction"]):
        raise UserError(
            f"study {name} was started to {study.direction.name.lower()} {metric}, but the search space says "
            f"{search['direction']} {search['metric']}: pick another --study_name"
        )
    return study


def main(args: list[str] | None = None) -> optuna.Study | None:
    options, overrides = parse_args(list(sys.argv[1:] if args is None else args))
    checked = ConfigOnlyCLI(args=overrides)  # checks the overrides before any trial
    checked.check_data()  # and the data: a missing split is one line here, for both backends
    config = checked.config
    options.search = options.search or default_search(config)
    search = load_search(options.search)
    unknown = [key for key in search["params"] if not has_key(config, key)]
    if unknown:
        raise UserError(f"search space {options.search}: {unknown[0]!r} is not a config key (see project.train --help)")
    logger = getattr(config.trainer.logger, "init_args", None)
    save_dir = Path(getattr(logger, "save_dir", None) or "logs")
    name = options.study_name or f"{getattr(logger, 'name', None) or 'study'}-tune"
    folder = save_dir / name
    if options.backend == "ray":  # project/tune_ray.py: the same search space, trial folders and best.yaml
        from project.tune_ray import run

        started, best = time.perf_counter(), run(options, overrides, config, search, folder)
        minutes = (time.perf_counter() - started) / 60
        none = f"no trial reported {search['metric']} in {minutes:.1f} min, so there is no best configuration"
        print(f"best config: {best}\ntrain it:    python -m project.train --config {best}" if best else none)
        return None
    folder.mkdir(parents=True, exist_ok=True)
    storage = options.storage or f"sqlite:///{folder / 'study.db'}"
    sampler, pruner = optuna.samplers.TPESampler(), make_pruner(search.get("pruner"))
    study = open_study(storage, name, search, sampler, pruner)
    print(f"study {name} in {redact(storage)}", file=sys.stderr)
    started = time.perf_counter()
    try:
        optimize(study, options.n_trials, overrides, config, search, folder)
    except SIGTERMException:
        print(f"stopped by SIGTERM: run the same command again to resume study {name}", file=sys.stderr)
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
