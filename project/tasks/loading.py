"""`load_from_checkpoint` of a stranger's checkpoint (`Classifier`'s, and the task data modules'): Lightning's, with
its holes closed.

- The file is read once, weights only (`load_checkpoint_file`): Lightning would download an http(s) checkpoint again
  itself and unpickle it with `weights_only=False`, and reads a file object unchecked. The checked copy is the one
  Lightning loads, weights only.
- Every argument Lightning builds the model from is checked before anything is imported (factories.py's
  `check_classes`): `hyper_parameters`, and the keys older Lightning wrote (`hparams`, `module_arguments`), which it
  still reads.
- The checkpoint holds every weight: a part's published weights (a download) or weights file (a file the stranger
  names) is not followed, and the model's `compile` (a compiler, a process) is the caller's to ask for.
- A model its settings cannot build (a wrong type, a negative width, a backbone that takes other arguments) is one
  line naming the checkpoint, not jsonargparse's or torch's traceback.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from project.callbacks.checkpoint_io import load_checkpoint_file, local_checkpoint
from project.data.private import private_folder
from project.errors import UserError
from project.redact import redact
from project.run_folder import RUN_SWITCHES
from project.shown import shown
from project.tasks.factories import check_classes

LEGACY_KEYS = ("hparams", "module_arguments")  # what Lightning's `_load_state` merges before a class's own key
OPTION = "checkpoint"


class CheckedLoading:
    """A LightningModule's or LightningDataModule's `load_from_checkpoint`, once the checkpoint (a stranger's,
    perhaps) is read weights only and seen to name only the project's task classes at any depth (factories.py): an
    encoder or backbone is rebuilt from the class_path it records, without the published weights or file it names.
    Put it before Lightning's class among the bases."""

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: Any, *args: Any, **kwargs: Any) -> Any:
        return load_checked(cls, super().load_from_checkpoint, checkpoint_path, args, kwargs)


def load_checked(cls: type, load: Callable[..., Any], checkpoint_path: Any, args: tuple, kwargs: dict) -> Any:
    """`load(path, *args, **kwargs)` (Lightning's `load_from_checkpoint` of `cls`) once the checkpoint at
    `checkpoint_path` (a path, a URL or a binary file object) is seen to be safe to rebuild `cls` from."""
    where = f"the {OPTION} {redact(str(checkpoint_path))}" if is_path(checkpoint_path) else f"the {OPTION} stream"
    with local_file(checkpoint_path) as local:
        arguments = model_arguments(load_checkpoint_file(local, OPTION), cls, where)
        check_classes(arguments, where, cls)
        kwargs = {**trusted_arguments(arguments, cls), **kwargs}
        if len(args) < list(inspect.signature(load).parameters).index("weights_only") - 1:  # not given by place
            kwargs.setdefault("weights_only", True)
        try:
            return load(local, *args, **kwargs)
        except UserError:
            raise
        except Exception as error:  # noqa: BLE001 - a stranger's settings may fail any way a class's __init__ can
            raise UserError(f"{where}: its model cannot be rebuilt from its hyperparameters: {reason(error)}") from None


def is_path(checkpoint_path: Any) -> bool:
    return isinstance(checkpoint_path, str | os.PathLike)


@contextlib.contextmanager
def local_file(checkpoint_path: Any) -> Iterator[Path]:
    """The checkpoint as a local file: a path itself, a URL's copy downloaded once (checkpoint_io.py), or a file
    object's bytes in a file of this user's alone, removed after."""
    if is_path(checkpoint_path):
        yield local_checkpoint(checkpoint_path, OPTION)
        return
    descriptor, name = tempfile.mkstemp(suffix=".ckpt", dir=private_folder("checkpoint-streams"))
    try:
        with os.fdopen(descriptor, "wb") as stream:
            shutil.copyfileobj(checkpoint_path, stream)
        yield Path(name)
    finally:
        Path(name).unlink(missing_ok=True)


def model_arguments(checkpoint: dict, cls: type, where: str) -> dict:
    """The arguments Lightning builds `cls` from (lightning.pytorch.core.saving._load_state): the legacy keys, then
    the class's own (`hyper_parameters` of a model, `datamodule_hyper_parameters` of a data module), merged; all of
    them as one argument when `hparams_name` names one of `cls`'s."""
    arguments: dict = {}
    for key in (*LEGACY_KEYS, cls.CHECKPOINT_HYPER_PARAMS_KEY):
        if (value := checkpoint.get(key)) is None:
            continue
        try:
            arguments.update(value)  # as Lightning merges them: a list of pairs too
        except (TypeError, ValueError):
            raise UserError(f"{where}: its {key} is no mapping of the model's arguments") from None
    if not isinstance(checkpoint.get("hparams_type"), str | None):  # Lightning would call it on the arguments
        raise UserError(f"{where}: its hparams_type is no name of a type")
    name = checkpoint.get("hparams_name")
    if isinstance(name, str) and name in inspect.signature(cls.__init__).parameters:
        arguments = {name: arguments}
    return arguments


def trusted_arguments(arguments: dict, cls: type) -> dict:
    """What replaces the checkpoint's own arguments: each part's `weights` None (the checkpoint holds them all) and
    the run switches (`compile`) off. The caller's own keyword arguments win over these."""
    parameters = inspect.signature(cls.__init__).parameters
    replaced = {key: False for key in RUN_SWITCHES if arguments.get(key) and key in parameters}
    for key, value in arguments.items():
        if isinstance(value, dict) and key in parameters and (unweighted := without_weights(value)) != value:
            replaced[key] = unweighted
    return replaced


def without_weights(part: dict) -> dict:
    """A copy of a part's `{class_path, init_args}` with every `weights` in it, nested parts' too, None."""
    part = copy.deepcopy(part)
    stack = [part]
    while stack:
        init_args = stack.pop().get("init_args")
        if not isinstance(init_args, dict):
            continue
        if init_args.get("weights") is not None:
            init_args["weights"] = None
        stack += [value for value in init_args.values() if isinstance(value, dict)]
    return part


def reason(error: BaseException) -> str:
    """The first line of what raised first (the innermost cause: a class's __init__ under jsonargparse's wrapping),
    as a stranger's text is shown."""
    seen = [error]
    while (inner := seen[-1].__cause__ or seen[-1].__context__) is not None and inner not in seen and len(seen) < 20:
        seen.append(inner)
    lines = [line.strip() for line in str(seen[-1]).splitlines() if line.strip()]
    return shown((lines[0] if lines else type(seen[-1]).__name__)[:300])
