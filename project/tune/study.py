"""The Optuna backend of `project.tune`: a TPE study whose trials are project.train runs, pruned by
optuna-integration's callback, kept in a storage that resumes with --resume true (SQLite by default, or a
shared RDB), with a table of the trials and the best trial's configuration as best.yaml."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy.exc
import torch
import yaml
from optuna.trial import TrialState
from optuna_integration import PyTorchLightningPruningCallback
from rich.table import Table

from project.callbacks.save_config import redacted_config
from project.cli import ProjectCLI
from project.errors import UserError
from project.redact import redact
from project.tune.space import as_flags, best_config, short, trial_flags, versioned_logger

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


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


def optimize(
    study: optuna.Study, n_trials: int, *, search: dict, overrides: list[str], config: Any, folder: Path
) -> None:
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


def existing_study(name: str, where: str) -> str:
    """The one line for a study that exists and was not asked to be resumed, for both backends."""
    return (
        f"study {name} exists at {where}; pass --resume true to continue it (resuming trusts the folder like "
        "code) or choose another --study_name"
    )


def open_study(
    storage: str,
    name: str,
    search: dict,
    sampler: optuna.samplers.BaseSampler,
    pruner: optuna.pruners.BasePruner,
    *,
    resume: bool = False,
) -> optuna.Study:
    """Create the study, or with `resume` load it where it exists: then its metric and direction must be the
    search space's. Without `resume` a study of that name in the storage is refused in one line (Optuna's
    rows are JSON, not pickles, but its best trial's stored configuration would become best.yaml)."""
    try:
        study = optuna.create_study(
            storage=storage,
            sampler=sampler,
            pruner=pruner,
            study_name=name,
            direction=search["direction"],
            load_if_exists=resume,
        )
    except optuna.exceptions.DuplicatedStudyError:
        raise UserError(existing_study(name, redact(storage))) from None
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
