"""A run folder (a checkpoint and the config.yaml beside its checkpoints/ folder), read as data.

`evaluate`, `predict` and `export` rebuild a checkpoint's model from its run's config.yaml. A run folder is
often someone else's (a colleague's, a download), so that file is a stranger's, unlike a `--config` file the
user names, which is trusted like code. From it we take only what defines the model and what its samples
become:

- the `model` and `data` sections, nothing else (no trainer, callbacks, logger, optimizer or ckpt_path);
- classes that are the project's own tasks (`project.tasks.*`) or that the user's own configuration names;
  any other `class_path`, at any depth, is one line, and nothing is imported for it; a setting whose type
  admits a class (`data.augment`) is given only as a `class_path` mapping or one of its type's Literal
  strings, since jsonargparse reads any other string there as a class to import (a class path, YAML naming
  one, or a file holding it);
- of `data`, only the task's own settings: never where data is (`root`, `train`, `val`, `test`, `predict`:
  those come from the user's configs and flags), where to write (`cache_dir`), or the core's resources and
  bounds (workers, buffers, `max_member_bytes`, ...) and a task's (`max_image_pixels`), which stay the user's;
- no string that is a `pipe:` command, anywhere.

Only a config.yaml in the run folder that holds the checkpoint (`<run>/checkpoints/<name>.ckpt` beside
`<run>/config.yaml`, neither through a link) counts, and only when the checkpoint records that file's
SHA-256 (`RUN_CONFIG_KEY`, written by `save_config.AtomicSaveConfigCallback`): a config.yaml of another run
left in the same folder (`--trainer.logger false` writes into the working folder) is not read.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import inspect
import os
import stat
import sys
import tempfile
from collections.abc import Container, Iterator
from pathlib import Path
from typing import Any

import yaml

from project.class_strings import setting_kinds
from project.data.private import private_folder
from project.errors import UserError
from project.redact import redact
from project.shown import abbreviated

RUN_CONFIG_KEY = "run_config_sha256"  # what a checkpoint records of its run's config.yaml
MAX_CONFIG_BYTES = 1 << 20  # a run's config.yaml is a few KB
MAX_NODES = 100_000  # values walked in it: YAML aliases can make a small file a large tree
MAX_CHARACTERS = 4 * MAX_CONFIG_BYTES  # characters of its strings and keys walked: aliases repeat one string
SPECS = ("root", "train", "val", "test", "predict")  # where the data is: the user's to say
TASKS = "project.tasks."  # the project's own task classes, which a run folder may name
TASK_BOUNDS = frozenset({"max_image_pixels"})  # a task's own bound on what it decodes: the user's, as the core's
RUN_SWITCHES = frozenset({"compile"})  # torch.compile starts a compiler: a process is the user's to start


def config_beside(ckpt_path: str | Path) -> Path | None:
    """The config.yaml of the run folder holding `ckpt_path` (`<run>/checkpoints/x.ckpt`), if it is a regular
    file there and neither it nor the checkpoint's folders are links (a link would make another folder's file
    this run's)."""
    checkpoint = Path(ckpt_path).absolute()
    folder = checkpoint.parent
    if folder.name != "checkpoints" or folder.is_symlink() or checkpoint.is_symlink():
        return None
    config = folder.parent / "config.yaml"
    try:
        mode = config.lstat().st_mode
    except OSError:
        return None
    return config if stat.S_ISREG(mode) else None


def recorded_config_hash(checkpoint: Any) -> str | None:
    value = checkpoint.get(RUN_CONFIG_KEY) if isinstance(checkpoint, dict) else None
    return value if isinstance(value, str) else None


def run_document(ckpt_path: str | Path, recorded: str | None) -> tuple[Path, dict] | None:
    """The checkpoint's run config as plain YAML, unchecked, and its path; or None (said on stderr when a
    config.yaml is there but not this checkpoint's) when there is none to read: the user's own configs and
    flags then build the model.

    Args:
        ckpt_path: the local checkpoint.
        recorded: the config hash the checkpoint records (None: it records none).
    """
    path = config_beside(ckpt_path)
    if path is None:
        return None
    raw = read_bounded(path)
    if recorded is None or hashlib.sha256(raw).hexdigest() != recorded:
        why = "records no run config" if recorded is None else "was saved with another config.yaml"
        print(
            f"{path} is not read: the checkpoint {why}; its model is built from your configs and flags "
            "(give the run's config with --config FILE if you trust it)",
            file=sys.stderr,
        )
        return None
    try:
        document = yaml.safe_load(raw)  # plain YAML: no tags that build Python objects
    except (yaml.YAMLError, RecursionError, ValueError) as error:  # ValueError: an integer past 4,300 digits
        raise UserError(f"{path}: not a readable run config ({type(error).__name__})") from None
    if not isinstance(document, dict):
        raise UserError(f"{path}: not a run config: a mapping with model and data sections is expected")
    return path, document


@contextlib.contextmanager
def config_file(config: dict) -> Iterator[Path]:
    """`config` as a YAML file of this user's alone (removed after), for jsonargparse's `--config`: given a string
    (or `--model CLASS`), jsonargparse first reads a file of that name in the working folder, which may be the
    stranger's run folder, with a file of that name planted."""
    descriptor, name = tempfile.mkstemp(suffix=".yaml", dir=private_folder("run-configs"))
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as stream:
            stream.write(yaml.safe_dump(config))
        yield Path(name)
    finally:
        Path(name).unlink(missing_ok=True)


def run_config(path: Path, document: dict, named: Container[str]) -> dict:
    """The parts of a run config that rebuild its model (see the module's docstring), checked.

    Args:
        path: the config.yaml, for messages.
        document: its plain YAML (`run_document`).
        named: the class paths the user's own configuration names (`classes_named`), asked only about a class
            that is not one of the project's tasks.
    """
    kept = rebuilt_sections(document, path)
    check_values(kept, path, named)
    return kept


def read_bounded(path: Path) -> bytes:
    with open(path, "rb") as stream:
        raw = stream.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise UserError(f"{path}: over {MAX_CONFIG_BYTES:,} bytes, more than a run config holds")
    return raw


def core_settings() -> frozenset[str]:
    """The settings of the streaming core (every data module's): where data is, how it is read, its bounds."""
    from project.data.datamodule import ShardDataModule

    return frozenset(inspect.signature(ShardDataModule.__init__).parameters) - {"self"}


def rebuilt_sections(document: dict, path: Path) -> dict:
    """`model` and `data`, each a class_path and init_args; of data's init_args, the task's own settings."""
    kept = {}
    for section in ("model", "data"):
        part = document.get(section)
        if part is None:
            continue
        if not isinstance(part, dict) or not isinstance(part.get("class_path"), str):
            raise UserError(f"{path}: its {section} section is not a class_path with init_args")
        init_args = part.get("init_args") or {}
        if not isinstance(init_args, dict):
            raise UserError(f"{path}: {section}.init_args is not a mapping")
        dropped = core_settings() | TASK_BOUNDS if section == "data" else RUN_SWITCHES
        init_args = {key: value for key, value in init_args.items() if key not in dropped}
        kept[section] = {"class_path": part["class_path"], "init_args": init_args}
    return kept


def check_values(kept: dict, path: Path, named: Container[str]) -> None:
    """Every class_path a project task or one the user names, and a setting whose type admits a class given
    only as one; no `pipe:` command; a bounded tree (values, and characters: aliases repeat a long string).
    Each value's place is a link to its parent's, spelled out only for a message."""
    nodes, characters = MAX_NODES, MAX_CHARACTERS
    # (place, value, what it may be: None anything, a set the only strings, a function a class's init_args)
    stack: list[tuple[tuple, Any, Any]] = [((None, ".", key), value, None) for key, value in kept.items()]
    while stack:
        at, value, kind = stack.pop()
        nodes -= 1
        if isinstance(value, str | dict):
            characters -= len(value) if isinstance(value, str) else sum(len(k) for k in value if isinstance(k, str))
        if nodes < 0 or characters < 0:
            size = f"{MAX_NODES:,} values" if nodes < 0 else f"{MAX_CHARACTERS:,} characters"
            raise UserError(f"{path}: more than {size}, more than a run config holds")
        if isinstance(value, dict):
            stack.extend(dict_items(path, at, value, kind, named))
        elif isinstance(value, list):
            stack.extend(((at, "[]", i), item, kind) for i, item in enumerate(value))
        elif isinstance(value, str) and value.lstrip().startswith("pipe:"):
            raise UserError(
                f"{path}: {where(at)} is a pipe: command ({redact(value)[:200]!r}): a run folder runs nothing"
            )
        elif isinstance(value, str) and isinstance(kind, frozenset) and value not in kind:
            raise UserError(class_string(path, where(at), value))


OLD_FORMS = ("model.init_args.backbone", "model.init_args.encoder")  # strings before they were classes


def class_string(path: Path, place: str, value: str) -> str:
    """The line for a string where a run folder's config may give only a class (older runs: `backbone: small_cnn`)."""
    if place in OLD_FORMS:
        return (
            f"{path}: {place} is {shown(value)!r}, as runs from before backbones and encoders were classes wrote it, "
            "which this version does not read: copy the checkpoint out of its run folder and name the model as "
            "configs/ do now (its weights load), or train again"
        )
    return (
        f"{path}: {place} names a class by a string ({shown(value)!r}), which a run folder's config may not import: "
        "give it as a class_path of one of the project's tasks (or give the run's config with --config FILE if "
        "you trust it)"
    )


def dict_items(path: Path, at: tuple, value: dict, kind: Any, named: Container[str]) -> list[tuple[tuple, Any, Any]]:
    """A mapping's items for `check_values`, each with what it may be, once its class_path is allowed."""
    class_path = value.get("class_path")
    if class_path is not None and not allowed_class(class_path, named):
        raise UserError(
            f"{path}: {where(at)}.class_path {shown(class_path)!r} is neither one of the project's tasks "
            "nor a class your configs name: a run folder's config may not import it (give the run's config "
            "with --config FILE if you trust it)"
        )
    return [
        ((at, ".", key), item, inner) for key, item, inner in setting_kinds(value, kind, class_path, ("class_path",))
    ]


def where(at: tuple | None) -> str:
    """A value's place (`model.init_args.x[0]`) from its link to its parent's, each key cut to 100 characters."""
    parts = []
    while at is not None:
        at, kind, key = at
        parts.append(f".{str(key)[:100]}" if kind == "." else f"[{key}]")
    return "".join(reversed(parts))[1:]


def shown(value: Any) -> str:
    """A stranger's value for a message: a string as given, anything else two levels deep; 200 characters."""
    return value[:200] if isinstance(value, str) else abbreviated(value, 200, levels=2)


def allowed_class(class_path: Any, named: Container[str]) -> bool:
    """One of the project's task classes (checked before anything is imported: only `project.tasks.*`
    modules are), or a class path the user's own configuration names."""
    return isinstance(class_path, str) and (task_class(class_path) or class_path in named)


def task_class(class_path: str) -> bool:
    module, _, name = class_path.rpartition(".")
    if not (module + ".").startswith(TASKS) or not name.isidentifier():
        return False
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return False
    return isinstance(found, type) and found.__module__.startswith(TASKS)


def classes_named(config: Any) -> set[str]:
    """Every class_path in the user's own configuration (their --model, --data, callbacks, logger)."""
    named, stack = set(), [config]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            if isinstance(value.get("class_path"), str):
                named.add(value["class_path"])
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return named


def check_data_given(document: dict, user: dict, defaults: dict, purpose: str) -> None:
    """When the run read its data from elsewhere than the user's configuration says, and the user's own
    configs and flags name none (theirs are the defaults'), one line: a run folder's data is never read, so
    say which flag gives it."""
    run, given = specs_of(document), specs_of(user)
    if not any(run.values()) or run == given or given != specs_of(defaults):
        return
    named = ", ".join(f"data.{key}={redact(shown(value))[:200]!r}" for key, value in run.items() if value)
    raise UserError(
        f"{purpose}: the checkpoint's run read its data from {named}, and data named in a run folder is never "
        "read (it may be a stranger's): give yours with --data.root DIR (or --data.test, --data.val, --data.predict)"
    )


def specs_of(config: dict) -> dict[str, Any]:
    data = config.get("data") if isinstance(config, dict) else None
    init_args = data.get("init_args") if isinstance(data, dict) else None
    init_args = init_args if isinstance(init_args, dict) else {}
    return {key: init_args.get(key) for key in SPECS}
