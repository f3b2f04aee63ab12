"""What both backends of `project.tune` share: the search space file, a trial's flags and run folder, and
best.yaml."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from project.cli import CONFIG_DIR
from project.data.atomic import write_text_atomically
from project.errors import UserError
from project.redact import redact_value

DEFAULT_SEARCH = CONFIG_DIR / "tune" / "default.yaml"


def default_search(config: Any) -> Path:
    """configs/tune/<task>.yaml for a model class of project.tasks.<task>, when it exists; else default.yaml."""
    parts = str(getattr(config.model, "class_path", "")).split(".")
    own = CONFIG_DIR / "tune" / f"{parts[2]}.yaml" if parts[:2] == ["project", "tasks"] and len(parts) > 3 else None
    return own if own is not None and own.is_file() else DEFAULT_SEARCH


def load_search(path: Path) -> dict[str, Any]:
    """The search space file: metric, direction, pruner and params (checked here, before any trial)."""
    if not path.is_file():
        raise UserError(f"search space not found: {path}")
    try:
        search = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise UserError(f"{path} is not valid YAML: {str(error).splitlines()[0]}") from None
    if not isinstance(search, dict):
        raise UserError(f"{path}: expected a mapping with params (and metric, direction, pruner)")
    search.setdefault("metric", "val/acc")
    search.setdefault("direction", "maximize")
    if search["direction"] not in ("maximize", "minimize"):
        raise UserError(f"{path}: direction must be maximize or minimize, got {search['direction']!r}")
    params = search.get("params")
    if not isinstance(params, dict) or not params:
        raise UserError(f"{path}: expected a 'params' mapping of config keys to distributions")
    for key, spec in params.items():
        kind = spec.get("type") if isinstance(spec, dict) else None
        needed = {"float": ("low", "high"), "int": ("low", "high"), "categorical": ("choices",)}.get(kind)
        if needed is None or any(name not in spec for name in needed):
            raise UserError(f"{path}: {key} needs type float or int (with low, high) or categorical (with choices)")
    return search


def as_flags(values: dict[str, Any]) -> list[str]:
    """`--key=value` flags; non-strings as JSON, which the config parser reads as YAML."""
    return [f"--{key}={value if isinstance(value, str) else json.dumps(value)}" for key, value in values.items()]


def has_key(config: Any, key: str) -> bool:
    """Whether `key` names a setting: `model.lr` is the chosen model class's `model.init_args.lr`."""
    section, _, rest = key.partition(".")
    return key in config or (bool(rest) and f"{section}.init_args.{rest}" in config)


def versioned_logger(config: Any) -> bool:
    """Whether the configured logger takes a name and a version (TensorBoard's, CSV's)."""
    logger = config.trainer.logger
    return getattr(logger, "init_args", None) is not None and "version" in logger.init_args


def trial_flags(overrides: list[str], versioned: bool, study_folder: Path, number: int) -> list[str]:
    """The trial's own run folder: logs/<study>/trial_N (checkpoints inside it too, without a logger);
    `versioned`: whether the logger takes a name and version (`versioned_logger`)."""
    flags = [*overrides, f"--trainer.default_root_dir={study_folder / f'trial_{number}'}"]
    if versioned:
        logger_args = "--trainer.logger.init_args"
        flags += [f"{logger_args}.name={study_folder.name}", f"{logger_args}.version=trial_{number}"]
    return flags


def short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def best_config(config: dict, path: Path, title: str) -> Path:
    """Write a trial's configuration as best.yaml, to train in a new version folder (either backend)."""
    logger = (config.get("trainer") or {}).get("logger")
    if isinstance(logger, dict) and isinstance(logger.get("init_args"), dict):
        logger["init_args"]["version"] = None  # a fresh version_N, not the trial's folder
    config["trainer"]["default_root_dir"] = None
    header = f"# {title}\n# the whole configuration it ran with; train it: python -m project.train --config {path}\n"
    write_text_atomically(path, header + yaml.safe_dump(redact_value(config), sort_keys=False))
    return path
