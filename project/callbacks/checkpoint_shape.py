"""A checkpoint's structure, checked before Lightning reads it: a weights-only file that is no Lightning
checkpoint, or a damaged or hostile one, is one line naming what is wrong, where Lightning would stop with a
KeyError, TypeError or AttributeError traceback from deep in its restore.

`checked_contents` runs on every path that loads a checkpoint (`load_checkpoint_file`: train, evaluate, predict,
export, active, tune): a dict; `state_dict` a dict of names to tensors; `hyper_parameters` a dict;
`pytorch-lightning_version` a version, from which Lightning's own migration (which upgrades checkpoints of
Lightning 0.10 onwards, run once here and a no-op when Lightning runs it again) succeeds. Newer versions load
as Lightning loads them, with its warning. What the trainer's stage restores besides is checkpoint_stage.py's.

`check_state_names` is the model's half (`Classifier.on_load_checkpoint`): a tensor the model needs that the
checkpoint lacks, or one it has that the model does not, is one line naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from lightning.pytorch.utilities.migration import migrate_checkpoint
from packaging.version import InvalidVersion, Version

from project.errors import UserError
from project.shown import abbreviated

VERSION_KEY = "pytorch-lightning_version"


def checked_contents(checkpoint: Any, shown: str) -> dict:
    """`checkpoint` migrated to this Lightning's layout, or a `UserError` "{shown}: not a Lightning checkpoint:
    ..." naming what is wrong."""
    problem = contents_problem(checkpoint)
    if problem is None:
        version = checkpoint[VERSION_KEY]
        try:
            migrate_checkpoint(checkpoint)
        except (KeyError, TypeError, AttributeError, ValueError, IndexError) as error:
            problem = f"Lightning's upgrade from the version it names ({version}) fails ({kind(error)}: {error})"
    if problem is not None:
        raise UserError(f"{shown}: not a Lightning checkpoint: {problem}")
    return checkpoint


def contents_problem(checkpoint: Any) -> str | None:
    """What makes `checkpoint` no Lightning checkpoint any command can read, or None."""
    if not isinstance(checkpoint, dict):
        return f"it holds {a(checkpoint)}, not a dict"
    state = checkpoint.get("state_dict")
    if not isinstance(state, dict):
        return "it has no state_dict (the model's weights)" if state is None else f"its state_dict is {a(state)}"
    for name, value in state.items():
        if not isinstance(name, str):
            return f"its state_dict has a key that is no name: {quoted(name)}"
        if not isinstance(value, torch.Tensor) and not name.endswith("_extra_state"):  # a module's own extra state
            return f"its state_dict's {quoted(name)} is {a(value)}, not a tensor"
        if isinstance(value, torch.Tensor) and not plain(value):  # torch's copy into a parameter, or isnan, fails
            kind = "meta" if value.is_meta else "quantized" if value.is_quantized else str(value.layout)
            return f"its state_dict's {quoted(name)} is a {kind} tensor, not one of plain values"
    hyperparameters = checkpoint.get("hyper_parameters", {})  # a task reads it with .get(key)
    if not isinstance(hyperparameters, dict):
        return f"its hyper_parameters are {a(hyperparameters)}, not a dict"
    version = checkpoint.get(VERSION_KEY)
    if version is None:
        return f"it names no Lightning version ({VERSION_KEY}): a file of weights alone is no checkpoint"
    try:
        Version(version)
    except (InvalidVersion, TypeError):
        return f"its {VERSION_KEY} {quoted(version)} is no version"
    return None


def check_state_names(state: Mapping[str, Any], own: Mapping[str, Any]) -> None:
    """A `UserError` naming the first tensor the model has that `state` lacks, or the first `state` has that
    the model does not: torch's load_state_dict would stop with a traceback listing them all."""
    missing = [name for name in own if name not in state]
    unexpected = [name for name in state if name not in own]
    for names, what in ((missing, "has no {}, which this model needs"), (unexpected, "has {}, which this model lacks")):
        if names:
            more = f" (and {len(names) - 1:,} more)" if len(names) > 1 else ""
            raise UserError(
                f"the checkpoint {what.format(quoted(names[0]))}{more}: it was saved from another model or "
                "other settings, or the file is damaged"
            )


def mismatch(template: Any, value: Any, where: str, need_dict: bool = False, counts: bool = False) -> str | None:
    """Where `value` is of another kind than this Lightning's own `template` (a fresh object's state): a key
    both hold, of another kind (dict, list, number, true/false, text, tensor), or an item of a list whose
    template's items are all of one kind; keys only one holds pass. With `counts` (a loop's progress), a number
    where the template holds an integer must be a count too: a NaN epoch resumes a fit that never ends."""
    expected = "a dict" if need_dict else kind_of(template)
    if expected is None:
        return None
    if kind_of(value) != expected:
        return f"its {where} is {a(value)}, where Lightning keeps {expected}"
    if counts and expected == "a number" and isinstance(template, int) and not is_count(value):
        return f"its {where} is {quoted(value)}, not a count"
    if isinstance(template, dict):
        for key, part in template.items():
            if key in value and (problem := mismatch(part, value[key], f"{where}.{key}", counts=counts)):
                return problem
    kinds = {kind_of(item) for item in template} if isinstance(template, list | tuple) else set()
    if len(kinds) == 1 and None not in kinds:  # a scheduler's base_lrs: numbers, which its step multiplies
        (expected,) = kinds
        for number, item in enumerate(value):
            if kind_of(item) != expected:
                return f"its {where}[{number}] is {a(item)}, where Lightning keeps {expected}"
    return None


def kind_of(value: Any) -> str | None:
    if isinstance(value, bool):
        return "true or false"
    kinds = ((dict, "a dict"), (list | tuple, "a list"), (int | float, "a number"), (str, "text"))
    kinds += ((torch.Tensor, "a tensor"),)
    return next((name for types, name in kinds if isinstance(value, types)), None)


def plain(tensor: torch.Tensor) -> bool:
    """Whether `tensor` holds its values as a plain one does: strided, not sparse, quantized or meta (no values)."""
    return tensor.layout == torch.strided and not tensor.is_quantized and not tensor.is_meta


def is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 63  # what torch's int64 holds


def a(value: Any) -> str:
    """ "a list", "an int", "None": what a stranger's value is, in words."""
    name = type(value).__name__
    return "None" if value is None else f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def kind(error: BaseException) -> str:
    return type(error).__name__


def quoted(value: Any) -> str:
    """A stranger's value, shown in at most 60 characters (`project.shown.abbreviated`)."""
    return abbreviated(value)
